"""Whether cache affinity can pay off: MII never, LMDeploy only once prefix caching is known to be on."""

from __future__ import annotations

from gateway.engines.affinity import (
    affinity_reason,
    note_cached_tokens,
    note_usage,
    prefix_reuse_now,
    update_affinity,
)
from gateway.engines.profiles import EngineFacts, EngineKind
from gateway.fleet.registry import Fleet
from gateway.settings import BreakerSettings, parse_worker


def test_mii_has_no_prefix_cache_whatever_is_said() -> None:
    facts = EngineFacts(kind=EngineKind.MII, prefix_reuse=True)
    assert affinity_reason(facts) == "no prefix cache in DeepSpeed-MII"
    assert prefix_reuse_now(facts) is False
    assert not note_cached_tokens(facts, 100)


def test_lmdeploy_is_unknown_until_cached_tokens_prove_reuse() -> None:
    facts = EngineFacts(kind=EngineKind.LMDEPLOY)
    update_affinity(facts)
    assert facts.no_affinity_reason is not None
    assert "off by default in lmdeploy" in facts.no_affinity_reason
    assert prefix_reuse_now(facts) is None
    assert not note_cached_tokens(facts, 0)
    assert facts.no_affinity_reason is not None
    assert note_cached_tokens(facts, 64)
    assert prefix_reuse_now(facts) is True and affinity_reason(facts) is None
    assert not note_cached_tokens(facts, 64)  # learnt once


def test_the_operator_can_say_prefix_caching_is_on_or_off() -> None:
    fleet = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0)
    on = fleet.add(parse_worker("http://a:1#id=a&engine=lmdeploy&prefix_cache=on"))
    off = fleet.add(parse_worker("http://b:1#id=b&engine=vllm&prefix_cache=off"))
    mii = fleet.add(parse_worker("http://c:1#id=c&engine=mii"))
    assert on.facts.no_affinity_reason is None
    assert (
        off.facts.no_affinity_reason
        == "prefix caching is off on this vllm server (--no-enable-prefix-caching)"
    )
    assert mii.facts.no_affinity_reason == "no prefix cache in DeepSpeed-MII"


def test_engines_with_a_prefix_cache_and_undetected_workers_keep_affinity() -> None:
    for kind in (EngineKind.AUTO, EngineKind.KVGATE, EngineKind.VLLM, EngineKind.SGLANG, EngineKind.TGI):
        assert affinity_reason(EngineFacts(kind=kind)) is None


def test_an_engine_that_reports_no_cached_tokens_behind_a_flag_gets_one_hint() -> None:
    vllm = EngineFacts(kind=EngineKind.VLLM)
    hint = note_usage(vllm, None)
    assert hint is not None and "--enable-prompt-tokens-details" in hint
    assert note_usage(vllm, None) is None  # once
    assert vllm.reports_cached_tokens is False
    assert note_usage(vllm, 0) is None and vllm.reports_cached_tokens is True
    sglang = EngineFacts(kind=EngineKind.SGLANG)
    assert "--enable-cache-report" in (note_usage(sglang, None) or "")


def test_engines_that_always_or_never_report_cached_tokens_get_no_hint() -> None:
    for kind in (EngineKind.KVGATE, EngineKind.TRTLLM, EngineKind.LMDEPLOY, EngineKind.TGI, EngineKind.MII):
        facts = EngineFacts(kind=kind)
        assert note_usage(facts, None) is None
        assert facts.reports_cached_tokens is False
