from __future__ import annotations

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.observability.tracing import TracingMiddleware, build_tracer_provider, inject_headers
from gateway.security.asgi import Receive, Scope, Send


async def test_request_span_continues_the_callers_trace_and_propagates() -> None:
    exporter = InMemorySpanExporter()
    provider = build_tracer_provider(exporter=exporter)
    tracer = provider.get_tracer("test")
    seen: list[dict[str, str]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        with tracer.start_as_current_span("kvgate.route"):
            headers: dict[str, str] = {}
            inject_headers(headers)
            seen.append(headers)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-kvgate-worker", b"w1")]})
        await send({"type": "http.response.body", "body": b"ok"})

    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    transport = httpx.ASGITransport(app=TracingMiddleware(app, tracer))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        await c.post("/v1/completions", headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
        await c.get("/health")
    finished = exporter.get_finished_spans()
    # /health gets no request span; its inner span is a root of its own
    assert sorted(s.name for s in finished) == ["kvgate.request", "kvgate.route", "kvgate.route"]
    spans = {s.name: s for s in finished[:2]}
    req = spans["kvgate.request"]
    assert format(req.context.trace_id, "032x") == trace_id
    assert spans["kvgate.route"].parent.span_id == req.context.span_id
    assert req.attributes["kvgate.worker"] == "w1"
    assert seen[0]["traceparent"].split("-")[1] == trace_id
