"""Tokenizer parity self-test: does the gateway tokenize probe prompts exactly as a worker does?

A mismatch (another tokenizer, chat template or special-token handling) makes every predicted prefix hit
wrong, so the gateway runs this at start-up and refuses precise KV-aware routing, loudly, when it fails.
The worker side depends on its engine (``ParityTarget.route``, from the engine profile):

- ``tokenize`` (kvgate, vLLM): ``POST /tokenize`` with ``{"messages": [...]}`` (plus ``tools``) or
  ``{"prompt": "..."}``, answering ``{"tokens": [...], "count": n}``;
- ``v1_tokenize`` (SGLang): ``POST /v1/tokenize``, the same body and answer;
- ``chat_tokenize`` (TGI): ``POST /chat_tokenize`` with a whole chat request (``model`` ``"tgi"``: any other
  name is taken as a LoRA adapter), answering ``{"tokenize_response": [{"id", …}], "templated_text"}``. Text
  probes are skipped there: TGI's ``/tokenize`` always adds special tokens, so it cannot match a prompt;
- ``none`` (TensorRT-LLM, LMDeploy, MII, generic servers): no messages-level probe; the report says so and
  counts as neither a pass nor a mismatch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx
import orjson

from gateway.analyze.prompt import TokenizingAnalyzer
from gateway.engines.profiles import EngineKind, ParityRoute, profile_of
from kvgate_core.tokenize.bundle import TokenizerBundle
from kvgate_core.tokenize.request_prompt import Endpoint, parse_prompt

_TIMEOUT_S: Final = 5.0
_PATHS: Final[dict[ParityRoute, str]] = {
    "tokenize": "/tokenize",
    "v1_tokenize": "/v1/tokenize",
    "chat_tokenize": "/chat_tokenize",
}


@dataclass(frozen=True, slots=True)
class ParityTarget:
    """A worker to check, and how its engine tokenizes on request (``route``; ``engine`` names it)."""

    url: str
    route: ParityRoute = "tokenize"
    engine: str = "kvgate"

    @classmethod
    def of(cls, url: str, kind: EngineKind) -> ParityTarget:
        """The target for a worker of ``kind``; an undetected (``auto``) one is tried on ``/tokenize``."""
        if kind is EngineKind.AUTO:
            return cls(url, "tokenize", str(kind))
        return cls(url, profile_of(kind).parity_route, str(kind))


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
    """The outcome of one probe: equal ids, different ids, an error (the worker or local side failed), or
    skipped (``skipped`` says why: the engine's route cannot answer this kind of probe comparably)."""

    probe: str
    local: tuple[int, ...] = ()
    remote: tuple[int, ...] = ()
    error: str | None = None
    skipped: str | None = None

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
    """Parity of one worker: ``ok`` when every probe it could answer produced the same ids on both sides;
    ``skipped`` (and not ok) when its engine has no probe at all."""

    worker_url: str
    results: tuple[ProbeResult, ...]
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return self.skipped is None and all(r.matches for r in self.results)

    @property
    def mismatches(self) -> tuple[ProbeResult, ...]:
        """Probes where both sides answered and disagreed (a real tokenizer/template mismatch)."""
        return tuple(r for r in self.results if r.error is None and not r.matches)

    @property
    def errors(self) -> tuple[ProbeResult, ...]:
        return tuple(r for r in self.results if r.error is not None)

    def summary(self) -> str:
        """One line for logs."""
        if self.skipped is not None:
            return f"{self.worker_url}: tokenizer parity not checked ({self.skipped})"
        if self.ok:
            passed = sum(1 for r in self.results if r.skipped is None)
            skipped = len(self.results) - passed
            return f"{self.worker_url}: tokenizer parity ok ({passed} probes" + (
                f", {skipped} skipped)" if skipped else ")"
            )
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
    route: ParityRoute = "tokenize",
    engine: str = "kvgate",
) -> ParityReport:
    """Tokenize ``probes`` locally and through the worker's ``route`` (``engine`` names it in reports) and
    compare the ids."""
    if route == "none":
        return ParityReport(worker_url, (), skipped=f"no probe for {engine}")
    bundle = (
        analyzer_or_bundle.bundle
        if isinstance(analyzer_or_bundle, TokenizingAnalyzer)
        else analyzer_or_bundle
    )
    base = worker_url.split("#", 1)[0].rstrip("/")
    results = await asyncio.gather(*(_probe(bundle, base, client, p, route, timeout_s) for p in probes))
    return ParityReport(worker_url, tuple(results))


def _remote_body(route: ParityRoute, probe: ParityProbe) -> dict[str, Any] | str:
    """The request body for ``route``, or why this probe is skipped there."""
    if route != "chat_tokenize":
        return dict(probe.body)
    if probe.endpoint is not Endpoint.CHAT:
        return "TGI tokenizes text only through /tokenize, which always adds special tokens"
    return {"model": "tgi", **probe.body}


def _remote_tokens(route: ParityRoute, content: bytes) -> tuple[int, ...]:
    """The ids in a tokenize answer. Raises ``KeyError``/``TypeError``/``ValueError`` when it has none."""
    doc = orjson.loads(content)
    if route == "chat_tokenize":
        return tuple(int(t["id"]) for t in doc["tokenize_response"])
    return tuple(int(t) for t in doc["tokens"])


async def _probe(
    bundle: TokenizerBundle,
    base: str,
    client: httpx.AsyncClient,
    probe: ParityProbe,
    route: ParityRoute,
    timeout_s: float,
) -> ProbeResult:
    body = _remote_body(route, probe)
    if isinstance(body, str):
        return ProbeResult(probe.name, skipped=body)
    try:
        local = tuple(bundle.encode(parse_prompt(probe.body, probe.endpoint)))
    except ValueError as exc:
        return ProbeResult(probe.name, error=f"local tokenization failed: {exc}")
    path = _PATHS[route]
    try:
        resp = await client.post(f"{base}{path}", json=body, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return ProbeResult(probe.name, local, error=f"POST {path} failed: {exc!r}")
    if resp.status_code != 200:
        return ProbeResult(probe.name, local, error=f"POST {path} answered {resp.status_code}")
    try:
        remote = _remote_tokens(route, resp.content)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        field = "tokenize_response" if route == "chat_tokenize" else "tokens"
        return ProbeResult(probe.name, local, error=f"POST {path} answered without a '{field}' array")
    return ProbeResult(probe.name, local, remote)
