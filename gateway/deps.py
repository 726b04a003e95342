"""``Deps``: every long-lived object of one gateway, built once by ``open_deps`` inside the lifespan.

Resources are entered on one ``AsyncExitStack`` so they close in reverse order. Tests replace parts with
``DepsOverrides`` (a fake policy, analyzer, KV service or state) through ``create_app(settings, deps=…)``.
Background loops (health checks) are started by the lifespan in ``gateway.app``, not here.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from gateway.analyze.analyzer import PromptAnalyzer
from gateway.analyze.factory import TokenizerChoice, analyzer_for, resolve_tokenizer
from gateway.analyze.offload import LargeBodyOffload
from gateway.engines.block_probe import probe_byte_block
from gateway.errors import ConfigError
from gateway.feeds import EventFollower, FeedHooks, FeedRunner, detect_fleet
from gateway.fleet.health import HealthChecker
from gateway.fleet.pools import PoolBalancer, build_balancer
from gateway.fleet.registry import Fleet, WorkerRecord
from gateway.kvindex.approximate import ApproximateIndexConfig
from gateway.kvindex.capacity import BYTES_PER_TOKEN, CapacityConfig, TokenUnits
from gateway.kvindex.feedback import PrefixFeedback
from gateway.kvindex.index import KVIndex
from gateway.kvindex.service import KVServiceConfig, open_kv_service
from gateway.observability.metrics import Metrics
from gateway.proxy.forward import Proxy
from gateway.proxy.sticky import ResponseAffinity
from gateway.proxy.upstream import UpstreamQueue, open_upstream
from gateway.routing.parity_gate import parity_reports, parity_targets, refuse_precise
from gateway.routing.router import Router
from gateway.settings import BYTE_BLOCK_SIZE, DEFAULT_BLOCK_SIZE, Settings, WorkerSpec, parse_pool_settings
from gateway.state.factory import open_state
from gateway.state.lag import LagRecorder
from gateway.state.protocols import LoadBoard, State
from gateway.state.recent import RecentConfig
from gateway.state.redis import RedisLoadBoard
from gateway.state.redis_client import is_redis_url
from gateway.state.response_owners import (
    MemoryResponseOwners,
    OwnersConfig,
    RedisResponseOwners,
    ResponseOwners,
)
from kvgate_core.h1 import H1Getter, H1Pool
from kvgate_core.tokenize.bundle import byte_bundle
from policies.api import Need, Policy, PolicyContext
from policies.registry import build_policy as build_registered_policy

logger = logging.getLogger(__name__)


class KVService(FeedRunner, TokenUnits, Protocol):
    """What the gateway uses of the KV service (``gateway.kvindex.service``)."""

    @property
    def index(self) -> KVIndex: ...

    @property
    def degraded(self) -> bool: ...

    def replica_lags(self) -> dict[str, LagRecorder]: ...

    def remove_worker(self, worker_id: str) -> None: ...

    def feed_status(self, worker_id: str) -> dict[str, Any] | None: ...

    def units_status(self, worker_id: str) -> dict[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class DepsOverrides:
    """Parts to use instead of building them from settings (tests, embedding)."""

    policy: Policy | None = None
    analyzer: PromptAnalyzer | None = None
    kv_service: KVService | None = None
    state: State | None = None
    clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True, slots=True)
class Deps:
    """The gateway's dependencies; handlers reach them through ``request.app.state.deps``."""

    settings: Settings
    state: State
    control: httpx.AsyncClient
    upstream: H1Pool
    policy: Policy
    analyzer: PromptAnalyzer | None
    kv: KVService | None
    fleet: Fleet
    router: Router
    proxy: Proxy
    health: HealthChecker
    metrics: Metrics
    pools: PoolBalancer | None = None  # PD role pools (``--role-pools``)
    follower: EventFollower | None = None  # starts each worker's KV-event feed once its engine is known
    #: parses and analyses large bodies off the event loop (``gateway.analyze.offload``)
    offload: LargeBodyOffload = field(default_factory=LargeBodyOffload)

    def on_worker_added(self, record: WorkerRecord, spec: WorkerSpec | None = None) -> None:
        """A worker registered at run time: once its health probe has detected its engine, its KV events are
        followed (``gateway.feeds``; ``spec`` carries an explicit ``#events=``/``#model=``)."""
        if self.follower is not None and spec is not None:
            self.follower.on_added(record, spec)

    def on_worker_removed(self, worker_id: str) -> None:
        if self.kv is not None:
            self.kv.remove_worker(worker_id)


def build_policy(settings: Settings, clock: Callable[[], float], load: LoadBoard | None = None) -> Policy:
    """The configured policy from the registry (built-ins plus ``kvgate.policies`` entry points); ``load``
    tells it how many gateway replicas share the state and which one this is (none: a lone gateway).

    Raises:
        ConfigError: the policy is unknown or its parameters are wrong (the message lists what exists).
    """
    # Seeded per process: replicas sharing one seed would break ties identically and herd.
    ctx = PolicyContext(clock=clock, rng=random.Random(), block_size=settings.block_size)
    if load is not None:
        ctx = dataclasses.replace(ctx, replicas=load.replicas, replica_rank=load.rank)
    try:
        policy = build_registered_policy(settings.policy, ctx)
    except ValueError as exc:
        raise ConfigError(f"--policy: {exc}") from exc
    return policy


@dataclass(frozen=True, slots=True)
class AnalyzerChoice:
    """The analyzer the policy gets, and whether it is the fallback that only the approximate index suits."""

    analyzer: PromptAnalyzer | None
    approximate_only: bool = False
    block_size: int = DEFAULT_BLOCK_SIZE  # the block size the analyzer hashes in
    #: the byte fallback's bytes per engine token, learned by the start-up probe (None: not learned)
    bytes_per_token: float | None = None


async def build_analyzer(
    settings: Settings, policy: Policy, client: httpx.AsyncClient, *, probe: bool = False
) -> AnalyzerChoice:
    """The prompt analyzer when the policy needs tokens or block hashes (else none).

    With ``--tokenizer auto`` this never fails: when no worker serves its tokenizer (``GET /tokenizer``) or
    names a readable model directory (``/v1/models``), the byte tokenizer stands in, routing on the
    approximate index, and one WARNING line says what precise routing would need. Its block size is
    ``--block-size`` when given, else (with ``probe``) one engine block in bytes as the workers tell it
    (``gateway.engines.block_probe``), else ``BYTE_BLOCK_SIZE``.

    Raises:
        ConfigError: the policy needs tokens but ``--tokenizer none`` was given, or an explicit tokenizer
            path cannot be loaded.
    """
    if not policy.needs & {Need.TOKENS, Need.BLOCK_HASHES}:
        return AnalyzerChoice(None)
    if settings.tokenizer == "none":
        raise ConfigError(f"policy {policy.name!r} needs prompt tokens; give --tokenizer auto|bytes|PATH")
    try:
        choice = await resolve_tokenizer(
            settings.tokenizer, worker_urls=[w.url for w in settings.workers], client=client
        )
    except ValueError as exc:
        raise ConfigError(f"--tokenizer: {exc}") from None
    if choice.bundle is not None:
        return AnalyzerChoice(
            analyzer_for(choice, block_size=settings.block_size),
            approximate_only=not choice.exact,
            block_size=settings.block_size,
        )
    block_size, ratio, how = await _byte_block(settings, client, probe)
    logger.warning(
        "no exact tokenizer (%s): routing cache-aware on the byte tokenizer with the approximate index "
        "(%d-byte blocks); for precise routing on the engines' KV events give --tokenizer PATH (the "
        "engine's tokenizer.json or model directory, readable by the gateway); byte block: %s",
        choice.source, block_size, how,
    )  # fmt: skip
    fallback = TokenizerChoice(byte_bundle(), "byte tokenizer (fallback)", exact=False)
    return AnalyzerChoice(
        analyzer_for(fallback, block_size=block_size), approximate_only=True, block_size=block_size,
        bytes_per_token=ratio,
    )  # fmt: skip


async def _byte_block(
    settings: Settings, client: httpx.AsyncClient, probe: bool
) -> tuple[int, float | None, str]:
    """The byte fallback's block size, the bytes per engine token learned (or None), and how it was chosen."""
    if settings.block_size_given:
        return settings.block_size, None, "--block-size"
    if not probe or not settings.workers:
        return BYTE_BLOCK_SIZE, None, "the default"
    learned = await probe_byte_block(settings.workers, client, default=BYTE_BLOCK_SIZE)
    return learned.size, learned.bytes_per_token, learned.describe()


def fallback_settings(settings: Settings, chosen: AnalyzerChoice) -> Settings:
    """The settings to serve with once the analyzer is chosen: with only the byte fallback, the approximate
    index, the fallback's block size and the bytes per engine token learned at start."""
    if not chosen.approximate_only:
        return settings
    if settings.kv_index != "approximate":
        logger.warning("KV index: approximate (the gateway's tokens are not the engines')")
    return dataclasses.replace(
        settings, kv_index="approximate", block_size=chosen.block_size, exact_tokens=False,
        bytes_per_token=chosen.bytes_per_token,
    )  # fmt: skip


async def preflight(settings: Settings) -> tuple[Settings, DepsOverrides]:
    """What start-up can get wrong, checked before the server binds its port: the policy, the state URL,
    the role pools and the tokenizer (which ``auto`` resolves here, once, from the workers).

    Returns:
        the settings to serve with (the KV index turned approximate when no exact tokenizer was found) and
        the analyzer to use, so the app's lifespan does not resolve it again.

    Raises:
        ConfigError: one line that says what is wrong.
    """
    if settings.state_url != "memory" and not is_redis_url(settings.state_url):
        raise ConfigError(
            f"--state {settings.state_url!r} is not understood; use 'memory' or 'redis://HOST:PORT/DB'"
        )
    policy = build_policy(settings, time.monotonic)
    try:
        parse_pool_settings(settings.role_pools)
    except ValueError as exc:
        raise ConfigError(f"--role-pools: {exc}") from None
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, connect=settings.timeouts.connect_s)) as client:
        chosen = await build_analyzer(settings, policy, client, probe=True)
    return fallback_settings(settings, chosen), DepsOverrides(analyzer=chosen.analyzer)


def _open_kv(
    settings: Settings,
    client: httpx.AsyncClient,
    clock: Callable[[], float],
    state: State,
    hooks: FeedHooks | None = None,
) -> AbstractAsyncContextManager[KVService]:
    """The KV service; with Redis state its backplane runs on the state's one Redis client."""
    config = KVServiceConfig(
        approximate=ApproximateIndexConfig() if settings.kv_index == "approximate" else None,
        follow_fleet=settings.kv_index == "auto",
        units=CapacityConfig(initial_ratio=_initial_ratio(settings)),
    )
    cm: AbstractAsyncContextManager[KVService] = open_kv_service(
        state_url=settings.state_url,
        redis=state.redis,
        block_size=settings.block_size,
        client=client,
        clock=clock,
        config=config,
        on_feed_quiet=hooks.on_quiet if hooks is not None else None,
        on_feed_flowing=hooks.on_flowing if hooks is not None else None,
        activity=hooks.activity if hooks is not None else None,
    )
    return cm


def _initial_ratio(settings: Settings) -> float:
    """Gateway tokens per engine token before usage is seen: 1 with the engines' tokenizer; with the byte
    fallback what the start-up probe learned, else ``BYTES_PER_TOKEN``."""
    if settings.exact_tokens:
        return 1.0
    return settings.bytes_per_token or BYTES_PER_TOKEN


def _replica_lags(state: State, kv: KVService | None) -> dict[str, LagRecorder]:
    """The recorders of how late other replicas' changes arrive (none with memory state)."""
    lags: dict[str, LagRecorder] = {}
    if isinstance(state.load, RedisLoadBoard):
        lags["load"] = state.load.lag
    if kv is not None:
        lags.update(kv.replica_lags())
    return lags


@asynccontextmanager
async def open_deps(settings: Settings, overrides: DepsOverrides | None = None) -> AsyncIterator[Deps]:
    """Build every dependency of the gateway; close them in reverse order on exit.

    Raises:
        ConfigError: the configuration cannot work (unknown policy, missing tokenizer, bad state URL).
    """
    ov = overrides or DepsOverrides()
    async with AsyncExitStack() as stack:
        metrics = Metrics()
        state = (
            ov.state
            if ov.state is not None
            else await stack.enter_async_context(
                open_state(settings.state_url, RecentConfig(settings.recent_half_life_s))
            )
        )
        control = await stack.enter_async_context(
            httpx.AsyncClient(timeout=httpx.Timeout(5.0, connect=settings.timeouts.connect_s))
        )
        upstream = await stack.enter_async_context(
            open_upstream(timeouts=settings.timeouts, limits=settings.upstream)
        )
        probes = H1Getter(await stack.enter_async_context(open_upstream(timeouts=settings.timeouts)))
        policy = ov.policy or build_policy(settings, ov.clock, state.load)
        if ov.analyzer is not None:
            analyzer: PromptAnalyzer | None = ov.analyzer
        else:
            chosen = await build_analyzer(settings, policy, control)
            analyzer = chosen.analyzer
            settings, given = fallback_settings(settings, chosen), settings
            if settings.block_size != given.block_size and ov.policy is None:
                policy = build_policy(settings, ov.clock, state.load)  # it scores in the new block size
        fleet = Fleet(breaker=settings.breaker, clock=ov.clock)
        for spec in settings.workers:
            fleet.add(spec)
        hooks = FeedHooks(fleet)
        kv = ov.kv_service
        if kv is None and Need.PREFIX_HITS in policy.needs:
            if settings.kv_index != "approximate":
                await detect_fleet(fleet, probes)  # each engine's parity probe route
                reports = await parity_reports(analyzer, parity_targets(fleet), control)
                if refuse_precise(reports):
                    settings = dataclasses.replace(settings, kv_index="approximate")
            kv = await stack.enter_async_context(_open_kv(settings, control, ov.clock, state, hooks))
        follower = None
        if kv is not None:
            hooks.attach(kv)
            follower = EventFollower(kv, fleet, probes, {s.id: s for s in settings.workers})
            stack.push_async_callback(follower.aclose)
        metrics.attach_fleet(fleet, state.load, (lambda: kv.degraded) if kv is not None else (lambda: False))
        if kv is not None:
            metrics.attach_index(kv.index.num_blocks)
        metrics.attach_replica_lag(_replica_lags(state, kv))
        router = Router(
            fleet=fleet, load=state.load, policy=policy, analyzer=analyzer,
            kv_index=kv.index if kv is not None else None, block_size=settings.block_size, metrics=metrics,
            feedback=PrefixFeedback(metrics.registry) if kv is not None else None,
            upstream_queue=UpstreamQueue(upstream), units=kv,
            max_blocks=-(-settings.max_prefix_tokens // settings.block_size),
        )  # fmt: skip
        owners_config = OwnersConfig(settings.response_max_entries, settings.response_ttl_s)
        owners: ResponseOwners = (
            RedisResponseOwners(state.redis, owners_config, ov.clock)
            if state.redis is not None
            else MemoryResponseOwners(owners_config, ov.clock)
        )
        proxy = Proxy(
            pool=upstream, router=router, load=state.load, metrics=metrics,
            timeouts=settings.timeouts, limits=settings.upstream,
            retry=settings.retry, rng=random.Random(), affinity=ResponseAffinity(owners, fleet, probes),
        )  # fmt: skip
        health = HealthChecker(
            fleet, probes, state.load, interval_s=settings.health_interval_s,
            on_removed=kv.remove_worker if kv is not None else lambda _id: None,
            on_detected=follower.on_detected if follower is not None else lambda _record: None,
            read_load=settings.engine_load,
        )  # fmt: skip
        try:
            pools = build_balancer(
                settings.role_pools, disaggregates=bool(getattr(policy, "disaggregates", False)),
                fleet=fleet, load=state.load, clock=ov.clock,
            )  # fmt: skip
        except ValueError as exc:
            raise ConfigError(f"--role-pools: {exc}") from None
        offload = LargeBodyOffload(settings.offload)
        stack.callback(offload.close)
        yield Deps(
            pools=pools, follower=follower, offload=offload,
            settings=settings, state=state, control=control, upstream=upstream, policy=policy,
            analyzer=analyzer, kv=kv, fleet=fleet, router=router, proxy=proxy, health=health, metrics=metrics,
        )  # fmt: skip
