"""A hostile worker behind the gateway (security finding 7): the upstream client takes from a worker exactly
what the response's framing says, whatever the worker writes (``tests.support.hostile_worker``).

Per mode, on every build and server: what the client gets (a glued second response reaches no client, a
close-delimited body is whole, a cut or malformed answer is a 502 or a stream's error event), that the next
request through the gateway gets its own answer (no desync), that nothing in the gateway's log is a
traceback, and that ``kvgate_requests_total`` counts what the client got.

Each case is followed by one good request, whose success closes the worker's circuit breaker again: a case
costs the breaker one failure at most (one worker: no retry elsewhere), below its threshold of three in a row.
Before each case the gateway is polled until it routes to the worker (after a failed case the breaker may
still be open).
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.adversarial import harness
from tests.support.hostile_worker import GLUED, MODEL, answer
from tests.support.procs import free_port, start_process, stop_process
from tests.support.waiting import wait_ready, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
_ROUTE = {CHAT: "chat", COMPLETIONS: "completions"}  # the ``route`` label of kvgate_requests_total
_ARGS = ("--policy", "round_robin", "--health-interval-s", "0.5")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(scope="module")
def hostile(logs: Path) -> Iterator[str]:
    """The hostile worker's base URL (one for every gateway of the module)."""
    port = free_port()
    cmd = [sys.executable, "-m", "tests.support.hostile_worker", "--port", str(port)]
    proc = start_process(cmd, log=logs / f"hostile-{port}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, f"{url}/health", logs=logs)
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="module", params=harness.COMBOS)
def gw(request: pytest.FixtureRequest, logs: Path, hostile: str) -> Iterator[harness.Gateway]:
    build, server = request.param
    with harness.gateway(logs, [hostile], build=build, server=server, args=_ARGS) as gateway:
        yield gateway


def post(gw: harness.Gateway, mode: str, *, stream: bool = False, endpoint: str = CHAT) -> httpx.Response:
    body: dict[str, object] = {"model": MODEL, "stream": stream}
    if endpoint == CHAT:
        body["messages"] = [{"role": "user", "content": f"mode:{mode}"}]
    else:
        body["prompt"] = f"mode:{mode}"
    return httpx.post(gw.url + endpoint, json=body, timeout=30)


def text_of(reply: httpx.Response) -> str:
    """A whole answer's text (chat or completions)."""
    choice = reply.json()["choices"][0]
    return str(choice["message"]["content"] if "message" in choice else choice["text"])


def events_of(reply: httpx.Response) -> list[bytes]:
    """A stream's ``data:`` payloads, in order."""
    frames = reply.content.split(b"\n\n")
    return [f.removeprefix(b"data: ") for f in frames if f.startswith(b"data: ")]


def streamed_text(events: list[bytes]) -> str:
    parts = []
    for event in events:
        if event == b"[DONE]" or b'"error"' in event:
            continue
        choice = orjson.loads(event)["choices"][0]
        parts.append(choice["delta"]["content"] if "delta" in choice else choice["text"])
    return "".join(parts)


def worker_stats(hostile: str) -> dict[str, int]:
    """The POSTs the worker received, per mode."""
    requests: dict[str, int] = httpx.get(f"{hostile}/stats", timeout=10).json()["requests"]
    return requests


def routable(gw: harness.Gateway) -> None:
    """Wait until the gateway routes to the worker again (its health seen, its breaker not open)."""

    def ok() -> bool:
        reply = post(gw, "ok")
        return reply.status_code == 200 and text_of(reply) == answer("ok")

    wait_until(ok, timeout_s=20, interval_s=0.25)


def requests_total(gw: harness.Gateway, **labels: str) -> float:
    return harness.counter(gw.metrics(), "kvgate_requests_total", **labels)


def run_case(
    gw: harness.Gateway, hostile: str, mode: str, *, status: int, stream: bool = False, endpoint: str = CHAT
) -> httpx.Response:
    """One request in ``mode``, then a good one; the checks every case shares. The first reply."""
    routable(gw)
    mark = gw.log_mark()
    # the metrics to come: one request with the status the client got, one good one, nothing else
    expected = collections.Counter({(_ROUTE[endpoint], str(status)): 1})
    expected["chat", "200"] += 1
    before = {key: requests_total(gw, route=key[0], status=key[1]) for key in expected}
    before_total = requests_total(gw)
    before_stats = worker_stats(hostile)

    reply = post(gw, mode, stream=stream, endpoint=endpoint)
    follow = post(gw, "ok")

    assert reply.status_code == status, reply.text
    assert GLUED not in reply.text
    # no desync: the next request through the gateway gets its own answer, whole
    assert follow.status_code == 200, follow.text
    assert text_of(follow) == answer("ok")
    assert GLUED not in follow.text
    after_stats = worker_stats(hostile)
    sent = after_stats.get(mode, 0) - before_stats.get(mode, 0)
    assert sent == 1 + (mode == "ok")  # sent once (one worker: no retry elsewhere), the good one once
    assert gw.tracebacks_since(mark) == [], gw.log()
    # counted once the answer is sent: wait for the two, then look for a third
    wait_until(lambda: requests_total(gw) - before_total >= 2, timeout_s=5)
    counted = {key: requests_total(gw, route=key[0], status=key[1]) - before[key] for key in expected}
    assert counted == dict(expected)
    assert requests_total(gw) - before_total == 2
    return reply


def assert_upstream_error(reply: httpx.Response) -> None:
    """A 502 with OpenAI's error JSON."""
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()["error"]
    assert error["type"] == "upstream_error"
    assert error["code"] == "worker_unavailable"
    assert isinstance(error["message"], str) and error["message"]


# --- whole answers ---


def test_ok_is_passed_through(gw: harness.Gateway, hostile: str) -> None:
    reply = run_case(gw, hostile, "ok", status=200)
    assert text_of(reply) == answer("ok")
    assert reply.json()["usage"]["total_tokens"] == 7


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS], ids=["chat", "completions"])
def test_a_glued_second_response_reaches_no_client(gw: harness.Gateway, hostile: str, endpoint: str) -> None:
    reply = run_case(gw, hostile, "glue", status=200, endpoint=endpoint)
    assert text_of(reply) == answer("glue")
    assert int(reply.headers["content-length"]) == len(reply.content)


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS], ids=["chat", "completions"])
def test_a_close_delimited_answer_is_read_whole(gw: harness.Gateway, hostile: str, endpoint: str) -> None:
    reply = run_case(gw, hostile, "close", status=200, endpoint=endpoint)
    assert text_of(reply) == answer("close")
    assert reply.json()["usage"]["total_tokens"] == 7


@pytest.mark.parametrize("mode", ["short", "garbage", "cl_te"])
def test_a_cut_or_malformed_answer_is_a_502(gw: harness.Gateway, hostile: str, mode: str) -> None:
    reply = run_case(gw, hostile, mode, status=502)
    assert_upstream_error(reply)
    assert answer(mode) not in reply.text  # no part of the cut answer passed off as one


def test_garbage_before_a_stream_started_is_a_502(gw: harness.Gateway, hostile: str) -> None:
    reply = run_case(gw, hostile, "garbage", status=502, stream=True)
    assert_upstream_error(reply)


# --- streams ---


def test_a_stream_followed_by_a_second_response_ends_at_its_own_end(
    gw: harness.Gateway, hostile: str
) -> None:
    reply = run_case(gw, hostile, "stream_glue", status=200, stream=True)
    events = events_of(reply)
    assert events[-1] == b"[DONE]"
    assert events.count(b"[DONE]") == 1
    assert not [e for e in events if b'"error"' in e]
    assert streamed_text(events) == answer("stream_glue")


def test_a_stream_cut_before_its_end_ends_with_an_error_event(gw: harness.Gateway, hostile: str) -> None:
    # the client got a 200 and the first events before the cut: the metric counts the 200 it got
    reply = run_case(gw, hostile, "stream_cut", status=200, stream=True)
    events = events_of(reply)
    assert events[-1] == b"[DONE]"
    error = orjson.loads(events[-2])["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "worker_unavailable")
    assert answer("stream_cut").startswith(streamed_text(events))  # what came before the cut, nothing else
    assert streamed_text(events)
