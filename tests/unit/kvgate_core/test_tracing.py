from __future__ import annotations

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvgate_core.asgi import Receive, Scope, Send
from kvgate_core.tracing import TracingMiddleware, build_tracer_provider, inject_headers


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


async def test_stages_and_the_upstream_call_are_child_spans_and_workers_get_the_context() -> None:
    from gateway.observability.metrics import Metrics
    from gateway.proxy.passthrough import upstream_headers
    from kvgate_core.tracing import upstream_span

    exporter = InMemorySpanExporter()
    tracer = build_tracer_provider(exporter=exporter).get_tracer("test")
    metrics = Metrics()
    sent: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        metrics.stage("policy", 0.002)
        with upstream_span("w1"):
            sent.append(upstream_headers({"x-kvgate-tenant": "acme"}))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    transport = httpx.ASGITransport(app=TracingMiddleware(app, tracer))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        await c.post("/v1/chat/completions")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"kvgate.request", "kvgate.policy", "kvgate.upstream"}
    root = spans["kvgate.request"].context.span_id
    assert spans["kvgate.policy"].parent.span_id == root
    assert spans["kvgate.upstream"].parent.span_id == root
    assert spans["kvgate.policy"].end_time - spans["kvgate.policy"].start_time == 2_000_000
    upstream_id = format(spans["kvgate.upstream"].context.span_id, "016x")
    assert sent[0].startswith(b"x-kvgate-tenant: acme\r\ntraceparent: 00-")
    assert upstream_id.encode() in sent[0]


def test_without_tracing_nothing_is_added() -> None:
    from gateway.observability.metrics import Metrics
    from gateway.proxy.passthrough import upstream_headers

    Metrics().stage("policy", 0.001)  # no tracer active: no span, no error
    assert upstream_headers({}) == b""
