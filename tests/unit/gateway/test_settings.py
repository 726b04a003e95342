"""Worker URL fragments for sidecar mode."""

from __future__ import annotations

import pytest

from gateway.errors import ConfigError
from gateway.settings import parse_worker


def test_worker_url_can_name_a_foreign_engines_zmq_events() -> None:
    spec = parse_worker("http://10.0.0.5:8000#id=v0&events=tcp://10.0.0.5:5557&engine=sglang&model=llama")
    assert (spec.id, spec.events, spec.engine, spec.model) == ("v0", "tcp://10.0.0.5:5557", "sglang", "llama")
    with pytest.raises(ConfigError, match="model=NAME"):
        parse_worker("http://h:1#events=tcp://h:2")
    with pytest.raises(ConfigError, match="engine must be"):
        parse_worker("http://h:1#events=tcp://h:2&model=m&engine=trt")


@pytest.mark.parametrize("wid", ["has space", "new%0Aline", "é", "x" * 129])
def test_a_worker_id_that_cannot_travel_in_a_header_is_refused(wid: str) -> None:
    with pytest.raises(ConfigError, match="printable ASCII"):
        parse_worker(f"http://127.0.0.1:9001#id={wid}")
