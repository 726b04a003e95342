"""Circuit breaker transitions, the registry, worker URL parsing and settings validation."""

from __future__ import annotations

import argparse

import pytest

from gateway.errors import ConfigError, Conflict, NotFound
from gateway.fleet.breaker import BreakerState, CircuitBreaker
from gateway.fleet.health import apply_load, apply_models
from gateway.fleet.registry import Fleet
from gateway.server import add_arguments
from gateway.settings import BreakerSettings, WorkerSpec, from_args, parse_worker
from policies.api import Role


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _state(breaker: CircuitBreaker) -> BreakerState:
    return breaker.state


def test_breaker_opens_after_consecutive_failures_and_half_opens_after_pause() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=2, open_s=5.0, clock=clock)
    breaker.record_failure()
    assert _state(breaker) is BreakerState.CLOSED and breaker.allows()
    breaker.record_failure()
    assert _state(breaker) is BreakerState.OPEN and not breaker.allows()
    clock.now = 5.0
    assert _state(breaker) is BreakerState.HALF_OPEN and breaker.allows()
    breaker.record_failure()  # the probe failed: open for another period
    assert _state(breaker) is BreakerState.OPEN
    clock.now = 10.0
    breaker.record_success()
    assert _state(breaker) is BreakerState.CLOSED


def test_success_resets_the_failure_count() -> None:
    breaker = CircuitBreaker(failures=2, open_s=5.0, clock=Clock())
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert _state(breaker) is BreakerState.CLOSED


@pytest.mark.parametrize(
    ("raw", "spec"),
    [
        ("http://127.0.0.1:9001", WorkerSpec("127.0.0.1:9001", "http://127.0.0.1:9001", Role.BOTH)),
        ("http://h:1/#role=prefill", WorkerSpec("h:1", "http://h:1", Role.PREFILL)),
        ("https://h:1/v#role=decode&id=d1", WorkerSpec("d1", "https://h:1/v", Role.DECODE)),
    ],
    ids=["plain", "prefill", "decode-with-id"],
)
def test_parse_worker(raw: str, spec: WorkerSpec) -> None:
    assert parse_worker(raw) == spec


@pytest.mark.parametrize(
    "raw", ["127.0.0.1:9001", "ftp://h:1", "http://h:1#role=chef", "http://h:1#colour=red"]
)
def test_parse_worker_rejects(raw: str) -> None:
    with pytest.raises(ConfigError):
        parse_worker(raw)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_settings_from_args_and_validation(tmp_path: object) -> None:
    settings = from_args(
        _args("--worker", "http://a:1", "--worker", "http://b:2#role=decode", "--retries", "0")
    )
    assert [w.id for w in settings.workers] == ["a:1", "b:2"]
    assert settings.retry.retries == 0 and settings.policy == "prefix_cache_aware"
    with pytest.raises(ConfigError, match="twice"):
        from_args(_args("--worker", "http://a:1", "--worker", "http://a:1"))
    with pytest.raises(ConfigError, match="idle-timeout"):
        from_args(_args("--worker", "http://a:1", "--idle-timeout-s", "0"))
    with pytest.raises(ConfigError, match="--state"):
        from_args(_args("--worker", "http://a:1", "--state", "postgres://x"))


def test_policy_config_file(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "policy.yaml"  # type: ignore[operator]
    path.write_text("policy:\n  type: least_load\n")
    assert from_args(_args("--worker", "http://a:1", "--policy-config", str(path))).policy == {
        "type": "least_load"
    }


def test_registry_add_drain_remove_and_models() -> None:
    fleet = Fleet(breaker=BreakerSettings(), clock=Clock())
    record = fleet.add(WorkerSpec("a", "http://a"))
    with pytest.raises(Conflict):
        fleet.add(WorkerSpec("a", "http://a"))
    apply_models(record, {"data": [{"id": "m1", "object": "model"}, {"bad": 1}]})
    apply_load(record, {"num_running": 2, "waiting": 3, "kv_usage": 1.5, "num_cached_blocks": 9})
    assert (record.models, record.running, record.queue_depth, record.kv_usage, record.cached_blocks) == (
        frozenset({"m1"}), 2, 3, 1.0, 9,
    )  # fmt: skip
    assert fleet.serving("m1") == [record] and fleet.model_cards() == [{"id": "m1", "object": "model"}]
    fleet.drain("a")
    assert fleet.serving("m1") == [] and not record.available
    with pytest.raises(NotFound):
        fleet.drain("zzz")
    fleet.remove("a")
    assert len(fleet) == 0


def test_undrain_cancels_a_drain_until_the_worker_is_removed() -> None:
    fleet = Fleet(breaker=BreakerSettings(), clock=Clock())
    record = fleet.add(WorkerSpec("a", "http://a"))
    record.healthy = True
    record.models = frozenset({"m1"})
    assert fleet.undrain("a") is record and record.available  # not draining: nothing to cancel
    fleet.drain("a")
    fleet.undrain("a")
    assert fleet.serving("m1") == [record] and record.available
    fleet.drain("a")
    fleet.remove("a")
    with pytest.raises(NotFound, match="register it again"):
        fleet.undrain("a")
