"""``/admin/workers`` (list, register, drain) and ``/admin/route`` (explain a decision, forward nothing)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.errors import error_response
from gateway.api.openai_routes import deps_of, read_body
from gateway.errors import ConfigError, InvalidRequest, KvgateError
from gateway.fleet.registry import WorkerRecord
from gateway.openai.schema import parse_request
from gateway.routing.parity_gate import parity_reports, reports_json
from gateway.routing.router import Explanation
from gateway.settings import parse_worker
from kvgate_core.tokenize.request_prompt import Endpoint


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _worker_json(record: WorkerRecord, inflight: int, pool: dict[str, Any] | None = None) -> dict[str, Any]:
    """One worker; ``pool``: its PD pool (role it serves now, why it last changed), when pools run."""
    return {
        "pool": pool,
        "id": record.id,
        "url": record.url,
        "role": str(record.role),
        "healthy": record.healthy,
        "draining": record.draining,
        "breaker": str(record.breaker.state),
        "inflight": inflight,
        "running": record.running,
        "queue": record.queue_depth,
        "kv_usage": record.kv_usage,
        "cached_blocks": record.cached_blocks,
        "models": sorted(record.models),
    }


async def list_workers(request: Request) -> Response:
    deps = deps_of(request.scope)
    pools = deps.pools
    rows = [
        _worker_json(r, deps.state.load.get(r.id).inflight_requests, pools.describe(r.id) if pools else None)
        for r in deps.fleet
    ]
    return _json({"workers": rows})


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await read_body(request.receive, deps_of(request.scope).settings.max_body_bytes)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


async def register_worker(request: Request) -> Response:
    """Register ``{"url", "role"?, "id"?}``; it gets traffic once a health probe passes."""
    deps = deps_of(request.scope)
    try:
        body = await _json_object(request)
        url, role, worker_id = body.get("url"), body.get("role", "both"), body.get("id")
        if not isinstance(url, str) or not isinstance(role, str) or not isinstance(worker_id, str | None):
            raise InvalidRequest('body must be {"url": str, "role"?: str, "id"?: str}', param="url")
        fragment = f"role={role}" + (f"&id={worker_id}" if worker_id else "")
        try:
            spec = parse_worker(f"{url.split('#')[0]}#{fragment}")
        except ConfigError as exc:
            raise InvalidRequest(exc.message, param="url") from None
        record = deps.fleet.add(spec)
        deps.on_worker_added(record)
        await deps.health.probe(record)
    except KvgateError as exc:
        return error_response(exc)
    return _json(_worker_json(record, 0), status=201)


async def drain_worker(request: Request) -> Response:
    """Stop new requests to a worker; the health loop removes it once its in-flight requests finish."""
    deps = deps_of(request.scope)
    try:
        record = deps.fleet.drain(request.path_params["worker_id"])
    except KvgateError as exc:
        return error_response(exc)
    return _json(_worker_json(record, deps.state.load.get(record.id).inflight_requests), status=202)


def _explanation_json(exp: Explanation, block_size: int) -> dict[str, Any]:
    decision = exp.decision
    return {
        "decision": {
            "worker": decision.worker,
            "prefill_worker": decision.prefill_worker,
            "reason": decision.reason,
        },
        "num_prompt_tokens": exp.request.num_prompt_tokens,
        "num_blocks": len(exp.request.block_hashes),
        "workers": [
            {
                "id": v.id,
                "healthy": v.healthy,
                "score": decision.scores.get(v.id),
                "prefix_hit_tokens": min(v.gpu_hit_blocks * block_size, exp.request.num_prompt_tokens),
                "gpu_hit_blocks": v.gpu_hit_blocks,
                "tier_hit_blocks": v.tier_hit_blocks,
                "inflight": v.inflight_requests,
                "queue": v.queue_depth,
            }
            for v in exp.views
        ],
    }


def _endpoint_of(raw: bytes) -> Endpoint:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Endpoint.CHAT  # parse_request reports the bad JSON
    if isinstance(body, dict) and "messages" not in body and "prompt" in body:
        return Endpoint.COMPLETIONS
    return Endpoint.CHAT


async def explain_route(request: Request) -> Response:
    """The decision the router would make for a chat/completions body, without forwarding it."""
    deps = deps_of(request.scope)
    try:
        raw = await read_body(request.receive, deps.settings.max_body_bytes)
        endpoint = _endpoint_of(raw)
        parsed = parse_request(raw, endpoint, max_tokens_limit=deps.settings.max_tokens_limit)
        headers = {k.lower(): v for k, v in request.headers.items()}
        explanation = deps.router.explain(deps.router.prepare(parsed, headers))
    except KvgateError as exc:
        return error_response(exc)
    return _json(_explanation_json(explanation, deps.settings.block_size))


async def check_parity_now(request: Request) -> Response:
    """Run the tokenizer parity self-test against every worker now (``POST /admin/parity``)."""
    deps = deps_of(request.scope)
    reports = await parity_reports(deps.analyzer, [r.url for r in deps.fleet], deps.control)
    body = {"checked": bool(reports), "ok": all(r.ok for r in reports), "workers": reports_json(reports)}
    return _json(body)
