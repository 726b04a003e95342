"""The health loop over foreign engines: detection when a worker turns healthy, each engine's load signal on
the record fields the policies read, the in-flight stand-in where an engine has none."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from gateway.engines.profiles import EngineKind
from gateway.engines.summary import engine_summary
from gateway.fleet.health import HealthChecker
from gateway.fleet.registry import Fleet, WorkerRecord
from gateway.settings import BreakerSettings, parse_worker
from gateway.state.memory import MemoryLoadBoard
from tests.unit.gateway.engines.answers import (
    KINDS,
    FakeServers,
    TrtllmMetrics,
    engine_answers,
    js,
    trtllm_stat,
)


def _fleet(*raw: str, clock: list[float]) -> Fleet:
    fleet = Fleet(breaker=BreakerSettings(failures=2, open_s=30.0), clock=lambda: clock[0])
    for url in raw:
        fleet.add(parse_worker(url))
    return fleet


def _setup(
    kinds: tuple[str, ...] = KINDS, on_detected: Callable[[WorkerRecord], None] = lambda _r: None
) -> tuple[HealthChecker, Fleet, FakeServers, list[float]]:
    clock = [0.0]
    get = FakeServers({f"http://{k}:1": engine_answers(k) for k in kinds})
    fleet = _fleet(*(f"http://{k}:1#id={k}" for k in kinds), clock=clock)
    checker = HealthChecker(
        fleet, get, MemoryLoadBoard(), interval_s=1.0, clock=lambda: clock[0], on_detected=on_detected
    )
    return checker, fleet, get, clock


def _kind(r: WorkerRecord) -> EngineKind:
    return r.facts.kind  # read afresh (a function call keeps type checkers from pinning an earlier assert)


def _healthy(r: WorkerRecord) -> bool:
    return r.healthy


def _figures(r: WorkerRecord) -> tuple[int, int, float, int]:
    return r.running, r.queue_depth, round(r.kv_usage, 3), r.max_running


async def test_each_engines_load_lands_on_the_record_fields_the_policies_read() -> None:
    checker, fleet, _, _ = _setup()
    await checker.round()
    by = {r.id: r for r in fleet}
    assert all(r.healthy for r in fleet)
    assert {k: by[k].facts.kind for k in KINDS} == {k: EngineKind(k) for k in KINDS}
    assert {k: _figures(by[k]) for k in KINDS} == {
        "kvgate": (2, 1, 0.5, 8),
        "vllm": (5, 5, 0.375, 0),
        "sglang": (10, 2, 0.3, 128),
        "trtllm": (5, 3, 0.25, 256),
        "tgi": (12, 5, 0.25, 0),
        "lmdeploy": (6, 5, 0.75, 0),
        "mii": (0, 0, 0.0, 0),
        "openai": (0, 0, 0.0, 0),
    }
    assert by["kvgate"].cached_blocks == 7
    signals = {k: by[k].facts.load_signal for k in KINDS}
    assert signals == {k: "in-flight" if k in ("mii", "openai") else "engine" for k in KINDS}
    assert by["vllm"].facts.load_note == "from /metrics"
    assert by["sglang"].facts.load_note == "from /v1/loads?include=core"
    assert by["trtllm"].facts.load_note == "from /metrics (drained on read: kvgate is its only reader)"


async def test_cache_facts_come_from_detection_or_the_first_scrape() -> None:
    checker, fleet, _, _ = _setup()
    await checker.round()
    by = {r.id: r.facts for r in fleet}
    assert (by["vllm"].block_size, by["vllm"].kv_capacity_tokens) == (16, 32000)
    assert (by["sglang"].block_size, by["sglang"].kv_capacity_tokens) == (16, 500000)
    assert (by["trtllm"].block_size, by["trtllm"].kv_capacity_tokens) == (32, 32000)  # from its stats
    assert (by["tgi"].block_size, by["tgi"].kv_capacity_tokens) == (None, 16384)  # tgi_batch_max_total_tokens


async def test_mii_has_no_signal_and_the_in_flight_count_stands_in() -> None:
    checker, fleet, get, _ = _setup(("mii",))
    await checker.round()
    await checker.round()
    mii = fleet.get("mii")
    assert mii is not None and mii.healthy
    assert mii.facts.load_signal == "in-flight"
    assert mii.facts.load_note == "mii publishes no load signal; the gateway's in-flight count stands in"
    assert get.count("http://mii:1", "/metrics") == 0 and get.count("http://mii:1", "/load") == 0
    summary = engine_summary(mii.facts, mii.configured_engine)
    assert summary["health"] == (
        "passive: /health is a static 200 on mii; failed requests open its circuit breaker"
    )
    assert summary["no_affinity_reason"] == "no prefix cache in DeepSpeed-MII"
    assert summary["prefix_reuse"] is False
    mii.breaker.record_failure()
    mii.breaker.record_failure()
    await checker.round()  # /health still says 200: the breaker keeps it out
    assert mii.healthy and not mii.available


async def test_one_get_per_path_per_probe() -> None:
    checker, _, get, _ = _setup(("vllm", "kvgate"))
    await checker.round()
    for path in ("/v1/models", "/metrics", "/version"):
        assert get.count("http://vllm:1", path) == 1
    assert get.count("http://kvgate:1", "/load") == 1
    await checker.round()
    assert get.count("http://vllm:1", "/metrics") == 2
    assert get.count("http://vllm:1", "/version") == 1  # no detection while healthy


async def test_trtllm_empty_drain_keeps_the_last_figures() -> None:
    checker, fleet, get, _ = _setup(("trtllm",))
    await checker.round()
    trt = fleet.get("trtllm")
    assert trt is not None and _figures(trt) == (5, 3, 0.25, 256)
    await checker.round()  # nothing ran since: the queue is empty
    assert _figures(trt) == (5, 3, 0.25, 256)
    assert trt.facts.load_signal == "engine"
    assert "the last figures stand" in trt.facts.load_note
    metrics = get.servers["http://trtllm:1"]["/metrics"]
    assert isinstance(metrics, TrtllmMetrics)
    metrics.queue.append(trtllm_stat(43, active=0, queued=0))
    await checker.round()
    assert _figures(trt) == (0, 0, 0.0, 256)
    assert metrics.reads == 3  # the health loop is its only reader: detection never drained it


async def test_trtllm_load_is_read_from_a_metrics_page_that_takes_2_5_s() -> None:
    """TensorRT-LLM's JSON /metrics waits up to 2 s for iteration stats: its scrape has a deadline of its own
    (past the 1 s probe), and the worker stays healthy while it reads."""
    checker, fleet, get, clock = _setup(("trtllm",))
    get.slow[("http://trtllm:1", "/metrics")] = 2.5
    await checker.round(wait_load=False)
    trt = fleet.get("trtllm")
    assert trt is not None and trt.healthy and trt.facts.load_signal == "in-flight"  # still reading
    clock[0] = 7.0
    await checker.settle()
    assert trt.healthy and trt.facts.load_signal == "engine" and _figures(trt) == (5, 3, 0.25, 256)
    assert trt.facts.load_path == "/metrics" and trt.facts.load_read_at == 7.0
    assert engine_summary(trt.facts, trt.configured_engine, now=9.5)["load_age_s"] == 2.5


async def test_trtllm_with_return_perf_metrics_is_read_at_prometheus_metrics() -> None:
    """Where ``/prometheus/metrics`` exists (``return_perf_metrics``) it is read, fast, and the JSON ``/metrics``
    (drained by the engine's own collector then) is never asked."""
    checker, fleet, get, _ = _setup(("trtllm",))
    get.servers["http://trtllm:1"]["/prometheus/metrics"] = (
        200, b"trtllm_num_requests_running 4\ntrtllm_num_requests_waiting 3\ntrtllm_kv_cache_utilization 0.6\n"
    )  # fmt: skip
    await checker.round()
    await checker.round()
    trt = fleet.get("trtllm")
    assert trt is not None and (trt.running, trt.queue_depth) == (4, 3)
    assert trt.facts.load_note == "from /prometheus/metrics"
    assert get.count("http://trtllm:1", "/metrics") == 0


async def test_a_load_scrape_past_its_deadline_leaves_the_worker_healthy() -> None:
    checker, fleet, get, _ = _setup(("vllm",))
    await checker.round()
    vllm = fleet.get("vllm")
    assert vllm is not None and vllm.facts.load_signal == "engine"
    get.slow[("http://vllm:1", "/metrics")] = 1.5  # its deadline is the probe's: 1 s
    await checker.round()
    assert vllm.healthy and vllm.available
    assert vllm.facts.load_signal == "in-flight"
    assert (
        vllm.facts.load_note
        == "GET /metrics: no answer within 1 s; in-flight count stands in (last figures kept)"
    )
    reads = get.count("http://vllm:1", "/metrics")
    get.slow[("http://vllm:1", "/metrics")] = 0.3
    await checker.round(wait_load=False)
    await checker.round(wait_load=False)  # the first read is still under way: no second one beside it
    assert get.count("http://vllm:1", "/metrics") == reads + 1
    await checker.settle()
    assert vllm.facts.load_signal == "engine"


async def test_a_load_scrape_that_breaks_is_logged_and_the_worker_stays_healthy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    checker, fleet, get, _ = _setup(("vllm",))
    await checker.round()  # detected (detection reads /metrics too)

    def broken() -> tuple[int, bytes]:
        raise RuntimeError("a bug in the read")

    get.servers["http://vllm:1"]["/metrics"] = broken
    with caplog.at_level(logging.ERROR, logger="gateway.fleet.health"):
        await checker.round()
    vllm = fleet.get("vllm")
    assert vllm is not None and vllm.healthy and vllm.facts.load_signal == "in-flight"
    assert "a bug in the read" in vllm.facts.load_note
    assert [r.message for r in caplog.records] == ["load scrape failed"]


async def test_an_older_sglang_is_read_at_get_load() -> None:
    """SGLang before /v1/loads (404 there) publishes /get_load: one entry per DP rank; the path that answered
    is kept, so later rounds ask it alone."""
    checker, fleet, get, _ = _setup(("sglang",))
    answers = get.servers["http://sglang:1"]
    del answers["/v1/loads?include=core"]
    answers["/get_load"] = js([
        {"dp_rank": 0, "num_reqs": 7, "num_waiting_reqs": 2, "num_tokens": 900},
        {"dp_rank": 1, "num_reqs": 3, "num_waiting_reqs": 1, "num_tokens": 300},
    ])  # fmt: skip
    await checker.round()
    sglang = fleet.get("sglang")
    assert sglang is not None and sglang.facts.load_signal == "engine"
    assert (sglang.running, sglang.queue_depth) == (7, 3)
    assert sglang.facts.load_note == "from /get_load" and sglang.facts.load_path == "/get_load"
    await checker.round()
    assert get.count("http://sglang:1", "/v1/loads?include=core") == 1
    assert get.count("http://sglang:1", "/get_load") == 2


async def test_detection_is_logged_once_and_handed_to_the_hook(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []
    checker, _, _, _ = _setup(("vllm", "mii"), on_detected=lambda r: seen.append(f"{r.id}:{r.facts.kind}"))
    with caplog.at_level(logging.INFO, logger="gateway.fleet.health"):
        await checker.round()
        await checker.round()
    assert sorted(seen) == ["mii:mii", "vllm:vllm"]
    lines = [r.getMessage() for r in caplog.records if " is " in r.getMessage()]
    assert sorted(lines) == [
        "worker mii is mii (owned_by=deepspeed-mii): no load signal (in-flight count), block 128 (default), "
        "events none, parity probe none; health passive: /health is a static 200 on mii; failed requests open "
        "its circuit breaker; no cache affinity: no prefix cache in DeepSpeed-MII",
        "worker vllm is vllm 0.32.0 (owned_by=vllm): load from /metrics, block 16, KV 32000 tokens, "
        "events zmq, parity probe /tokenize",
    ]


async def test_a_failing_hook_does_not_stop_health_checks(caplog: pytest.LogCaptureFixture) -> None:
    def boom(_record: WorkerRecord) -> None:
        raise RuntimeError("boom")

    checker, fleet, _, _ = _setup(("vllm",), on_detected=boom)
    with caplog.at_level(logging.ERROR):
        await checker.round()
    vllm = fleet.get("vllm")
    assert vllm is not None and vllm.healthy and vllm.running == 5
    assert any("on_detected hook failed" in r.getMessage() for r in caplog.records)


async def test_an_undetected_worker_is_asked_again_later() -> None:
    clock = [0.0]
    get = FakeServers({"http://x:1": {"/health": (200, b"")}})  # answers /health only (so far)
    fleet = _fleet("http://x:1#id=x", clock=clock)
    checker = HealthChecker(fleet, get, MemoryLoadBoard(), interval_s=1.0, clock=lambda: clock[0])
    await checker.round()
    x = fleet.get("x")
    assert x is not None and x.healthy and x.facts.kind is EngineKind.AUTO
    assert x.facts.load_signal == "in-flight" and "not detected yet" in x.facts.load_note
    get.servers["http://x:1"] = engine_answers("sglang")  # it finished loading
    clock[0] += 5.0
    await checker.round()
    assert _kind(x) is EngineKind.AUTO  # not yet asked again
    clock[0] += 30.0
    await checker.round()
    assert _kind(x) is EngineKind.SGLANG and x.running == 10


async def test_a_restarted_worker_is_detected_again() -> None:
    checker, fleet, get, _ = _setup(("kvgate",))
    await checker.round()
    w = fleet.get("kvgate")
    assert w is not None and w.facts.kind is EngineKind.KVGATE
    get.down.add("http://kvgate:1")
    await checker.round()
    assert not w.healthy
    get.down.clear()
    get.servers["http://kvgate:1"] = engine_answers("vllm")  # came back as a vLLM server
    await checker.round()
    assert _healthy(w) and _kind(w) is EngineKind.VLLM and w.running == 5 and w.cached_blocks == 0


async def test_the_operators_word_survives_detection() -> None:
    clock = [0.0]
    get = FakeServers({"http://l:1": engine_answers("lmdeploy")})
    fleet = _fleet("http://l:1#id=l&engine=lmdeploy&prefix_cache=on&kv_tokens=4096", clock=clock)
    checker = HealthChecker(fleet, get, MemoryLoadBoard(), interval_s=1.0, clock=lambda: clock[0])
    await checker.round()
    lmdeploy = fleet.get("l")
    assert lmdeploy is not None
    facts = lmdeploy.facts
    assert (facts.kind, facts.detected_by) == (EngineKind.LMDEPLOY, "configured")
    assert facts.prefix_reuse is True and facts.no_affinity_reason is None
    assert facts.kv_capacity_tokens == 4096


async def test_a_broken_signal_falls_back_to_the_in_flight_count() -> None:
    checker, fleet, get, _ = _setup(("vllm", "lmdeploy"))
    await checker.round()
    get.servers["http://vllm:1"]["/metrics"] = (200, b"<html>oops</html>")
    get.servers["http://lmdeploy:1"]["/metrics"] = (503, b"")
    await checker.round()
    by = {r.id: r for r in fleet}
    assert all(r.healthy for r in fleet)
    assert by["vllm"].facts.load_signal == "in-flight"
    assert "absent from the metrics" in by["vllm"].facts.load_note
    assert (
        by["lmdeploy"].facts.load_note
        == "GET /metrics answered 503; in-flight count stands in (last figures kept)"
    )
