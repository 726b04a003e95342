"""``GET /admin/ui/state``: everything the admin page shows, in one JSON document.

The gateway line (policy, shared state and its sync, the KV index, the prediction drift flag), each worker
as ``GET /admin/workers`` lists it plus its index mode and blocks and its live window (requests/s, TTFT p50,
predicted against reported prefix hits: ``observability.worker_stats``), and the last routing decisions
(``routing.decisions``). Built only when asked: O(workers × window samples + decisions × workers).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from gateway.api.admin_routes import list_workers
from gateway.api.control import AppDeps
from gateway.api.models import WorkerInfo
from gateway.fleet.registry import WorkerRecord
from gateway.kvindex.feedback import PrefixFeedback
from gateway.observability.worker_window import WorkerWindow
from gateway.routing.decisions import RecentDecision


class UiGateway(BaseModel):
    """This gateway replica: its policy, its shared state, its KV index and the prediction drift flag."""

    version: str
    policy: str
    #: ``memory`` (this replica alone) or ``redis`` (replicas share load and KV events through Redis)
    state: str
    replicas: int
    replica_rank: int
    #: Redis unreachable: this replica routes on its own figures and follows the workers itself (None:
    #: no shared state)
    redis_degraded: bool | None
    #: ``--kv-index``: ``auto`` (per worker: precise where KV events flow, else approximate), ``precise``,
    #: ``approximate``; ``off`` when the policy uses no prefix hits
    kv_index: str
    index_blocks: int | None
    #: the block the prompt is hashed in: tokens of the engines' tokenizer, or bytes where the byte
    #: tokenizer stands in (``block_unit``; the start-up probe's choice, or ``--block-size``)
    block_size: int | None
    block_unit: str | None
    #: predicted prefix hits are not materialising (gateway-wide; None: no prediction is checked)
    drift: bool | None
    #: of the predicted hit tokens over the feedback window, the share workers confirmed
    realised: float | None
    window_s: float


class UiIndex(BaseModel):
    """How the gateway's KV index knows one worker's cache."""

    #: ``precise`` (its KV events), ``approximate`` (learned from routing), ``none`` (no hits: its engine
    #: cannot reuse a prefix, or its feed went quiet under ``--kv-index precise``) or ``off`` (no index)
    mode: str
    note: str | None
    blocks: int | None


class UiWorker(WorkerInfo):
    """A worker as ``GET /admin/workers`` lists it, with its index and its recent window."""

    index: UiIndex
    window: WorkerWindow
    #: its own predictions are not materialising (same rule as the gateway-wide flag, over its window)
    drift: bool


class UiState(BaseModel):
    """``GET /admin/ui/state``."""

    gateway: UiGateway
    workers: list[UiWorker]
    decisions: list[RecentDecision]


def _index(deps: AppDeps, record: WorkerRecord | None, blocks: Mapping[str, int]) -> UiIndex:
    if deps.kv is None or record is None:
        return UiIndex(mode="off", note="the policy routes without prefix hits", blocks=None)
    facts = record.facts
    count = blocks.get(record.id, 0)
    if facts.no_affinity_reason is not None:
        return UiIndex(mode="none", note=facts.no_affinity_reason, blocks=count)
    note = None if facts.events_trusted else "its KV-event feed went quiet"
    return UiIndex(mode=facts.index_mode, note=note, blocks=count)


def _drifting(window: WorkerWindow, feedback: PrefixFeedback | None) -> bool:
    if feedback is None or window.realised is None:
        return False
    config = feedback.config
    return window.checked >= config.min_samples and window.realised < config.min_realised_ratio


def _gateway(deps: AppDeps, version: str, feedback: PrefixFeedback | None) -> UiGateway:
    kv = deps.kv
    shared = deps.state.redis is not None
    return UiGateway(
        version=version,
        policy=deps.policy.name,
        state="redis" if shared else "memory",
        replicas=deps.state.load.replicas(),
        replica_rank=deps.state.load.rank(),
        redis_degraded=(kv.degraded if kv is not None else False) if shared else None,
        kv_index=deps.settings.kv_index if kv is not None else "off",
        index_blocks=kv.index.num_blocks() if kv is not None else None,
        block_size=deps.settings.block_size if kv is not None else None,
        block_unit=("tokens" if deps.settings.exact_tokens else "bytes") if kv is not None else None,
        drift=feedback.drift if feedback is not None and feedback.realised_ratio is not None else None,
        realised=feedback.realised_ratio if feedback is not None else None,
        window_s=deps.proxy.stats.window_s,
    )


async def ui_state(deps: AppDeps, version: str) -> UiState:
    """The page's document (see the module doc)."""
    feedback = deps.router.feedback
    listed = (await list_workers(deps)).workers
    windows = deps.proxy.stats.summaries(w.id for w in listed)
    blocks = deps.kv.index.worker_blocks() if deps.kv is not None else {}
    workers = [
        UiWorker(
            **dict(info),
            index=_index(deps, deps.fleet.get(info.id), blocks),
            window=windows[info.id],
            drift=_drifting(windows[info.id], feedback),
        )
        for info in listed
    ]
    return UiState(
        gateway=_gateway(deps, version, feedback),
        workers=workers,
        decisions=deps.router.decisions.recent(deps.settings.block_size),
    )
