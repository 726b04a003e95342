"""The generated OpenAPI document: every route is in it, and the answers of the routes match it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import orjson
from fastapi.routing import iter_route_contexts
from starlette.routing import Route

from gateway.api.application import build_gateway_app
from gateway.api.openapi import main as write_openapi
from gateway.app import create_app
from tests.unit.gateway.fake_worker import FakeWorker, running
from tests.unit.gateway.gateway_harness import serving, settings_for

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hello"}]}


async def _served_document(app: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        resp = await client.get("/openapi.json")
    assert resp.status_code == 200
    document: dict[str, Any] = resp.json()
    return document


def _operations_of_routes(app: Any) -> set[tuple[str, str]]:
    """(path, method) of every route the app answers, but the document itself and HEAD (GET's twin)."""
    ops = set()
    for route in iter_route_contexts(app.routes):  # through the included routers
        if route.path == "/openapi.json":
            continue
        ops |= {(str(route.path_format), m.lower()) for m in route.methods or () if m != "HEAD"}
    return ops


async def test_every_route_is_in_the_served_document() -> None:
    app = create_app(settings_for("http://127.0.0.1:9"))
    document = await _served_document(app)
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert documented == _operations_of_routes(app)
    assert {("/v1/chat/completions", "post"), ("/v1/completions", "post")} <= documented
    refs = orjson.dumps(document).decode().split('"$ref":"#/components/schemas/')[1:]
    assert {ref.split('"')[0] for ref in refs} <= set(document["components"]["schemas"])


async def test_completion_routes_stay_raw_asgi() -> None:
    app = create_app(settings_for("http://127.0.0.1:9"))
    raw = {r.path: r for r in app.routes if isinstance(r, Route) and r.path.endswith("completions")}
    assert set(raw) == {"/v1/chat/completions", "/v1/completions"}
    assert all(type(r) is Route for r in raw.values())  # not FastAPI's APIRoute: no request models, no DI


async def test_no_validation_error_schema_leaks_into_the_document() -> None:
    document = await _served_document(create_app(settings_for("http://127.0.0.1:9")))
    statuses = {
        status for item in document["paths"].values() for op in item.values() for status in op["responses"]
    }
    assert "422" not in statuses
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_the_module_writes_the_served_document(tmp_path: Path) -> None:
    out = tmp_path / "openapi.json"
    assert write_openapi([str(out)]) == 0
    assert orjson.loads(out.read_bytes()) == build_gateway_app().openapi()


def _schema_for(document: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    responses = document["paths"][path][method]["responses"]
    response = responses.get(str(status)) or responses[f"{str(status)[0]}XX"]
    schema: dict[str, Any] = response["content"]["application/json"]["schema"]
    return {**schema, "components": document["components"]}


async def test_answers_match_their_documented_schemas() -> None:
    a, b = FakeWorker("a", model="m1"), FakeWorker("b", model="m1")
    async with (
        running(a, b),
        serving(settings_for(a.url)) as base,
        httpx.AsyncClient(base_url=base) as client,
    ):
        document = (await client.get("/openapi.json")).json()
        calls = [
            ("/v1/models", "get", await client.get("/v1/models")),
            ("/health", "get", await client.get("/health")),
            ("/ready", "get", await client.get("/ready")),
            ("/admin/workers", "get", await client.get("/admin/workers")),
            ("/admin/workers", "post", await client.post("/admin/workers", json={"url": b.url, "id": "b"})),
            ("/admin/workers", "post", await client.post("/admin/workers", json={"url": 1})),
            ("/admin/workers/{worker_id}", "delete", await client.delete("/admin/workers/b")),
            ("/admin/workers/{worker_id}", "delete", await client.delete("/admin/workers/nope")),
            ("/admin/route", "post", await client.post("/admin/route", json=CHAT)),
            ("/admin/route", "post", await client.post("/admin/route", json={"model": "m1", "prompt": "x"})),
            ("/admin/parity", "post", await client.post("/admin/parity")),
            ("/v1/chat/completions", "post", await client.post("/v1/chat/completions", json=CHAT)),
            ("/v1/chat/completions", "post", await client.post("/v1/chat/completions", json={"model": 1})),
        ]
    assert [resp.status_code for _, _, resp in calls] == [
        200,
        200,
        200,
        200,
        201,
        400,
        202,
        404,
        200,
        200,
        200,
        200,
        400,
    ]
    for path, method, resp in calls:
        schema = _schema_for(document, path, method, resp.status_code)
        jsonschema_rs.validate(schema, resp.json())  # raises ValidationError with the path that failed
