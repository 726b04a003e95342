"""A worker started with --otlp-endpoint continues the gateway's trace (W3C traceparent)."""

from __future__ import annotations

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvgate_core.tokenize.bundle import byte_bundle
from kvgate_core.tracing import TracingMiddleware, build_tracer_provider
from workers.server.app import create_app
from workers.sim.engine import SimConfig, SimEngine
from workers.sim.scheduler import SimTiming


async def test_worker_spans_join_the_callers_trace() -> None:
    engine = SimEngine(
        SimConfig(worker_id="w", timing=SimTiming(prefill_tps=1e7, decode_tps=1e5), kv_tokens=4096),
        byte_bundle("kvgate-sim"),
    )
    await engine.start()
    exporter = InMemorySpanExporter()
    tracer = build_tracer_provider("kvgate-worker", exporter=exporter).get_tracer("kvgate.worker")
    app = TracingMiddleware(create_app(engine), tracer)
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    try:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as c:
            r = await c.post(
                "/v1/completions",
                json={"model": "kvgate-sim", "prompt": "hello", "max_tokens": 3},
                headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"},
            )
        assert r.status_code == 200
    finally:
        await engine.stop()
    (span,) = exporter.get_finished_spans()
    assert format(span.context.trace_id, "032x") == trace_id
    assert format(span.parent.span_id, "016x") == "b7ad6b7169203331"
