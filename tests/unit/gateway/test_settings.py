"""Worker URL fragments for sidecar mode."""

from __future__ import annotations

import pytest

from gateway.errors import ConfigError
from gateway.settings import parse_worker


def test_worker_url_can_name_a_foreign_engines_zmq_events() -> None:
    spec = parse_worker("http://10.0.0.5:8000#id=v0&events=tcp://10.0.0.5:5557&engine=sglang&model=llama")
    assert (spec.id, spec.events, spec.engine, spec.model) == ("v0", "tcp://10.0.0.5:5557", "sglang", "llama")
    assert parse_worker("http://h:1#events=tcp://h:2").model is None  # the engine's served model is used
    with pytest.raises(ConfigError, match="engine must be"):
        parse_worker("http://h:1#events=tcp://h:2&model=m&engine=trt")
    with pytest.raises(ConfigError, match="tcp:// or ipc://"):
        parse_worker("http://h:1#events=h:2")


@pytest.mark.parametrize(
    "engine", ["auto", "kvgate", "vllm", "sglang", "trtllm", "tgi", "lmdeploy", "mii", "openai"]
)
def test_worker_url_names_any_known_engine(engine: str) -> None:
    assert parse_worker(f"http://h:1#engine={engine}").engine == engine
    assert parse_worker("http://h:1").engine == "auto"


def test_worker_url_carries_what_the_operator_knows_of_the_engines_cache() -> None:
    spec = parse_worker("http://h:1#engine=lmdeploy&prefix_cache=on&kv_tokens=65536")
    assert (spec.prefix_cache, spec.kv_tokens) == (True, 65536)
    assert parse_worker("http://h:1#prefix_cache=off").prefix_cache is False
    for bad in ("kv_tokens=0", "kv_tokens=x", "prefix_cache=maybe"):
        with pytest.raises(ConfigError):
            parse_worker(f"http://h:1#{bad}")


@pytest.mark.parametrize("wid", ["has space", "new%0Aline", "é", "x" * 129])
def test_a_worker_id_that_cannot_travel_in_a_header_is_refused(wid: str) -> None:
    with pytest.raises(ConfigError, match="printable ASCII"):
        parse_worker(f"http://127.0.0.1:9001#id={wid}")
