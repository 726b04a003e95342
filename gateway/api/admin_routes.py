"""``/admin/workers`` (list, register, drain, undrain), ``/admin/route`` (explain a decision, forward
nothing) and ``/admin/parity`` (the tokenizer parity self-test).

Who may call them is the auth layer's business (``gateway.security.auth``, ``gateway.security.admin_access``).
A registration names a URL the gateway will connect to: it must pass the worker allow-list
(``gateway.security.worker_allow``, ``--worker-allow``) before the worker is added or probed.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, Request

from gateway.api.completion_docs import COMPLETION_BODY
from gateway.api.control import CLIENT_ERRORS, ERROR_DOC, AppDeps, ControlRoute, add_get
from gateway.api.models import (
    EngineInfo,
    ErrorResponse,
    ParityResult,
    PoolInfo,
    RegisterWorker,
    RouteDecision,
    RouteExplanation,
    WorkerInfo,
    WorkerList,
    WorkerScore,
)
from gateway.api.openai_routes import read_body
from gateway.engines.summary import engine_summary
from gateway.errors import ConfigError, InvalidRequest
from gateway.fleet.registry import WorkerRecord
from gateway.openai.schema import parse_request
from gateway.routing.parity_gate import parity_reports, parity_targets, reports_json
from gateway.routing.router import Explanation
from gateway.security.worker_allow import WorkerAllowList, WorkerNotAllowed
from gateway.settings import parse_worker
from kvgate_core.tokenize.request_prompt import Endpoint
from policies.api import RouteRequest

logger = logging.getLogger(__name__)


def engine_info(
    record: WorkerRecord, events: dict[str, Any] | None = None, units: dict[str, Any] | None = None
) -> EngineInfo:
    """The ``engine`` object of one worker; ``events``: the state of its KV-event feed, where the KV service
    keeps one; ``units``: its tokens and assumed cache as the approximate index learned them."""
    return EngineInfo.model_validate(
        {**engine_summary(record.facts, record.configured_engine), "events": events, "units": units}
    )


def _events(deps: AppDeps, worker_id: str) -> dict[str, Any] | None:
    """The worker's KV-event feed as the KV service runs it (None: no feed follows it)."""
    kv = deps.kv
    if kv is None:
        return None
    status = kv.feed_status(worker_id)
    if status is None and worker_id in kv.workers:  # a kvgate worker's own SSE feed
        status = {"engine": "kvgate", "state": "following", "trusted": True, "sources": ["/kv/events"]}
    return status


def _worker_info(
    record: WorkerRecord,
    inflight: int,
    pool: dict[str, Any] | None = None,
    *,
    events: dict[str, Any] | None = None,
    units: dict[str, Any] | None = None,
) -> WorkerInfo:
    """One worker; ``pool``: its PD pool (role it serves now, why it last changed), when pools run;
    ``events``: its KV-event feed; ``units``: what the approximate index learned of it."""
    return WorkerInfo(
        engine=engine_info(record, events, units),
        pool=PoolInfo.model_validate(pool) if pool is not None else None,
        id=record.id,
        url=record.url,
        role=str(record.role),
        healthy=record.healthy,
        draining=record.draining,
        breaker=str(record.breaker.state),
        inflight=inflight,
        running=record.running,
        queue=record.queue_depth,
        kv_usage=record.kv_usage,
        cached_blocks=record.cached_blocks,
        models=sorted(record.models),
    )


async def list_workers(deps: AppDeps) -> WorkerList:
    """The fleet as the gateway sees it, each worker with its engine."""
    pools = deps.pools
    rows = [
        _worker_info(
            r,
            deps.state.load.get(r.id).inflight_requests,
            pools.describe(r.id) if pools else None,
            events=_events(deps, r.id),
            units=deps.kv.units_status(r.id) if deps.kv is not None else None,
        )
        for r in deps.fleet
    ]
    return WorkerList(workers=rows)


def worker_allow(request: Request, deps: AppDeps) -> WorkerAllowList:
    """The allow-list in force: the one the server put in the app's state (``gateway.server.build_asgi``),
    else the default for the configured workers (an app served without the server's assembly)."""
    configured = getattr(request.app.state, "worker_allow", None)
    if isinstance(configured, WorkerAllowList):
        return configured
    return WorkerAllowList.default(w.url for w in deps.settings.workers)


async def register_worker(body: RegisterWorker, request: Request, deps: AppDeps) -> WorkerInfo:
    """Register a worker; it gets traffic once a health probe passes. A URL outside the worker allow-list
    is refused (403 ``worker_not_allowed``) before anything connects to it."""
    # encoded, so that a role or an id cannot smuggle fragment keys of its own (``&events=tcp://…``)
    fragment = urlencode({"role": body.role, **({"id": body.id} if body.id else {})})
    try:
        spec = parse_worker(f"{body.url.split('#')[0]}#{fragment}")
    except ConfigError as exc:
        raise InvalidRequest(exc.message, param="url") from None
    if not worker_allow(request, deps).allows(spec.url):
        logger.warning("refused to register worker %r: not in --worker-allow", spec.url)
        raise WorkerNotAllowed(
            "This worker URL is not in the gateway's worker allow-list; the operator can extend it with "
            "--worker-allow (CIDR, IP address or host name, optionally :PORT).",
            param="url",
        )
    record = deps.fleet.add(spec)
    deps.on_worker_added(record, spec)
    await deps.health.probe(record)
    return _worker_info(record, 0, events=_events(deps, record.id))


async def drain_worker(worker_id: str, deps: AppDeps) -> WorkerInfo:
    """Stop new requests to a worker; the health loop removes it once its in-flight requests finish."""
    record = deps.fleet.drain(worker_id)
    return _worker_info(
        record, deps.state.load.get(record.id).inflight_requests, events=_events(deps, record.id)
    )


async def undrain_worker(worker_id: str, deps: AppDeps) -> WorkerInfo:
    """Cancel a drain that has not finished: the worker takes new requests again (a no-op when it is not
    draining). A drained worker that went idle has been removed: register it again."""
    record = deps.fleet.undrain(worker_id)
    return _worker_info(
        record, deps.state.load.get(record.id).inflight_requests, events=_events(deps, record.id)
    )


def _explanation(exp: Explanation, block_size: int) -> RouteExplanation:
    decision = exp.decision
    return RouteExplanation(
        decision=RouteDecision(
            worker=decision.worker, prefill_worker=decision.prefill_worker, reason=decision.reason
        ),
        num_prompt_tokens=exp.request.num_prompt_tokens,
        num_blocks=len(exp.request.block_hashes),
        workers=[
            WorkerScore(
                id=v.id,
                healthy=v.healthy,
                score=decision.scores.get(v.id),
                prefix_hit_tokens=min(v.gpu_hit_blocks * block_size, exp.request.num_prompt_tokens),
                gpu_hit_blocks=v.gpu_hit_blocks,
                tier_hit_blocks=v.tier_hit_blocks,
                inflight=v.inflight_requests,
                queue=v.queue_depth,
            )
            for v in exp.views
        ],
    )


def _endpoint_of(raw: bytes) -> Endpoint:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Endpoint.CHAT  # parse_request reports the bad JSON
    if isinstance(body, dict) and "messages" not in body and "prompt" in body:
        return Endpoint.COMPLETIONS
    return Endpoint.CHAT


async def explain_route(request: Request, deps: AppDeps) -> RouteExplanation:
    """The decision the router would make for a chat/completions body, without forwarding it.

    The body is read raw and checked like a completion request's (``parse_request``), not by a model.
    """
    raw = await read_body(request.receive, deps.settings.max_body_bytes)
    headers = {k.lower(): v for k, v in request.headers.items()}

    def analyse() -> RouteRequest:
        parsed = parse_request(raw, _endpoint_of(raw), max_tokens_limit=deps.settings.max_tokens_limit)
        return deps.router.prepare(parsed, headers)

    req = await deps.offload.analysed(raw, analyse)  # as the completion routes (``gateway.analyze.offload``)
    return _explanation(deps.router.explain(req), deps.settings.block_size)


async def check_parity_now(deps: AppDeps) -> ParityResult:
    """Run the tokenizer parity self-test against every worker now."""
    reports = await parity_reports(deps.analyzer, parity_targets(deps.fleet), deps.control)
    body = {"checked": bool(reports), "ok": all(r.ok for r in reports), "workers": reports_json(reports)}
    return ParityResult.model_validate(body)


def admin_router() -> APIRouter:
    """The ``/admin/*`` routes (``gateway.security.auth`` guards them in the control plane's access mode)."""
    router = APIRouter(tags=["admin"], route_class=ControlRoute, responses=CLIENT_ERRORS)
    add_get(router, "/admin/workers", list_workers, response_model=WorkerList, operation_id="listWorkers")
    router.add_api_route(
        "/admin/workers",
        register_worker,
        methods=["POST"],
        status_code=201,
        response_model=WorkerInfo,
        operation_id="registerWorker",
    )
    router.add_api_route(
        "/admin/workers/{worker_id:path}",
        drain_worker,
        methods=["DELETE"],
        status_code=202,
        response_model=WorkerInfo,
        operation_id="drainWorker",
    )
    router.add_api_route(
        "/admin/workers/{worker_id:path}/undrain",
        undrain_worker,
        methods=["POST"],
        response_model=WorkerInfo,
        operation_id="undrainWorker",
    )
    router.add_api_route(
        "/admin/route",
        explain_route,
        methods=["POST"],
        response_model=RouteExplanation,
        operation_id="explainRoute",
        openapi_extra={"requestBody": COMPLETION_BODY},
        responses={503: {"model": ErrorResponse, "description": ERROR_DOC}},
    )
    router.add_api_route(
        "/admin/parity",
        check_parity_now,
        methods=["POST"],
        response_model=ParityResult,
        operation_id="checkParity",
    )
    return router
