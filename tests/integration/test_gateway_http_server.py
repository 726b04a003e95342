"""``kvgate gateway --http-server kvgate`` (the lean server) in front of sim workers, with the ``openai``
client: streaming and not, control routes, a client leaving mid-stream, SIGTERM draining a stream.

The other gateway integration modules run against it too with ``KVGATE_HTTP_SERVER=kvgate`` in the
environment (the flag's layered default).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.gateway_fleet import Fleet, gateway_fleet
from tests.support.sigterm_stream import stream_across_sigterm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "kvgate-sim"
GATEWAY_ARGS = ("--http-server", "kvgate", "--health-interval-s", "0.5", "--policy", "round_robin")
WORKER_ARGS = ("--prefill-tps", "1000000", "--decode-tps", "2000")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with gateway_fleet(
        tmp_path_factory.mktemp("gw"), worker_args=WORKER_ARGS, gateway_args=GATEWAY_ARGS
    ) as f:
        yield f


def _client(fleet: Fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0, timeout=30)


def test_openai_client_whole_and_streamed_answers_agree(fleet: Fleet) -> None:
    client = _client(fleet)
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "Say hi."}]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=8, seed=2
    )
    whole = raw.parse()
    assert raw.headers["x-kvgate-worker"] in fleet.workers
    assert whole.usage is not None and whole.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=8,
        seed=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_legacy_completions_models_and_control_routes(fleet: Fleet) -> None:
    client = _client(fleet)
    done = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=5)
    assert done.choices[0].text
    assert [m.id for m in client.models.list()] == [MODEL]
    with httpx.Client(base_url=fleet.gateway, timeout=10) as http:
        for path in ("/health", "/ready", "/metrics", "/admin/workers"):
            assert http.get(path).status_code == 200, path
        assert http.head("/health").status_code in (200, 405)
        assert http.post("/v1/chat/completions", content=b"{not json").status_code == 400


def test_many_keep_alive_requests_on_one_connection(fleet: Fleet) -> None:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    with httpx.Client(base_url=fleet.gateway, timeout=10) as http:
        for _ in range(20):
            assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_a_client_leaving_mid_stream_leaves_the_gateway_serving(fleet: Fleet) -> None:
    port = int(fleet.gateway.rsplit(":", 1)[1])
    payload = b'{"model":"kvgate-sim","stream":true,"max_tokens":200,"ignore_eos":true,"messages":[{"role":"user","content":"go"}]}'
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(payload), payload))  # fmt: skip
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    time.sleep(0.2)
    assert (
        _client(fleet)
        .chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "still there?"}], max_tokens=3
        )
        .choices[0]
        .message.content
    )


def test_sigterm_lets_an_in_flight_stream_finish(tmp_path: Path) -> None:
    body = {"model": MODEL, "max_tokens": 30, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "tell me a long story"}]}  # fmt: skip
    with gateway_fleet(
        tmp_path, num_workers=1, worker_args=["--decode-tps", "20"], gateway_args=GATEWAY_ARGS
    ) as fleet:
        proc = fleet.gateway_proc
        assert proc is not None
        text = stream_across_sigterm(fleet.gateway + "/v1/chat/completions", body, proc)
        assert proc.wait(30) == 0
    assert text.rstrip().endswith(b"data: [DONE]") and b'"error"' not in text
