"""End to end: a real Envoy 1.40 carries the bytes, ``kvgate epp`` picks, sim workers answer.

Both Envoy configurations of the Gateway API Inference Extension (``ORIGINAL_DST`` and ``override_host``): cache-aware routing visible
in the worker that served (``x-kvgate-worker``, set by the picker) and in the ``cached_tokens`` the sim
workers report; SSE streamed through untouched; a 1 MB body; what Envoy really does with a fallback list
and with the picker gone (fail-closed, and fail-open only for body-less requests).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.envoy.envoy_proc import ORIGINAL_DST, OVERRIDE_HOST, envoy_binary, run_envoy
from tests.integration.epp_fleet import EppFleet, epp_fleet, start_workers
from tests.support.procs import stop_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "kvgate-sim"
MODES = [ORIGINAL_DST, OVERRIDE_HOST]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    envoy_binary()  # skip early when there is no Envoy
    return tmp_path_factory.mktemp("envoy")


@pytest.fixture(scope="module")
def workers(logs: Path) -> Iterator[list[str]]:
    procs = start_workers(logs, 2)
    try:
        yield list(procs)
    finally:
        for proc in procs.values():
            stop_process(proc)


@pytest.fixture(scope="module")
def fleet(logs: Path, workers: list[str]) -> Iterator[EppFleet]:
    with epp_fleet(logs / "..", workers=workers) as f:
        yield f


def _conversation(envoy: str, system: str, turns: int) -> list[tuple[str, int]]:
    """(served worker, cached tokens) per turn of one multi-turn chat."""
    messages = [{"role": "system", "content": system}]
    out = []
    with httpx.Client(base_url=envoy, timeout=30) as client:
        for turn in range(turns):
            messages.append({"role": "user", "content": f"question {turn}: tell me more about item {turn}"})
            r = client.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 8}
            )
            assert r.status_code == 200, r.text
            answer = r.json()
            messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
            cached = answer["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
            out.append((r.headers["x-kvgate-worker"], cached))
    return out


@pytest.mark.parametrize("mode", MODES)
def test_conversations_stick_to_the_worker_holding_their_prefix(
    mode: str, logs: Path, fleet: EppFleet
) -> None:
    with run_envoy(logs, mode, epp_port=fleet.grpc_port, workers=fleet.workers) as envoy:
        for n in range(3):
            turns = _conversation(envoy, f"[{mode} conversation {n}] You are terse. " * 30, 4)
            served = {w for w, _ in turns}
            assert len(served) == 1 and served <= set(fleet.workers), turns
            assert all(cached > 0 for _, cached in turns[1:]), turns


@pytest.mark.parametrize("mode", MODES)
def test_sse_streams_through_untouched(mode: str, logs: Path, fleet: EppFleet) -> None:
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 12,
        "messages": [{"role": "user", "content": "stream"}],
        "stream_options": {"include_usage": True},
    }
    with (
        run_envoy(logs, mode, epp_port=fleet.grpc_port, workers=fleet.workers) as envoy,
        httpx.Client(timeout=30) as c,
        c.stream("POST", f"{envoy}/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-kvgate-worker"] in fleet.workers
        events = [line for line in r.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3
    assert '"usage"' in events[-2]


@pytest.mark.parametrize("mode", MODES)
def test_a_1mb_body_and_a_get_go_through(mode: str, logs: Path, fleet: EppFleet) -> None:
    big = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "z " * 500_000}]}
    with (
        run_envoy(logs, mode, epp_port=fleet.grpc_port, workers=fleet.workers) as envoy,
        httpx.Client(timeout=60) as c,
    ):
        r = c.post(f"{envoy}/v1/chat/completions", json=big)
        # the whole megabyte reached the worker, whose context (32k tokens) is too small for it
        assert r.headers["x-kvgate-worker"] in fleet.workers
        assert r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert c.get(f"{envoy}/v1/models").status_code == 200
        bad = c.post(
            f"{envoy}/v1/chat/completions", content=b"{oops", headers={"content-type": "application/json"}
        )
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"


def test_client_destination_header_is_ignored(logs: Path, fleet: EppFleet) -> None:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "spoof"}]}
    with run_envoy(logs, ORIGINAL_DST, epp_port=fleet.grpc_port, workers=fleet.workers) as envoy:
        r = httpx.post(
            f"{envoy}/v1/chat/completions",
            json=body,
            timeout=30,
            headers={"x-gateway-destination-endpoint": "127.0.0.1:1"},
        )
    assert r.status_code == 200 and r.headers["x-kvgate-worker"] in fleet.workers


def test_the_picker_speaks_tls_by_default(logs: Path, workers: list[str]) -> None:
    """``kvgate epp`` on its defaults serves TLS with a certificate it made at start; Envoy reaches it the
    way the GIE gateways do (TLS, the certificate not verified), and a stream goes through."""
    body = {"model": MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "tls"}]}
    (logs / "tls").mkdir(exist_ok=True)
    with (
        epp_fleet(logs / "tls", workers=workers, tls=True) as secure,
        run_envoy(logs, OVERRIDE_HOST, epp_port=secure.grpc_port, workers=workers, picker_tls=True) as envoy,
    ):
        r = httpx.post(f"{envoy}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.headers["x-kvgate-worker"] in workers
    assert r.text.rstrip().endswith("data: [DONE]")
    assert "self-signed" in (logs / "tls" / "epp.log").read_text(errors="replace").lower()


@pytest.mark.parametrize(("mode", "status"), [(ORIGINAL_DST, 503), (OVERRIDE_HOST, 200)])
def test_fallback_lists_need_override_host(mode: str, status: int, logs: Path, workers: list[str]) -> None:
    """Envoy's ORIGINAL_DST cluster cannot parse ``a,b``: every request is a 503 (Envoy's ORIGINAL_DST cluster takes one address)."""
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "fallbacks"}]}
    with (
        epp_fleet(logs, workers=workers, epp_args=["--fallbacks", "1"]) as f,
        run_envoy(logs, mode, epp_port=f.grpc_port, workers=workers) as envoy,
    ):
        r = httpx.post(f"{envoy}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text


@pytest.mark.parametrize(
    ("allow", "posts", "get"),
    [(False, {500}, 500), (True, {200, 500}, 200)],
    ids=["fail-closed", "fail-open"],
)
def test_picker_down(allow: bool, posts: set[int], get: int, logs: Path, workers: list[str]) -> None:
    """With the picker gone and fail-closed, everything is a 500. Fail-open (``failure_mode_allow``) lets
    body-less requests through to the pool's round robin, but a POST only when the connection error beats
    its first body chunk to the ext_proc stream (Envoy PR #41276): a race, seen both ways here (mostly 500)."""
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "down"}]}
    with epp_fleet(logs, workers=workers) as f:
        port = f.grpc_port
        stop_process(f.procs["epp"])
        with run_envoy(
            logs, OVERRIDE_HOST, epp_port=port, workers=workers, failure_mode_allow=allow
        ) as envoy:
            time.sleep(0.2)
            assert httpx.post(f"{envoy}/v1/chat/completions", json=body, timeout=30).status_code in posts
            assert httpx.get(f"{envoy}/v1/models", timeout=30).status_code == get


def test_a_dead_pick_falls_back_and_envoy_reports_who_served(logs: Path) -> None:
    """``override_host`` with ``--fallbacks 1``: the picked worker dies (the picker has not probed it since),
    Envoy falls back to the second endpoint of the list and reports it in ``envoy.lb``
    (``x-gateway-destination-endpoint-served``); the picker moves the request's accounting there."""
    where = logs / "served"
    where.mkdir(exist_ok=True)
    procs = start_workers(where, 2)
    pair = list(procs)
    slow_probes = ["--fallbacks", "1", "--health-interval-s", "60", "--log-level", "info"]
    try:
        with (
            epp_fleet(where, workers=pair, epp_args=slow_probes) as f,
            run_envoy(where, OVERRIDE_HOST, epp_port=f.grpc_port, workers=pair) as envoy,
            httpx.Client(base_url=envoy, timeout=30) as client,
        ):
            messages = [
                {"role": "user", "content": "a conversation that its first worker will not finish " * 8}
            ]
            first = client.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 4}
            )
            assert first.status_code == 200, first.text
            picked = first.headers["x-kvgate-worker"]
            stop_process(procs[picked])  # the picker still believes it healthy (probes every 60 s)
            messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
            second = client.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 4}
            )
            assert second.status_code == 200, second.text
            survivor = next(w for w in pair if w != picked)
            assert second.headers["x-kvgate-worker"] == survivor  # the served endpoint, as Envoy reported it
        log = (where / "epp.log").read_text(errors="replace")
        assert "served elsewhere than picked" in log
    finally:
        for proc in procs.values():
            stop_process(proc)
