"""Gateway settings: frozen values parsed once from the CLI namespace, validated at startup.

The layering of sources (defaults < YAML < ``KVGATE_*`` < flags) is done by ``kvgate.cli``; this module
turns the merged namespace into typed values and rejects bad ones with a ``ConfigError`` that says what
to change. Nothing here reads the environment.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

import yaml

from gateway.errors import ConfigError
from policies.api import Role

DEFAULT_POLICY = "prefix_cache_aware"


#: Worker ids travel in response headers (``x-kvgate-worker``): printable ASCII, no spaces.
_HEADER_SAFE: Final = re.compile(r"[!-~]{1,128}")
#: ``engine=`` values a worker URL accepts (``gateway.engines.profiles.EngineKind``)
ENGINE_NAMES: Final = ("auto", "kvgate", "vllm", "sglang", "trtllm", "tgi", "lmdeploy", "mii", "openai")
_FRAGMENT_KEYS: Final = frozenset({"role", "id", "events", "engine", "model", "kv_tokens", "prefix_cache"})

#: Half-life of the recent routed load that policies read (``gateway.state.recent``).
DEFAULT_HALF_LIFE_S: Final = 30.0
DEFAULT_BLOCK_SIZE: Final = 16
#: the byte fallback's block: about one 16-token engine block of English text in bytes
BYTE_BLOCK_SIZE: Final = 64


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """Thresholds of the balancer (``--role-pools "ratio=2,dwell_s=10,…"``; ``off`` disables it)."""

    enabled: bool = True
    ratio: float = 2.0
    min_pressure: float = 1.0
    dwell_s: float = 10.0
    prefill_slots: float = 2.0
    decode_slots: float = 16.0
    min_pool: int = 1
    interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.ratio < 1 or self.min_pressure <= 0 or self.dwell_s < 0 or self.interval_s <= 0:
            raise ValueError("role pools: ratio >= 1, min_pressure > 0, dwell_s >= 0, interval_s > 0")
        if self.prefill_slots <= 0 or self.decode_slots <= 0 or self.min_pool < 1:
            raise ValueError("role pools: slots must be > 0 and min_pool >= 1")


def parse_pool_settings(spec: str) -> PoolSettings:
    """``"off"``, ``"on"``/``"auto"``/``""`` (defaults) or ``"key=value,…"`` over ``PoolSettings``' fields.

    Raises:
        ValueError: an unknown key or a bad value.
    """
    spec = spec.strip()
    if spec == "off":
        return PoolSettings(enabled=False)
    if spec in ("", "on", "auto"):
        return PoolSettings()
    types = {f.name: f.type for f in fields(PoolSettings) if f.name != "enabled"}
    values: dict[str, Any] = {}
    for item in spec.split(","):
        key, _, raw = item.partition("=")
        key = key.strip()
        if key not in types:
            raise ValueError(f"role pools: unknown setting {key!r}; known: {', '.join(sorted(types))}")
        values[key] = int(raw) if types[key] == "int" else float(raw)
    return PoolSettings(**values)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """A worker to route to: stable id, base URL (no trailing slash) and role."""

    id: str
    url: str
    role: Role = Role.BOTH
    #: a foreign engine's ZMQ KV-event publisher (``tcp://HOST:PORT``); None: discovered from the engine
    #: (vLLM ``/kv_event_sources``, kvgate's SSE ``/kv/events``, TensorRT-LLM's ``/kv_cache_events``)
    events: str | None = None
    #: the engine behind the URL (``ENGINE_NAMES``); ``auto``: detected from what the server answers
    engine: str = "auto"
    model: str | None = None  # model id to hash this engine's prompts with (default: its served model)
    #: the engine's KV capacity in tokens when it cannot tell (``#kv_tokens=``); None: learned or default
    kv_tokens: int | None = None
    #: prefix reuse on the engine, when the operator knows better than detection (``#prefix_cache=on|off``)
    prefix_cache: bool | None = None


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Upstream deadlines in seconds: connect, time to first body byte, and gap between stream chunks."""

    connect_s: float = 2.0
    ttfb_s: float = 60.0
    idle_s: float = 30.0


#: open upstream connections per worker that advertises no running slots (``max_running`` in ``/load``)
DEFAULT_UPSTREAM_CONNECTIONS: Final = 256


@dataclass(frozen=True, slots=True)
class UpstreamLimits:
    """Bounds on the proxy's upstream connections, per worker (``--upstream-*``).

    Attributes:
        max_connections: open connections (in use + idle) per worker; None (``auto``): the worker's running
            slots as its ``/load`` advertises them (``max_running``), else ``DEFAULT_UPSTREAM_CONNECTIONS``.
        max_waiting: requests that may wait for a connection per worker beyond those the cap still lets
            connect; more are shed at once with 503 + ``Retry-After``.
        queue_timeout_s: the longest wait for a connection (at most half the first-byte deadline, so a
            request that got one still has time to be answered); then 503 + ``Retry-After``.
        max_connecting: connects in flight per worker (a burst is paced, not stampeded).
    """

    max_connections: int | None = None
    max_waiting: int = 1024
    queue_timeout_s: float = 30.0
    max_connecting: int = 16

    def __post_init__(self) -> None:
        if self.max_connections is not None and self.max_connections < 1:
            raise ConfigError(f"--upstream-max-connections must be >= 1 or auto (got {self.max_connections})")
        if self.max_waiting < 0:
            raise ConfigError(f"--upstream-max-waiting must be >= 0 (got {self.max_waiting})")
        if self.queue_timeout_s <= 0 or self.max_connecting < 1:
            raise ConfigError("--upstream-queue-timeout-s must be > 0 (and max_connecting >= 1)")

    def cap(self, max_running: int) -> int:
        """The connection cap of a worker that advertises ``max_running`` slots (0: it does not)."""
        if self.max_connections is not None:
            return self.max_connections
        return max_running if max_running > 0 else DEFAULT_UPSTREAM_CONNECTIONS

    def wait_s(self, ttfb_s: float) -> float:
        """The longest wait for a connection under a first-byte deadline of ``ttfb_s``."""
        return min(self.queue_timeout_s, ttfb_s / 2)


_UPSTREAM: Final = UpstreamLimits()


def parse_connections(raw: str) -> int | None:
    """``--upstream-max-connections``: ``auto`` (None) or a positive count.

    Raises:
        argparse.ArgumentTypeError: neither (argparse prints the message).
    """
    text = str(raw).strip().lower()
    if text in ("auto", ""):
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be auto or a count >= 1 (got {raw!r})")
    return int(text)


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """Retries on another worker before the first byte reached the client."""

    retries: int = 2
    backoff_base_s: float = 0.01
    backoff_max_s: float = 0.2


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """Per-worker circuit breaker: open after ``failures`` in a row, probe again after ``open_s``."""

    failures: int = 3
    open_s: float = 5.0


DEFAULT_INLINE_BYTES = 256 * 1024
DEFAULT_MAX_CONTAINERS = 65_536
DEFAULT_MAX_WAITING = 8
#: the prompt prefix routing weighs, in tokens (``gateway.routing.router.Router``'s ``max_blocks``)
DEFAULT_MAX_PREFIX_TOKENS = 131_072


@dataclass(frozen=True, slots=True)
class OffloadLimits:
    """``inline_bytes``: bodies up to this size are handled on the loop; ``max_containers``: JSON objects and
    arrays a larger body may hold; ``max_waiting``: large bodies waiting for the analysis thread;
    ``threads``: analysis threads."""

    inline_bytes: int = DEFAULT_INLINE_BYTES
    max_containers: int = DEFAULT_MAX_CONTAINERS
    max_waiting: int = DEFAULT_MAX_WAITING
    threads: int = 1

    def __post_init__(self) -> None:
        if min(self.inline_bytes, self.max_containers, self.threads) < 1 or self.max_waiting < 0:
            raise ValueError("offload limits must be positive (max_waiting may be 0)")


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the gateway needs to start."""

    host: str = "127.0.0.1"
    port: int = 8000
    workers: tuple[WorkerSpec, ...] = ()
    policy: str | Mapping[str, Any] = DEFAULT_POLICY
    state_url: str = "memory"
    recent_half_life_s: float = DEFAULT_HALF_LIFE_S  # decay of the recent routed load policies read
    tokenizer: str = "auto"
    block_size: int = DEFAULT_BLOCK_SIZE
    block_size_given: bool = False  # --block-size was given (else the byte fallback's block is probed)
    exact_tokens: bool = True  # the gateway's tokens are the engines' (false once the byte fallback stands)
    #: with the byte fallback, bytes per engine token as the start-up probe learned it (None: not learned)
    bytes_per_token: float | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    #: bodies above ``offload.inline_bytes``: parsed and analysed off the loop (``gateway.analyze.offload``)
    offload: OffloadLimits = field(default_factory=OffloadLimits)
    #: a prompt's prefix that routing looks up and records, in tokens (``Router``'s ``max_blocks``)
    max_prefix_tokens: int = DEFAULT_MAX_PREFIX_TOKENS
    max_tokens_limit: int = 1_000_000
    timeouts: Timeouts = field(default_factory=Timeouts)
    retry: RetrySettings = field(default_factory=RetrySettings)
    upstream: UpstreamLimits = field(default_factory=UpstreamLimits)
    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    health_interval_s: float = 1.0
    role_pools: str = "auto"  # gateway.fleet.pools: off | auto (under a PD policy) | on | key=value,…
    #: auto (per worker: precise where KV events flow, approximate where none do) | precise | approximate
    kv_index: str = "auto"
    engine_load: bool = True  # read each engine's own load signal (off: the gateway's in-flight count only)
    log_level: str = "warning"
    #: how long the gateway remembers which worker stored a Responses API response (``previous_response_id``)
    response_ttl_s: float = 24 * 3600.0
    response_max_entries: int = 100_000  # per replica (the Redis record is bounded by the TTL)


def parse_worker(raw: str) -> WorkerSpec:
    """Parse ``URL[#role=prefill|decode|both][&id=NAME][&engine=E][&events=tcp://H:P][&model=M]
    [&kv_tokens=N][&prefix_cache=on|off]``.

    ``engine`` names the server behind the URL (``ENGINE_NAMES``; ``auto``, the default, detects it).
    ``events`` points at a ZMQ KV-event publisher (vLLM, SGLang, TensorRT-LLM) when the engine does not say
    where it publishes; the gateway follows those events, re-hashed into kvgate's scheme.

    Raises:
        ConfigError: the URL is not http(s), or a fragment key or value is unknown or malformed.
    """
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"worker URL {raw!r} must look like http://HOST:PORT[#role=prefill|decode|both]")
    frag = {k: v[-1] for k, v in parse_qs(parts.fragment).items()}
    unknown = set(frag) - _FRAGMENT_KEYS
    if unknown:
        raise ConfigError(
            f"worker URL {raw!r}: unknown fragment key(s) {sorted(unknown)}; "
            f"known: {', '.join(sorted(_FRAGMENT_KEYS))}"
        )
    try:
        role = Role(frag.get("role", "both"))
    except ValueError:
        raise ConfigError(f"worker URL {raw!r}: role must be one of prefill, decode, both") from None
    url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
    events, engine, model = frag.get("events"), frag.get("engine", "auto"), frag.get("model")
    if events is not None and not events.startswith(("tcp://", "ipc://")):
        raise ConfigError(f"worker URL {raw!r}: events= needs a tcp:// or ipc:// ZMQ address")
    if engine not in ENGINE_NAMES:
        raise ConfigError(f"worker URL {raw!r}: engine must be one of {', '.join(ENGINE_NAMES)}")
    kv_tokens: int | None = None
    if "kv_tokens" in frag:
        try:
            kv_tokens = int(frag["kv_tokens"])
        except ValueError:
            kv_tokens = 0
        if kv_tokens <= 0:
            raise ConfigError(f"worker URL {raw!r}: kv_tokens must be a positive integer")
    prefix_cache: bool | None = None
    if "prefix_cache" in frag:
        if frag["prefix_cache"] not in ("on", "off"):
            raise ConfigError(f"worker URL {raw!r}: prefix_cache must be on or off")
        prefix_cache = frag["prefix_cache"] == "on"
    wid = frag.get("id") or parts.netloc + parts.path.rstrip("/")
    if not _HEADER_SAFE.fullmatch(wid):  # it is sent back in the x-kvgate-worker response header
        raise ConfigError(f"worker URL {raw!r}: the id must be 1-128 printable ASCII characters, no spaces")
    return WorkerSpec(
        id=wid, url=url, role=role, events=events, engine=engine, model=model, kv_tokens=kv_tokens,
        prefix_cache=prefix_cache,
    )  # fmt: skip


def _policy_spec(name: str, config_file: str | None) -> str | Mapping[str, Any]:
    if not config_file:
        return name
    try:
        with open(config_file, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read policy config {config_file!r}: {exc}") from exc
    if isinstance(data, Mapping) and isinstance(data.get("policy"), Mapping | str):
        data = data["policy"]
    if not isinstance(data, Mapping | str):
        raise ConfigError(f"policy config {config_file!r} must hold a mapping (type: …, params: …)")
    return data


def _positive(name: str, value: float) -> float:
    if value <= 0:
        raise ConfigError(f"--{name.replace('_', '-')} must be > 0 (got {value})")
    return value


def from_args(args: argparse.Namespace) -> Settings:
    """Build validated ``Settings`` from the ``kvgate gateway`` namespace.

    Raises:
        ConfigError: a value is out of range or malformed.
    """
    workers = _unique(parse_worker(w) for w in (args.worker or ()))
    if args.retries < 0:
        raise ConfigError("--retries must be >= 0")
    if args.block_size is not None and args.block_size <= 0:
        raise ConfigError("--block-size must be > 0")
    if args.state != "memory" and not args.state.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"--state {args.state!r} is not understood; use 'memory' or 'redis://HOST:PORT/DB'")
    return Settings(
        host=args.host,
        port=args.port,
        workers=workers,
        policy=_policy_spec(args.policy, args.policy_config),
        state_url=args.state,
        recent_half_life_s=_positive(
            "recent_half_life_s", getattr(args, "recent_half_life_s", DEFAULT_HALF_LIFE_S)
        ),
        tokenizer=args.tokenizer,
        block_size=args.block_size or DEFAULT_BLOCK_SIZE,
        block_size_given=args.block_size is not None,
        max_body_bytes=int(_positive("max_body_bytes", args.max_body_bytes)),
        offload=_offload(args),
        max_prefix_tokens=int(
            _positive("max_prefix_tokens", getattr(args, "max_prefix_tokens", DEFAULT_MAX_PREFIX_TOKENS))
        ),
        timeouts=Timeouts(
            connect_s=_positive("connect_timeout_s", args.connect_timeout_s),
            ttfb_s=_positive("ttfb_timeout_s", args.ttfb_timeout_s),
            idle_s=_positive("idle_timeout_s", args.idle_timeout_s),
        ),
        retry=RetrySettings(retries=args.retries),
        upstream=UpstreamLimits(
            max_connections=getattr(args, "upstream_max_connections", None),
            max_waiting=getattr(args, "upstream_max_waiting", _UPSTREAM.max_waiting),
            queue_timeout_s=getattr(args, "upstream_queue_timeout_s", _UPSTREAM.queue_timeout_s),
        ),
        health_interval_s=_positive("health_interval_s", args.health_interval_s),
        role_pools=_role_pools(getattr(args, "role_pools", "auto")),
        kv_index=_kv_index(getattr(args, "kv_index", "auto")),
        engine_load=getattr(args, "engine_load", "on") == "on",
        log_level=args.log_level,
        response_ttl_s=_positive("response_ttl_s", getattr(args, "response_ttl_s", 24 * 3600.0)),
        response_max_entries=int(
            _positive("response_max_entries", getattr(args, "response_max_entries", 100_000))
        ),
    )


def _kv_index(mode: str) -> str:
    if mode not in ("auto", "precise", "approximate"):
        raise ConfigError(f"--kv-index {mode!r} is not understood; use 'auto', 'precise' or 'approximate'")
    return mode


def _role_pools(spec: str) -> str:
    try:
        parse_pool_settings(spec)
    except ValueError as exc:
        raise ConfigError(f"--role-pools: {exc}") from None
    return spec


def _unique(specs: Sequence[WorkerSpec] | Any) -> tuple[WorkerSpec, ...]:
    out: dict[str, WorkerSpec] = {}
    for spec in specs:
        if spec.id in out:
            raise ConfigError(f"worker id {spec.id!r} is given twice; give each a distinct URL or #id=")
        out[spec.id] = spec
    return tuple(out.values())


def _offload(args: argparse.Namespace) -> OffloadLimits:
    try:
        return OffloadLimits(
            inline_bytes=getattr(args, "analyze_inline_bytes", DEFAULT_INLINE_BYTES),
            max_containers=getattr(args, "max_body_objects", DEFAULT_MAX_CONTAINERS),
        )
    except ValueError:
        raise ConfigError("--analyze-inline-bytes and --max-body-objects must be positive") from None
