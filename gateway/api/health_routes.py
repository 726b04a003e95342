"""``/health`` (alive), ``/ready`` (at least one healthy worker) and ``/metrics`` (Prometheus text)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.api.control import ERROR_DOC, AppDeps, ControlRoute, add_get
from gateway.api.models import ErrorResponse, HealthStatus, ReadyStatus
from gateway.errors import NoHealthyWorker


async def health() -> HealthStatus:
    """The process is alive."""
    return HealthStatus()


async def ready(deps: AppDeps) -> ReadyStatus:
    """At least one worker is healthy, not draining and not cut off by its breaker."""
    num_ready = sum(1 for r in deps.fleet if r.available)
    if num_ready == 0:
        raise NoHealthyWorker("no healthy worker yet; check the --worker URLs")
    return ReadyStatus(healthy_workers=num_ready)


async def metrics(deps: AppDeps) -> Response:
    """The gateway's ``kvgate_*`` metrics in Prometheus' text format."""
    return Response(deps.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def health_router() -> APIRouter:
    """The probe routes; open to anyone (``gateway.security.auth`` leaves them unauthenticated)."""
    router = APIRouter(tags=["health"], route_class=ControlRoute)
    add_get(router, "/health", health, response_model=HealthStatus, operation_id="health")
    add_get(
        router,
        "/ready",
        ready,
        response_model=ReadyStatus,
        operation_id="ready",
        responses={503: {"model": ErrorResponse, "description": ERROR_DOC}},
    )
    add_get(
        router,
        "/metrics",
        metrics,
        response_class=Response,
        operation_id="metrics",
        responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    )
    return router
