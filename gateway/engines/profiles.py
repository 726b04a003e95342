"""Engine profiles: what kvgate knows about each inference engine it can front, and what it learned.

A profile (``EngineProfile``) is static knowledge about an engine kind, taken from the engine's own source
(the files read: ``docs/engines.md``): where its load signal lives and in which shape, how far its ``/health``
can be trusted, which tokenize route the parity probe can use, whether streams need ``include_usage``
injected, whether ``model`` must be rewritten to the served name, whether prefix reuse can happen at all, its
default block size and how it publishes KV events. ``EngineFacts`` is what the gateway learned about one
running worker (detected kind, served model, block size, KV capacity, event sources), filled by detection
(``gateway.engines.detect``) and the health loop. Both are plain data: the fleet, the proxy, the KV index and
the parity gate read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Literal


class EngineKind(StrEnum):
    """``engine=`` in a worker URL's fragment; ``auto`` detects it from what the server answers."""

    AUTO = "auto"
    KVGATE = "kvgate"
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    TGI = "tgi"
    LMDEPLOY = "lmdeploy"
    MII = "mii"
    OPENAI = "openai"  # any other OpenAI-compatible server: no signal beyond the gateway's own counts


#: The shape of an engine's load endpoint: kvgate's ``/load`` JSON, Prometheus text, SGLang's ``/v1/loads``
#: JSON, the older SGLang's ``/get_load`` JSON list, TensorRT-LLM's draining JSON ``/metrics`` (a list of
#: iteration stats).
LoadFormat = Literal["kvgate", "prometheus", "sglang_loads", "sglang_get_load", "trtllm_json", "none"]
#: How the engine's prompt tokens can be compared with the gateway's: kvgate/vLLM ``POST /tokenize``,
#: SGLang ``POST /v1/tokenize`` (same body), TGI ``POST /chat_tokenize``, or no messages-level probe.
ParityRoute = Literal["tokenize", "v1_tokenize", "chat_tokenize", "none"]
#: Where KV events come from: kvgate's SSE ``/kv/events``, a ZMQ publisher (vLLM, SGLang, TRT-LLM main),
#: TensorRT-LLM's HTTP ``POST /kv_cache_events`` drain, or nowhere.
EventSource = Literal["kvgate", "zmq", "trtllm_http", "none"]
#: Whether usage carries ``prompt_tokens_details.cached_tokens``: always, only behind a server flag, never.
CachedTokens = Literal["always", "flag", "never"]
#: Whether the engine can reuse a cached prefix: yes, only behind a server flag, never.
PrefixReuse = Literal["yes", "flag", "no"]


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Static facts about one engine kind.

    Attributes:
        kind: the engine.
        load_path: GET path of its load signal (None: it has none; the gateway's in-flight count stands in).
            TensorRT-LLM's JSON ``/metrics`` drains a queue: the health loop must be its only reader.
        load_format: how to parse what ``load_path`` answers.
        health_trusted: False where ``/health`` is a static 200 (MII): only failed requests mark it down.
        parity_route: the tokenize probe for the parity gate.
        inject_include_usage: streams get ``stream_options.include_usage`` when the client did not ask (the
            extra usage chunk is dropped before it reaches that client).
        stream_usage: the engine can report usage on a stream at all (MII cannot).
        cached_tokens: whether usage reports ``cached_tokens``.
        rewrite_model: ``model`` must equal the served name exactly (MII: 400 otherwise).
        prefix_reuse: whether routing for cache affinity can pay off on this engine.
        default_block_size: the engine's KV block (page) size in tokens when nothing says otherwise.
        events: where its KV events come from.
        namespace_fields: request fields the engine folds into its cache namespace (hash root).
        fallback_load: where the engine publishes load when ``load_path`` answers 404 there, and its format:
            SGLang before ``/v1/loads``: ``/get_load``; TensorRT-LLM without ``return_perf_metrics`` (no
            ``/prometheus/metrics``): its JSON ``/metrics``.
        load_timeout_s: the load scrape's deadline where the engine answers it slowly by design
            (TensorRT-LLM's JSON ``/metrics`` answers only after 2 s without new iteration stats); None: the
            health probe's.
    """

    kind: EngineKind
    load_path: str | None
    load_format: LoadFormat
    health_trusted: bool
    parity_route: ParityRoute
    inject_include_usage: bool
    stream_usage: bool
    cached_tokens: CachedTokens
    rewrite_model: bool
    prefix_reuse: PrefixReuse
    default_block_size: int
    events: EventSource
    namespace_fields: tuple[str, ...] = ()
    fallback_load: tuple[str, LoadFormat] | None = None
    load_timeout_s: float | None = None


PROFILES: Final[dict[EngineKind, EngineProfile]] = {
    EngineKind.KVGATE: EngineProfile(
        EngineKind.KVGATE, "/load", "kvgate", True, "tokenize", False, True, "always", False, "yes", 16,
        "kvgate", ("lora", "cache_salt"),
    ),
    EngineKind.VLLM: EngineProfile(
        EngineKind.VLLM, "/metrics", "prometheus", True, "tokenize", True, True, "flag", False, "yes", 16,
        "zmq", ("cache_salt",),
    ),
    EngineKind.SGLANG: EngineProfile(
        EngineKind.SGLANG, "/v1/loads?include=core", "sglang_loads", True, "v1_tokenize", True, True, "flag",
        False, "yes", 1, "zmq", ("cache_salt", "extra_key"), fallback_load=("/get_load", "sglang_get_load"),
    ),
    EngineKind.TRTLLM: EngineProfile(
        EngineKind.TRTLLM, "/prometheus/metrics", "prometheus", True, "none", True, True, "always", False,
        "yes", 32, "trtllm_http", ("cache_salt",), fallback_load=("/metrics", "trtllm_json"),
        load_timeout_s=4.0,
    ),
    EngineKind.TGI: EngineProfile(
        EngineKind.TGI, "/metrics", "prometheus", True, "chat_tokenize", True, True, "never", False, "yes", 1,
        "none",
    ),
    EngineKind.LMDEPLOY: EngineProfile(
        EngineKind.LMDEPLOY, "/metrics", "prometheus", True, "none", True, True, "always", False, "flag", 64,
        "none",
    ),
    EngineKind.MII: EngineProfile(
        EngineKind.MII, None, "none", False, "none", False, False, "never", True, "no", 128, "none",
    ),
    EngineKind.OPENAI: EngineProfile(
        EngineKind.OPENAI, None, "none", True, "none", True, True, "flag", False, "yes", 16, "none",
    ),
}  # fmt: skip


def profile_of(kind: EngineKind) -> EngineProfile:
    """The profile of a detected kind (``auto`` before detection: the generic OpenAI profile)."""
    return PROFILES.get(kind, PROFILES[EngineKind.OPENAI])


@dataclass(slots=True)
class EngineFacts:
    """What the gateway learned about one running worker's engine (mutated by detection and the health loop).

    Attributes:
        kind: the detected (or configured) engine; ``auto`` until detection succeeds.
        detected_by: how the kind was found (``"configured"``, ``"/version"``, ``"owned_by=vllm"`` …).
        version: the engine's version when it says.
        served_model: the model name the engine requires in ``model`` (MII), or its first served id.
        model_root: vLLM's ``/v1/models`` ``root`` (a local model directory when it is a readable path).
        block_size: the engine's KV block size in tokens (from its metrics or server info; None: unknown).
        kv_capacity_tokens: its KV cache capacity in tokens (None: unknown).
        prefix_reuse: whether prefix reuse is on (None: unknown; the profile's default applies).
        event_endpoints: ZMQ publisher addresses discovered (vLLM ``/kv_event_sources``), wildcard host
            already replaced by the worker's host.
        load_signal: ``"engine"`` when the last load scrape succeeded, ``"in-flight"`` when the gateway's own
            count stands in (with ``load_note`` saying why).
        load_note: where the load figures come from, or why there are none.
        load_path: the path the load figures are read from now (the profile's, or its ``fallback_load`` once
            that answered instead); None before a read succeeded.
        load_read_at: when (the health checker's monotonic clock) the last read succeeded; None: never.
        no_affinity_reason: set when cache affinity cannot pay off on this worker (policies route it by load).
        reports_cached_tokens: whether its responses carry ``cached_tokens`` (None: not seen yet).
        index_mode: where its prefix hits come from (``gateway.kvindex.hybrid``): ``precise`` (its KV
            events), ``approximate`` (learned from routing) or ``none`` (no index follows it, or not yet).
        events_trusted: False while the worker's KV-event feed is quiet (requests went there and no events
            followed): its indexed blocks are not used for routing until events flow again.
    """

    kind: EngineKind = EngineKind.AUTO
    detected_by: str = ""
    version: str | None = None
    served_model: str | None = None
    model_root: str | None = None
    block_size: int | None = None
    kv_capacity_tokens: int | None = None
    prefix_reuse: bool | None = None
    event_endpoints: tuple[str, ...] = ()
    load_signal: Literal["engine", "in-flight"] = "in-flight"
    load_note: str = "not read yet"
    load_path: str | None = None
    load_read_at: float | None = None
    no_affinity_reason: str | None = None
    events_trusted: bool = True
    reports_cached_tokens: bool | None = None
    index_mode: str = "none"
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def profile(self) -> EngineProfile:
        return profile_of(self.kind)
