"""The byte fallback's block size as start-up chooses it: probed from the workers (the preflight), given with
``--block-size`` (no probe), or the default; and the bytes per token learned as the capacity learner's prior."""

from __future__ import annotations

import dataclasses
import time

import pytest

from gateway.deps import _initial_ratio, build_analyzer, build_policy, fallback_settings
from gateway.kvindex.capacity import BYTES_PER_TOKEN
from gateway.settings import BYTE_BLOCK_SIZE, Settings
from tests.unit.gateway.engines.test_block_probe import Engine, fleet
from tests.unit.gateway.gateway_harness import settings_for

pytestmark = pytest.mark.timeout(30)


def _settings(**overrides: object) -> Settings:
    base = settings_for("http://a:8000", "http://b:8000", policy="prefix_cache_aware", tokenizer="auto")
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


async def test_the_preflight_probe_sizes_the_byte_block_and_primes_the_learner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = _settings()
    engines = {"a": Engine(), "b": Engine()}
    async with fleet(engines) as client:
        chosen = await build_analyzer(settings, build_policy(settings, time.monotonic), client, probe=True)
    assert chosen.approximate_only and chosen.block_size == 96
    assert chosen.bytes_per_token == pytest.approx(5.76, abs=0.01)
    served = fallback_settings(settings, chosen)
    assert served.block_size == 96 and served.kv_index == "approximate" and not served.exact_tokens
    assert _initial_ratio(served) == chosen.bytes_per_token
    warning = next(r.getMessage() for r in caplog.records if "no exact tokenizer" in r.getMessage())
    assert "(96-byte blocks)" in warning and "learned 5.76 bytes per engine token" in warning


@pytest.mark.parametrize(
    ("overrides", "probe", "expected"),
    [
        ({"block_size": 32, "block_size_given": True}, True, 32),  # --block-size: no probe
        ({}, False, BYTE_BLOCK_SIZE),  # built without the preflight (tests, embedding): the default
    ],
)
async def test_no_probe_when_the_block_size_is_given_or_not_asked_for(
    overrides: dict[str, object], probe: bool, expected: int
) -> None:
    settings = _settings(**overrides)
    engines = {"a": Engine(), "b": Engine()}
    async with fleet(engines) as client:
        chosen = await build_analyzer(settings, build_policy(settings, time.monotonic), client, probe=probe)
    assert chosen.block_size == expected and chosen.bytes_per_token is None
    assert engines["a"].posts == engines["b"].posts == []
    assert _initial_ratio(fallback_settings(settings, chosen)) == BYTES_PER_TOKEN


async def test_workers_without_usage_keep_the_default_and_the_prior() -> None:
    settings = _settings()
    async with fleet({"a": Engine(tokens=None), "b": Engine(tokens=None)}) as client:
        chosen = await build_analyzer(settings, build_policy(settings, time.monotonic), client, probe=True)
    assert chosen.block_size == BYTE_BLOCK_SIZE and chosen.bytes_per_token is None
    assert _initial_ratio(fallback_settings(settings, chosen)) == BYTES_PER_TOKEN


async def test_an_exact_tokenizer_is_never_probed() -> None:
    settings = _settings(tokenizer="bytes")
    engines = {"a": Engine(), "b": Engine()}
    async with fleet(engines) as client:
        chosen = await build_analyzer(settings, build_policy(settings, time.monotonic), client, probe=True)
    assert not chosen.approximate_only and chosen.block_size == settings.block_size
    assert engines["a"].posts == []
    assert _initial_ratio(fallback_settings(settings, chosen)) == 1.0
