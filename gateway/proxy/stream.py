"""Streaming relay: copy the worker's SSE bytes to the client, chunk by chunk, without parsing them.
Compiled with mypyc (``docs/development.md``: what that rules out).

The response starts only once the worker's first body chunk arrived, so failures up to then can still be
retried elsewhere. After that, an idle timeout bounds each gap; a broken or stalled upstream ends the
client's stream with an OpenAI-style error event and ``[DONE]``, and so does an upstream end without
``data: [DONE]`` (TensorRT-LLM drops the connection that way), except on engines that may omit it (MII:
the client gets a ``[DONE]``). A client disconnect (seen by a watcher task on ``receive``) cancels the relay,
which closes the upstream connection so the worker stops.

Where the gateway asked the engine for ``include_usage`` on its own behalf (``proxy.shaping``), the reads
pass through ``UsageChunkFilter``: the usage chunk is dropped and its cached tokens kept; every other byte
goes on as it arrived, as soon as the event it belongs to is complete.

Streams without ``[DONE]`` (``Framing.RESPONSES``, ``Framing.EOF``) are followed by a ``StreamWatch``
(``gateway.openai.responses_sse``): a Responses API stream ended well once its terminal event came, and its
``response.id`` is handed to ``on_response_id`` before the read that carries it reaches the client; a
pass-through stream ended well when the upstream ended its body. A broken Responses stream ends with an
``error`` event; a broken pass-through stream (whose event format the gateway does not know) is cut off
(``StreamCut``: the connection drops without the body's last chunk), so the client sees the failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from gateway.errors import WorkerTimeout, WorkerUnavailable
from gateway.openai.responses_sse import StreamWatch, responses_error_frames
from gateway.openai.schema import Framing
from gateway.openai.sse import TokenUsage, UsageChunkFilter, ends_stream, error_frames, usage_in
from gateway.proxy.disconnect import cancel_on_disconnect
from gateway.proxy.failover import RetryableFailure, shed_from
from gateway.proxy.responses import SSE_TYPE, proxied_headers, send_whole
from gateway.proxy.result import Result
from gateway.proxy.shaping import Shaped
from gateway.routing.router import Routed
from gateway.settings import Timeouts
from kvgate_core.asgi import Receive, Send
from kvgate_core.deadline import Deadline, DeadlineWheel
from kvgate_core.h1 import PoolSaturatedError, Target

logger = logging.getLogger(__name__)
CLIENT_GONE = 499
_AS_SENT = Shaped(b"")  # the relay never reads ``body``; only the stream handling flags


class StreamCut(Exception):  # noqa: N818 - not an error answer: the connection is dropped on purpose
    """A pass-through stream broke after its first byte: re-raised to the server, which drops the client's
    connection without the body's end (the one failure signal a stream of unknown format can carry)."""


OnResponseId = Callable[[str], Awaitable[None]]


class UpstreamStream(Protocol):
    """The relay's view of one upstream response (``kvgate_core.h1_connection.H1Connection``)."""

    @property
    def status(self) -> int: ...
    @property
    def content_type(self) -> bytes: ...
    @property
    def drained(self) -> bool: ...
    async def read_chunk(self) -> bytes: ...
    async def read_all(self) -> bytes: ...


C = TypeVar("C", bound=UpstreamStream)


class UpstreamPool(Protocol[C]):
    """The relay's view of the upstream pool (``kvgate_core.h1.H1Pool``): a structural type, so the relay
    compiled with mypyc still accepts a test's scripted pool."""

    async def post(self, target: Target, request: bytes, limit: int | None = None) -> C: ...
    def release(self, target: Target, conn: C) -> None: ...


class OnAnswered(Protocol):
    """Called when the worker has finished a request (``forward.Hold.end``)."""

    def __call__(self, *, answered: bool) -> None: ...


class StreamRelay(Generic[C]):
    """Relays one streamed completion per call.

    Args:
        pool: upstream connections.
        timeouts: the first-byte and idle deadlines.
        on_first_token: called with the request once its stream's first chunk arrived (its prefill is done
            on the worker: ``Router.first_token``).
        wheel: the shared timer the streams' deadlines sit on (None: a timer each).
    """

    def __init__(
        self,
        pool: UpstreamPool[C],
        timeouts: Timeouts,
        on_first_token: Callable[[Routed], None] | None = None,
        wheel: DeadlineWheel | None = None,
    ) -> None:
        self._wheel = wheel
        self._pool = pool
        self._timeouts = timeouts
        self._on_first_token = on_first_token

    async def relay(
        self,
        routed: Routed,
        target: Target,
        request: bytes,
        receive: Receive,
        send: Send,
        *,
        want_usage: bool,
        on_answered: OnAnswered,
        cap: int | None = None,
        shaped: Shaped | None = None,
        framing: Framing = Framing.DONE,
        on_response_id: OnResponseId | None = None,
    ) -> Result:
        """Relay a stream; on client disconnect cancel it and report status 499.

        ``on_answered(answered=True)`` is called once the worker has sent the stream's end, before the
        client gets it. ``cap``: the worker's upstream connection cap (default: the pool's). ``shaped``: how
        the request was shaped for this worker's engine (``proxy.shaping``; None: sent as the client did).
        ``framing``: how the stream ends (module docstring); ``on_response_id``: awaited with a Responses
        API stream's id before the client gets it.

        Raises:
            RetryableFailure: the worker failed before the first byte (nothing was sent).
            Shed: the worker had no upstream connection to give (nothing was sent).
        """
        watch = StreamWatch(framing) if framing is not Framing.DONE else None
        work = self._relay(
            routed,
            target,
            request,
            send,
            want_usage,
            on_answered,
            cap,
            shaped or _AS_SENT,
            watch,
            on_response_id,
        )
        result = await cancel_on_disconnect(work, receive)
        if result is None:
            logger.debug("client disconnected mid-stream", extra={"worker": routed.record.id})
            return Result(CLIENT_GONE, ok=False)
        return result

    async def _relay(
        self,
        routed: Routed,
        target: Target,
        request: bytes,
        send: Send,
        want_usage: bool,
        on_answered: OnAnswered,
        cap: int | None,
        shaped: Shaped,
        watch: StreamWatch | None = None,
        on_response_id: OnResponseId | None = None,
    ) -> Result:
        loop = asyncio.get_running_loop()
        worker = routed.record.id
        started_at = loop.time()
        conn: C | None = None
        started = False
        try:
            async with Deadline(self._timeouts.ttfb_s, self._wheel) as deadline:
                conn = await self._pool.post(target, request, cap)
                if conn.status != 200:
                    return await self._error_answer(routed, conn, send)
                first = await conn.read_chunk()
                if not first:
                    raise RetryableFailure(WorkerUnavailable(f"worker {worker} sent an empty stream"), "eof")
                ttfb_s = loop.time() - started_at
                routed.record.breaker.record_success()
                if self._on_first_token is not None:
                    self._on_first_token(routed)
                ctype = SSE_TYPE if watch is None else conn.content_type
                headers = proxied_headers(ctype, worker, routed.prefix_hit_tokens, None, routed.prefill_id)
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                started = True
                closed = False  # the client's response already complete (``_copy`` ended it)
                if watch is not None:
                    ended = await self._copy_watched(
                        conn, first, send, deadline, on_answered, watch, on_response_id
                    )
                    usage = watch.usage() if want_usage else None
                elif shaped.strip_usage_chunk:
                    ended, usage = await self._copy_without_usage(conn, first, send, deadline, on_answered)
                else:
                    ended, usage, closed = await self._copy(
                        conn, first, send, deadline, on_answered, want_usage
                    )
            if ended:
                if not closed:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return Result(200, ok=True, usage=usage, ttfb_s=ttfb_s)
            # every engine fronted here ends a good stream with [DONE] (MII 0.3.3 too, ``StreamResults``);
            # TensorRT-LLM drops the connection on an error instead of sending an error event
            end = "[DONE]" if watch is None else "its final event"
            return await self._broken(
                routed, send, f"worker closed the stream before {end}", "worker_unavailable", watch
            )
        except OSError as exc:  # TimeoutError, UpstreamConnectionError, PoolSaturatedError
            return await self._failed(routed, send, exc, started=started, watch=watch)
        finally:
            if conn is not None:
                self._pool.release(target, conn)

    async def _copy(
        self,
        conn: C,
        chunk: bytes,
        send: Send,
        deadline: Deadline,
        on_answered: OnAnswered,
        want_usage: bool,
    ) -> tuple[bool, TokenUsage | None, bool]:
        """Pass every read on as it is; whether ``[DONE]`` ended it, the usage seen, and whether the client's
        response is complete already: a read that ends the stream and the worker's response both goes out
        with the response's end, in one write."""
        loop = asyncio.get_running_loop()
        idle_s = self._timeouts.idle_s
        usage: TokenUsage | None = None
        ended = False
        before = last = b""
        while chunk:
            if want_usage and (usage is None or usage.cached_tokens is None):
                usage = usage_in(chunk) or usage
            ended = ends_stream(chunk)
            if ended:
                on_answered(answered=True)
                if conn.drained:
                    await send({"type": "http.response.body", "body": chunk, "more_body": False})
                    return True, usage, True
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            deadline.reschedule(loop.time() + idle_s)
            before, last = last, chunk
            chunk = await conn.read_chunk()
        if not ended and _split_done(before, last):
            ended = True
            on_answered(answered=True)
        return ended, usage, False

    async def _copy_without_usage(
        self, conn: C, chunk: bytes, send: Send, deadline: Deadline, on_answered: OnAnswered
    ) -> tuple[bool, TokenUsage | None]:
        """Like ``_copy``, less the usage chunk the gateway asked for on its own behalf."""
        loop = asyncio.get_running_loop()
        idle_s = self._timeouts.idle_s
        usage = UsageChunkFilter()
        ended = False
        before = last = b""
        while chunk:
            ended = ends_stream(chunk)
            if ended:
                on_answered(answered=True)
            out = usage.feed(chunk)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            deadline.reschedule(loop.time() + idle_s)
            before, last = last, chunk
            chunk = await conn.read_chunk()
        if not ended and _split_done(before, last):
            ended = True
            on_answered(answered=True)
        held = usage.flush()
        if held:
            await send({"type": "http.response.body", "body": held, "more_body": True})
        return ended, usage.usage

    async def _copy_watched(
        self,
        conn: C,
        chunk: bytes,
        send: Send,
        deadline: Deadline,
        on_answered: OnAnswered,
        watch: StreamWatch,
        on_response_id: OnResponseId | None,
    ) -> bool:
        """Pass every read on as it is, following it with ``watch``; whether it ended well."""
        loop = asyncio.get_running_loop()
        idle_s = self._timeouts.idle_s
        while chunk:
            known = watch.response_id
            watch.feed(chunk)
            if on_response_id is not None and known is None and watch.response_id is not None:
                await on_response_id(watch.response_id)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            deadline.reschedule(loop.time() + idle_s)
            chunk = await conn.read_chunk()
        if watch.framing is Framing.EOF:
            watch.ended = True  # the body ended cleanly (a broken one raised)
        on_answered(answered=True)
        return watch.ended

    async def _failed(
        self, routed: Routed, send: Send, exc: OSError, *, started: bool, watch: StreamWatch | None = None
    ) -> Result:
        """Before the first byte: retry or shed elsewhere; after it: end the client's stream with an error."""
        worker = routed.record.id
        if isinstance(exc, PoolSaturatedError):  # raised by ``post``: nothing was sent
            raise shed_from(exc, worker) from None
        if isinstance(exc, TimeoutError):
            if not started:
                raise RetryableFailure(WorkerTimeout(f"worker {worker} timed out"), "timeout") from None
            return await self._broken(
                routed, send, "worker stopped sending (idle timeout)", "worker_timeout", watch
            )
        if not started:
            raise RetryableFailure(WorkerUnavailable(f"worker {worker} failed: {exc}"), "connect") from None
        return await self._broken(
            routed, send, "worker connection broke mid-stream", "worker_unavailable", watch
        )

    async def _error_answer(self, routed: Routed, conn: C, send: Send) -> Result:
        """A worker answered a stream request with an error status: retry 5xx, pass 4xx through."""
        body = await conn.read_all()
        if conn.status >= 500:
            raise RetryableFailure(
                WorkerUnavailable(f"worker {routed.record.id} answered {conn.status}"),
                f"status_{conn.status}",
            )
        headers = proxied_headers(
            conn.content_type, routed.record.id, routed.prefix_hit_tokens, len(body), routed.prefill_id
        )
        await send_whole(send, conn.status, headers, body)
        return Result(conn.status, ok=False)

    async def _broken(
        self, routed: Routed, send: Send, message: str, code: str, watch: StreamWatch | None = None
    ) -> Result:
        routed.record.breaker.record_failure()
        logger.warning("stream broken", extra={"worker": routed.record.id, "reason": message})
        text = f"{message} (worker {routed.record.id})"
        if watch is not None and watch.framing is Framing.EOF:
            raise StreamCut(text)
        frames = error_frames(text, code) if watch is None else responses_error_frames(text, code)
        await send({"type": "http.response.body", "body": frames, "more_body": False})
        return Result(200, ok=False)


def _split_done(before: bytes, last: bytes) -> bool:
    """Whether ``[DONE]`` arrived split over the last two reads (``last`` alone did not show it)."""
    return bool(before) and len(last) < 16 and ends_stream(before[-16:] + last)
