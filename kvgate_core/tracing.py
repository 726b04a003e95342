"""OpenTelemetry tracing: an app-owned provider, a span per HTTP request, W3C trace context in and out.

Used by the gateway and, to continue the gateway's traces, by the workers (it imports nothing else of kvgate).

The provider is built per app (never the global one), so two apps can live in one process and tests can
use an in-memory exporter. The request middleware continues an incoming ``traceparent``; code inside the
request opens child spans with ``tracer.start_as_current_span`` and the proxy calls ``inject_headers`` so
workers continue the trace. Spans are per request and per stage, never per streamed chunk.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kvgate_core.asgi import ASGIApp, Message, Receive, Scope, Send
from kvgate_core.spans import active_tracer, stage_span, upstream_span

__all__ = [
    "TracingMiddleware",
    "active_tracer",
    "build_tracer_provider",
    "inject_headers",
    "stage_span",
    "upstream_span",
]

_PROPAGATOR = TraceContextTextMapPropagator()

_SKIP = frozenset({"/health", "/ready", "/metrics"})


def build_tracer_provider(
    service_name: str = "kvgate-gateway",
    *,
    otlp_endpoint: str | None = None,
    exporter: SpanExporter | None = None,
) -> TracerProvider:
    """A provider exporting to ``exporter`` (synchronously; for tests) or to OTLP/HTTP in batches."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    return provider


def inject_headers(headers: MutableMapping[str, str]) -> None:
    """Add ``traceparent``/``tracestate`` of the current span to outgoing ``headers``."""
    _PROPAGATOR.inject(headers)


def _carrier(scope: Scope) -> dict[str, str]:
    return {
        k.decode("latin-1"): v.decode("latin-1")
        for k, v in scope.get("headers", ())
        if k in (b"traceparent", b"tracestate")
    }


class TracingMiddleware:
    """One server span per HTTP request (``kvgate.request``), continuing the caller's trace context."""

    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _SKIP:
            await self.app(scope, receive, send)
            return
        parent = _PROPAGATOR.extract(_carrier(scope))
        token = otel_context.attach(parent)
        tracer_token = active_tracer.set(self.tracer)
        try:
            with self.tracer.start_as_current_span(
                "kvgate.request",
                kind=SpanKind.SERVER,
                attributes={"http.request.method": scope["method"], "url.path": scope["path"]},
            ) as span:
                status: dict[str, Any] = {}

                async def send_wrapper(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        status["code"] = message["status"]
                        span.set_attribute("http.response.status_code", message["status"])
                        for k, v in message.get("headers", ()):
                            if k == b"x-kvgate-worker":
                                span.set_attribute("kvgate.worker", v.decode("latin-1"))
                    await send(message)

                await self.app(scope, receive, send_wrapper)
                if status.get("code", 200) >= 500:
                    span.set_status(Status(StatusCode.ERROR))
        finally:
            active_tracer.reset(tracer_token)
            otel_context.detach(token)
