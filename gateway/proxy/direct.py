"""One request to one named worker, its answer relayed as it comes: the stored-response routes.

``GET|DELETE /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel`` and ``GET …/input_items`` can only be
answered by the worker that stored the response, so there is no retry elsewhere: a failure before the first
byte is a 502/504; one after it cuts the client's connection (``StreamCut``). The answer's status, type and
body pass through unchanged (a ``?stream=true`` GET streams), with ``x-kvgate-worker``.
"""

from __future__ import annotations

import asyncio
import time

from gateway.errors import WorkerTimeout, WorkerUnavailable
from gateway.fleet.registry import WorkerRecord
from gateway.observability.metrics import Metrics
from gateway.proxy.disconnect import cancel_on_disconnect
from gateway.proxy.failover import shed_from
from gateway.proxy.stream import CLIENT_GONE, StreamCut
from gateway.settings import Timeouts
from kvgate_core.asgi import Receive, Send
from kvgate_core.deadline import Deadline, DeadlineWheel
from kvgate_core.h1 import H1Pool, PoolSaturatedError, Target


class DirectForwarder:
    """Relays requests to a given worker (see the module docstring)."""

    def __init__(
        self, pool: H1Pool, timeouts: Timeouts, metrics: Metrics, wheel: DeadlineWheel | None = None
    ) -> None:
        self._wheel = wheel
        self._pool = pool
        self._timeouts = timeouts
        self._metrics = metrics

    async def forward(
        self, record: WorkerRecord, request_line: tuple[bytes, bytes, bytes], label: str, receive: Receive,
        send: Send,
    ) -> int:  # fmt: skip
        """Send ``(method, path with query, body)`` to ``record``; relay the answer; its status (499: the
        client left first).

        Raises:
            WorkerUnavailable, WorkerTimeout: the worker failed before answering.
            UpstreamSaturated: no upstream connection could be had.
        """
        start = time.perf_counter()
        status = 502
        try:
            result = await cancel_on_disconnect(self._relay(record, request_line, send), receive)
            status = CLIENT_GONE if result is None else result
            return status
        finally:
            self._metrics.request(label, status, record.id, time.perf_counter() - start)

    async def _relay(self, record: WorkerRecord, request_line: tuple[bytes, bytes, bytes], send: Send) -> int:
        method, path, body = request_line
        target = Target.parse(record.url)
        loop = asyncio.get_running_loop()
        conn = None
        started = False
        try:
            async with Deadline(self._timeouts.ttfb_s, self._wheel) as deadline:
                conn = await self._pool.post(target, target.request(method, path, body))
                record.breaker.record_success()
                headers = [(b"content-type", conn.content_type), (b"x-kvgate-worker", record.id.encode())]
                await send({"type": "http.response.start", "status": conn.status, "headers": headers})
                started = True
                while chunk := await conn.read_chunk():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    deadline.reschedule(loop.time() + self._timeouts.idle_s)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return conn.status
        except PoolSaturatedError as exc:
            raise shed_from(exc, record.id).error from None
        except TimeoutError:
            if started:
                raise StreamCut(f"worker {record.id} stopped sending") from None
            raise WorkerTimeout(f"worker {record.id} timed out") from None
        except OSError as exc:
            record.breaker.record_failure()
            if started:
                raise StreamCut(f"worker {record.id} broke the connection: {exc}") from None
            raise WorkerUnavailable(f"worker {record.id} failed: {exc}") from None
        finally:
            if conn is not None:
                self._pool.release(target, conn)
