"""Whether routing for cache affinity can pay off on a worker: the rule behind ``no_affinity_reason``.
Compiled with mypyc (``docs/development.md``: what that rules out).

An engine without a prefix cache (DeepSpeed-MII) or with it switched off (LMDeploy's default, vLLM's
``--no-enable-prefix-caching``, SGLang's ``--disable-radix-cache``) recomputes every prompt whatever worker
gets it, so a predicted prefix hit there is worth nothing: the policy should see no hit and route such a
worker by load. Where the engine cannot say (LMDeploy), the operator can (``#prefix_cache=on``), and so can
the engine's own answers: a response reporting ``cached_tokens > 0`` proves reuse (``note_cached_tokens``).
"""

from __future__ import annotations

from gateway.engines.profiles import EngineFacts, EngineKind

_OFF_FLAGS = {
    EngineKind.VLLM: "--no-enable-prefix-caching",
    EngineKind.SGLANG: "--disable-radix-cache",
    EngineKind.LMDEPLOY: "no --enable-prefix-caching",
}


def affinity_reason(facts: EngineFacts) -> str | None:
    """Why cache affinity cannot pay off on this worker, or None when it can (or may)."""
    kind = facts.kind
    reuse = facts.profile.prefix_reuse
    if kind is EngineKind.AUTO:
        return None
    if reuse == "no":
        return "no prefix cache in DeepSpeed-MII" if kind is EngineKind.MII else f"no prefix cache in {kind}"
    if facts.prefix_reuse is False:
        flag = _OFF_FLAGS.get(kind)
        return f"prefix caching is off on this {kind} server" + (f" ({flag})" if flag else "")
    if reuse == "flag" and facts.prefix_reuse is None:
        return (
            f"prefix caching is off by default in {kind} (--enable-prefix-caching); say #prefix_cache=on "
            "in the worker URL, or a response reporting cached_tokens > 0 turns affinity on"
        )
    return None


def update_affinity(facts: EngineFacts) -> None:
    """Set ``facts.no_affinity_reason`` from what is known now."""
    facts.no_affinity_reason = affinity_reason(facts)


def prefix_reuse_now(facts: EngineFacts) -> bool | None:
    """Whether prefix reuse happens on this worker: known (True/False) or not (None)."""
    if facts.prefix_reuse is not None:
        return facts.prefix_reuse if facts.profile.prefix_reuse != "no" else False
    return {"yes": True, "no": False}.get(facts.profile.prefix_reuse)


def note_cached_tokens(facts: EngineFacts, cached_tokens: int) -> bool:
    """Learn from a response's ``usage.prompt_tokens_details.cached_tokens``: a positive count proves the
    engine reuses prefixes (LMDeploy started with ``--enable-prefix-caching``), so affinity is turned on.

    Returns:
        True when this changed what the gateway knew (the caller may log it once).
    """
    if cached_tokens <= 0 or facts.prefix_reuse is True or facts.profile.prefix_reuse == "no":
        return False
    facts.prefix_reuse = True
    update_affinity(facts)
    return True


#: the server flag that makes an engine report ``cached_tokens`` (docs/engines.md: the engine's source)
CACHED_TOKENS_FLAGS = {
    EngineKind.VLLM: "--enable-prompt-tokens-details",
    EngineKind.SGLANG: "--enable-cache-report",
}


def note_usage(facts: EngineFacts, cached_tokens: int | None) -> str | None:
    """Learn whether the engine reports ``cached_tokens`` from a successful response that carried usage.

    Returns:
        a hint for the log the first time an engine that could report them (behind a server flag) is seen
        not to: without them the predicted-vs-reported feedback and its drift alarm stay silent.
    """
    reported = cached_tokens is not None
    first = facts.reports_cached_tokens is None
    facts.reports_cached_tokens = reported
    if reported or not first or facts.profile.cached_tokens != "flag":
        return None
    flag = CACHED_TOKENS_FLAGS.get(facts.kind)
    how = f"start it with {flag}" if flag else "its server may need a flag for it"
    return f"{facts.kind} reports no cached_tokens in usage: {how} to feed the prefix-hit drift alarm"
