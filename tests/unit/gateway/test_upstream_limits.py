"""The upstream cap's pieces without a network: flags and settings, the shed log, the open-files limit,
``max_running`` from /load into the record, and the waiting requests in the policy's snapshot."""

from __future__ import annotations

import argparse
import logging
import resource
from collections.abc import Callable

import pytest

from gateway.errors import ConfigError, Overloaded, UpstreamSaturated
from gateway.fleet.health import apply_load
from gateway.fleet.registry import Fleet
from gateway.observability.metrics import Metrics
from gateway.proxy.shed import ShedLog
from gateway.routing.router import Router
from gateway.server import add_arguments, raise_open_files_limit
from gateway.settings import (
    DEFAULT_UPSTREAM_CONNECTIONS,
    BreakerSettings,
    Settings,
    UpstreamLimits,
    WorkerSpec,
    from_args,
    parse_worker,
)
from gateway.state.memory import MemoryLoadBoard
from policies.api import Decision, Need, RouteRequest, WorkerView


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--worker", "http://127.0.0.1:9001", *argv])


def test_flags_default_to_auto_and_parse() -> None:
    assert from_args(_args()).upstream == UpstreamLimits()
    limits = from_args(
        _args(
            "--upstream-max-connections",
            "8",
            "--upstream-max-waiting",
            "3",
            "--upstream-queue-timeout-s",
            "2",
        )
    ).upstream
    assert (limits.max_connections, limits.max_waiting, limits.queue_timeout_s) == (8, 3, 2.0)
    assert from_args(_args("--upstream-max-connections", "auto")).upstream.max_connections is None


@pytest.mark.parametrize("argv", [("--upstream-max-waiting", "-1"), ("--upstream-queue-timeout-s", "0")])
def test_bad_values_stop_startup(argv: tuple[str, str]) -> None:
    with pytest.raises(ConfigError):
        from_args(_args(*argv))


def test_a_bad_connection_count_is_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit):
        _args("--upstream-max-connections", "0")


def test_the_cap_is_the_flag_else_the_advertised_slots_else_the_default() -> None:
    assert UpstreamLimits(max_connections=4).cap(512) == 4
    assert UpstreamLimits().cap(512) == 512
    assert UpstreamLimits().cap(0) == DEFAULT_UPSTREAM_CONNECTIONS == 256


def test_the_wait_fits_in_the_first_byte_deadline() -> None:
    assert UpstreamLimits(queue_timeout_s=30.0).wait_s(60.0) == 30.0
    assert UpstreamLimits(queue_timeout_s=30.0).wait_s(2.0) == 1.0


def test_the_shed_error_is_an_overload_in_openais_shape() -> None:
    error = UpstreamSaturated("worker a is full")
    assert isinstance(error, Overloaded)
    assert (error.status, error.error_type, error.code) == (503, "server_error", "upstream_saturated")
    assert (b"retry-after", b"1") in error.response_headers(error.body())


def test_sheds_are_counted_each_and_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    timers: list[tuple[float, Callable[[], None]]] = []
    metrics = Metrics()
    log = ShedLog(metrics, interval_s=10.0, call_later=lambda delay, cb: timers.append((delay, cb)))
    with caplog.at_level(logging.WARNING, logger="gateway.proxy.shed"):
        for _ in range(50):
            log.record("w0", "queue_full")
        assert len(timers) == 1  # one timer for the interval, none per request
        log.record("w1", "wait_timeout")
        timers.pop()[1]()  # the interval ends: one line with the count, and the next interval armed
        timers.pop()[1]()  # a quiet interval: nothing to say, disarmed
        log.record("w0", "queue_full")  # shedding again: logged at once
    assert len(timers) == 1  # armed again by the last shed
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("upstream saturated: shedding started (worker w0, queue_full")
    assert lines[1].startswith(
        "upstream saturated: 50 more request(s) shed in the last 10 s (latest: worker w1"
    )
    assert lines[2].startswith("upstream saturated: shedding started")
    text = metrics.render().decode()
    assert 'kvgate_upstream_shed_total{reason="queue_full",worker="w0"} 51.0' in text
    assert 'kvgate_upstream_shed_total{reason="wait_timeout",worker="w1"} 1.0' in text


def _settings(workers: int, limits: UpstreamLimits | None = None) -> Settings:
    specs = tuple(parse_worker(f"http://127.0.0.1:{9001 + i}") for i in range(workers))
    return Settings(workers=specs, upstream=limits or UpstreamLimits())


def test_the_open_files_limit_is_raised_to_the_hard_one_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[tuple[int, tuple[int, int]]] = []
    with caplog.at_level(logging.INFO, logger="gateway.server"):
        clients = raise_open_files_limit(
            _settings(4),
            getrlimit=lambda _which: (1024, 65536),
            setrlimit=lambda which, limits: calls.append((which, limits)),
        )
    assert calls == [(resource.RLIMIT_NOFILE, (65536, 65536))]
    reserved = 4 * (256 + 1) + 64
    assert clients == 65536 - reserved
    [record] = caplog.records
    assert record.levelno == logging.INFO
    assert (
        f"open files limit 65536 (was 1024): room for about {clients} concurrent client"
        in record.getMessage()
    )


def test_a_refused_raise_keeps_the_limit_and_warns_when_it_is_short(caplog: pytest.LogCaptureFixture) -> None:
    def refuse(_which: int, _limits: tuple[int, int]) -> None:
        raise ValueError("not allowed")

    with caplog.at_level(logging.INFO, logger="gateway.server"):
        clients = raise_open_files_limit(
            _settings(2, UpstreamLimits(max_connections=100)),
            getrlimit=lambda _w: (1024, 4096),
            setrlimit=refuse,
        )
    assert clients == 1024 - (2 * 101 + 64)
    assert caplog.records[-1].levelno == logging.INFO  # 758 clients >= 2 x 100 upstream
    with caplog.at_level(logging.INFO, logger="gateway.server"):
        assert raise_open_files_limit(_settings(4), getrlimit=lambda _w: (1024, 1024), setrlimit=refuse) == 0
    assert caplog.records[-1].levelno == logging.WARNING
    assert "open files limit 1024 (was 1024)" in caplog.records[-1].getMessage()


def test_load_records_the_advertised_slots() -> None:
    record = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0).add(WorkerSpec(id="w", url="http://w"))
    apply_load(record, {"running": 3, "max_running": 512})
    assert (record.running, record.max_running) == (3, 512)
    apply_load(record, {"running": 3, "max_num_seqs": 64})
    assert record.max_running == 64
    apply_load(record, {"running": 3})  # an engine that does not say: the flag's default applies
    assert record.max_running == 0


class _Recorder:
    needs: frozenset[Need] = frozenset()
    name = "recorder"

    def __init__(self) -> None:
        self.views: tuple[WorkerView, ...] = ()

    def select(self, req: RouteRequest, workers: tuple[WorkerView, ...]) -> Decision:
        self.views = tuple(workers)
        return Decision(worker=workers[0].id)


def test_the_snapshot_adds_the_requests_waiting_for_a_connection_to_the_queue() -> None:
    fleet = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0)
    for wid in ("w0", "w1"):
        record = fleet.add(WorkerSpec(id=wid, url=f"http://{wid}"))
        record.healthy, record.models, record.queue_depth = True, frozenset({"m"}), 2
    policy = _Recorder()
    router = Router(
        fleet=fleet, load=MemoryLoadBoard(), policy=policy, analyzer=None, kv_index=None, block_size=16,
        metrics=Metrics(), upstream_queue=lambda url: 5 if url == "http://w0" else 0,
    )  # fmt: skip
    router.route(RouteRequest(model="m"))
    assert {v.id: v.queue_depth for v in policy.views} == {"w0": 7, "w1": 2}
