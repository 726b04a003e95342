"""``/health`` (alive), ``/ready`` (at least one healthy worker) and ``/metrics`` (Prometheus text)."""

from __future__ import annotations

import orjson
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.errors import error_response
from gateway.api.openai_routes import deps_of
from gateway.errors import NoHealthyWorker


async def health(_request: Request) -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


async def ready(request: Request) -> Response:
    fleet = deps_of(request.scope).fleet
    num_ready = sum(1 for r in fleet if r.available)
    if num_ready == 0:
        return error_response(NoHealthyWorker("no healthy worker yet; check the --worker URLs"))
    return Response(
        orjson.dumps({"status": "ready", "healthy_workers": num_ready}), media_type="application/json"
    )


async def metrics(request: Request) -> Response:
    return Response(deps_of(request.scope).metrics.render(), media_type=CONTENT_TYPE_LATEST)
