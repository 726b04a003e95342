"""Tokenizer parity self-test: does the gateway tokenize probe prompts exactly as a worker does?

A mismatch (another tokenizer, chat template or special-token handling) makes every predicted prefix hit
wrong, so the gateway runs this at start-up and refuses precise KV-aware routing, loudly, when it fails.
The worker side is ``POST /tokenize`` with ``{"messages": [...]}`` (plus ``tools``) or ``{"prompt": "..."}``,
answering ``{"tokens": [...], "count": n}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx
import orjson

from gateway.analyze.prompt import TokenizingAnalyzer
from kvgate_core.tokenize.bundle import TokenizerBundle
from kvgate_core.tokenize.request_prompt import Endpoint, parse_prompt

_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class ParityProbe:
    """One probe prompt: a request body (its ``messages``/``tools`` or ``prompt``) and its endpoint."""

    name: str
    endpoint: Endpoint
    body: Mapping[str, Any]


_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}
DEFAULT_PROBES: Final[tuple[ParityProbe, ...]] = (
    ParityProbe("chat", Endpoint.CHAT, {"messages": [{"role": "user", "content": "Hello! How are you?"}]}),
    ParityProbe(
        "multi_turn",
        Endpoint.CHAT,
        {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name 3 primes."},
                {"role": "assistant", "content": "2, 3, 5."},
                {"role": "user", "content": "  And   two more?\n\n"},
            ]
        },
    ),
    ParityProbe(
        "tools", Endpoint.CHAT, {"messages": [{"role": "user", "content": "Weather?"}], "tools": [_TOOL]}
    ),
    ParityProbe("text", Endpoint.COMPLETIONS, {"prompt": "def fib(n):\n    return n if n < 2 else fib(n-1)"}),
    ParityProbe("unicode", Endpoint.COMPLETIONS, {"prompt": "naïve café — 日本語 🎉 x\u00a0y\ttab 12345"}),
)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The outcome of one probe: equal ids, different ids, or an error (the worker or local side failed)."""

    probe: str
    local: tuple[int, ...] = ()
    remote: tuple[int, ...] = ()
    error: str | None = None

    @property
    def matches(self) -> bool:
        return self.error is None and self.local == self.remote

    @property
    def first_difference(self) -> int | None:
        """Index of the first differing token, or None when the ids are equal."""
        if self.local == self.remote:
            return None
        pairs = zip(self.local, self.remote, strict=False)
        return next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(self.local), len(self.remote)))


@dataclass(frozen=True, slots=True)
class ParityReport:
    """Parity of one worker: ``ok`` when every probe produced the same ids on both sides."""

    worker_url: str
    results: tuple[ProbeResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.matches for r in self.results)

    @property
    def mismatches(self) -> tuple[ProbeResult, ...]:
        """Probes where both sides answered and disagreed (a real tokenizer/template mismatch)."""
        return tuple(r for r in self.results if r.error is None and not r.matches)

    @property
    def errors(self) -> tuple[ProbeResult, ...]:
        return tuple(r for r in self.results if r.error is not None)

    def summary(self) -> str:
        """One line for logs."""
        if self.ok:
            return f"{self.worker_url}: tokenizer parity ok ({len(self.results)} probes)"
        parts = [f"{r.probe}: {r.error}" for r in self.errors]
        parts += [f"{r.probe}: differs at token {r.first_difference}" for r in self.mismatches]
        return f"{self.worker_url}: tokenizer parity FAILED ({'; '.join(parts)})"


async def check_parity(
    analyzer_or_bundle: TokenizingAnalyzer | TokenizerBundle,
    worker_url: str,
    client: httpx.AsyncClient,
    probes: Sequence[ParityProbe] = DEFAULT_PROBES,
    *,
    timeout_s: float = _TIMEOUT_S,
) -> ParityReport:
    """Tokenize ``probes`` locally and through ``POST {worker_url}/tokenize`` and compare the ids."""
    bundle = (
        analyzer_or_bundle.bundle
        if isinstance(analyzer_or_bundle, TokenizingAnalyzer)
        else analyzer_or_bundle
    )
    base = worker_url.split("#", 1)[0].rstrip("/")
    results = await asyncio.gather(*(_probe(bundle, base, client, p, timeout_s) for p in probes))
    return ParityReport(worker_url, tuple(results))


async def _probe(
    bundle: TokenizerBundle, base: str, client: httpx.AsyncClient, probe: ParityProbe, timeout_s: float
) -> ProbeResult:
    try:
        local = tuple(bundle.encode(parse_prompt(probe.body, probe.endpoint)))
    except ValueError as exc:
        return ProbeResult(probe.name, error=f"local tokenization failed: {exc}")
    try:
        resp = await client.post(f"{base}/tokenize", json=dict(probe.body), timeout=timeout_s)
    except httpx.HTTPError as exc:
        return ProbeResult(probe.name, local, error=f"POST /tokenize failed: {exc!r}")
    if resp.status_code != 200:
        return ProbeResult(probe.name, local, error=f"POST /tokenize answered {resp.status_code}")
    try:
        tokens = orjson.loads(resp.content)["tokens"]
        remote = tuple(int(t) for t in tokens)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return ProbeResult(probe.name, local, error="POST /tokenize answered without a 'tokens' array")
    return ProbeResult(probe.name, local, remote)
