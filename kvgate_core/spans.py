"""The request path's span hooks: the active tracer and the spans opened around stages and upstream calls.
Compiled with mypyc (``docs/development.md``: what that rules out).

Split from ``kvgate_core.tracing`` (the provider and the middleware) so the hooks can be compiled with the
rest of the request path (``kvgate_core.native``): with tracing off, the default, each is a context-variable
read and nothing else, no interpreted frame per request.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from contextvars import ContextVar
from types import TracebackType
from typing import Final

from opentelemetry.trace import SpanKind, Tracer

#: The tracer of the request being served (set by ``TracingMiddleware``; None when tracing is off), so that
#: deeper layers open child spans without a tracer being threaded through every call.
active_tracer: ContextVar[Tracer | None] = ContextVar("kvgate_active_tracer", default=None)


class _NoSpan(AbstractContextManager[object]):
    """The span of a request with tracing off: entering and leaving do nothing (one shared instance)."""

    def __enter__(self) -> object:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


_NO_SPAN: Final = _NoSpan()


def stage_span(name: str, seconds: float) -> None:
    """Record a finished request stage (``kvgate.<name>``) as a child span of the current request."""
    tracer = active_tracer.get()
    if tracer is None:
        return
    end = time.time_ns()
    tracer.start_span(f"kvgate.{name}", start_time=end - int(seconds * 1e9)).end(end_time=end)


def upstream_span(worker: str) -> AbstractContextManager[object]:
    """A child span around the upstream call to ``worker`` (a no-op without tracing)."""
    tracer = active_tracer.get()
    if tracer is None:
        return _NO_SPAN
    return tracer.start_as_current_span(
        "kvgate.upstream", kind=SpanKind.CLIENT, attributes={"kvgate.worker": worker}
    )
