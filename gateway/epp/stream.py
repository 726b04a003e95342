"""One ext_proc stream (one HTTP request) in ``FULL_DUPLEX_STREAMED`` mode: what to answer, and when.

Request phase: the headers are kept and nothing is answered until the body has ended (its last chunk or the
trailers); the body is buffered up to ``max_body_bytes``; then the picker chooses, and the answers go out in
the order Envoy requires: the headers answer naming the endpoint (``gateway.epp.protocol``), the body
re-streamed in chunks of at most 62,000 bytes, then the trailers answer when the body ended with trailers.
A body-less request (``end_of_stream`` on the headers) is picked at once.

Response phase, by ``ResponseMode``: ``full`` passes every chunk back unchanged and at once while reading
its usage, and accounts the request when the response ends; ``headers`` reads the status and the served
endpoint, then closes the stream cleanly (Envoy goes on without the picker); ``none`` closes it cleanly
right after the request phase. The stream ending, however it ends (cancelled too), ends the accounting.
Errors become immediate responses in OpenAI's error shape.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from gateway.epp import protocol
from gateway.epp.accounting import InFlight
from gateway.epp.endpoints import parse_subset
from gateway.epp.picker import EndpointPicker, PickRequest
from gateway.epp.usage import UsageReader
from gateway.errors import BodyTooLarge, KvgateError, error_body

logger = logging.getLogger(__name__)


class ResponseMode(StrEnum):
    """How much of the response phase the picker sees (``--response-mode``)."""

    FULL = "full"
    HEADERS = "headers"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """Per-stream limits and the response mode."""

    max_body_bytes: int = 8 * 1024 * 1024
    response_mode: ResponseMode = ResponseMode.FULL


#: builds the accounting of a pick (``InFlight`` bound to the gateway's router, load board and fleet)
StartInFlight = Callable[..., InFlight]


def error_response(exc: KvgateError) -> pb.ProcessingResponse:
    """``exc`` as Envoy's immediate response: its status, OpenAI's JSON error body, its own headers."""
    return protocol.immediate(exc.status, exc.body(), [(b"content-type", b"application/json"), *exc.headers])


class PickerStream:
    """The state of one stream; ``run`` maps Envoy's messages to the answers.

    Args:
        picker: chooses the endpoint.
        start: opens the accounting of a pick.
        config: limits and the response mode.
    """

    def __init__(self, picker: EndpointPicker, start: StartInFlight, config: StreamConfig) -> None:
        self._picker = picker
        self._start = start
        self._config = config
        self._headers: dict[str, str] = {}
        self._subset: frozenset[str] | None = None
        self._parts: list[bytes] = []
        self._size = 0
        self._inflight: InFlight | None = None
        self._status: int | None = None
        self._usage: UsageReader | None = None
        self._closing = False  # close the stream cleanly once the current answers are out

    async def run(
        self, requests: AsyncIterator[pb.ProcessingRequest]
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """Answer every message of the stream; ends (cleanly) when the stream is done with the picker."""
        try:
            async for message in requests:
                for answer in await self._on(message):
                    yield answer
                if self._closing:
                    return
        except KvgateError as exc:
            yield error_response(exc)
        except Exception:  # stream boundary: log it, answer 500, never leak a traceback
            logger.exception("the picker failed on a request")
            body = error_body("the endpoint picker failed; see its log", "server_error", "epp_error")
            yield protocol.immediate(500, body, [(b"content-type", b"application/json")])
        finally:
            if self._inflight is not None:
                self._inflight.finish(self._status, self._usage.end() if self._usage is not None else None)

    async def _on(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return await self._request_headers(message)
        if kind == "request_body":
            return await self._request_body(message.request_body)
        if kind == "request_trailers":
            return await self._request_end(trailers=True)
        if kind == "response_headers":
            return self._response_headers(message)
        if kind == "response_body":
            return self._response_body(message.response_body)
        if kind == "response_trailers":
            self._finish()
            return [protocol.continue_trailers(response=True)]
        return []

    async def _request_headers(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        self._headers = protocol.header_map(message.request_headers.headers)
        subset = protocol.metadata_value(
            message.metadata_context, protocol.SUBSET_NAMESPACE, protocol.SUBSET_KEY
        )
        self._subset = parse_subset(subset)
        if not message.request_headers.end_of_stream:
            return []  # wait for the body
        answers = [await self._pick(None)]
        self._close_after_request()
        return answers

    async def _request_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        self._size += len(body.body)
        if self._size > self._config.max_body_bytes:
            raise BodyTooLarge(f"the request body exceeds {self._config.max_body_bytes} bytes")
        self._parts.append(body.body)
        if not body.end_of_stream:
            return []
        return await self._request_end(trailers=False)

    async def _request_end(self, *, trailers: bool) -> list[pb.ProcessingResponse]:
        if self._inflight is not None:  # trailers after a body that ended already
            return [protocol.continue_trailers(response=False)]
        raw = b"".join(self._parts)
        self._parts = []
        answers = [await self._pick(raw)]
        chunks = list(protocol.body_chunks(raw))
        if trailers:  # the trailers end the stream, not the body's last chunk
            last = chunks[-1].request_body.response.body_mutation.streamed_response
            last.end_of_stream = False
            chunks.append(protocol.continue_trailers(response=False))
        answers.extend(chunks)
        self._close_after_request()
        return answers

    async def _pick(self, body: bytes | None) -> pb.ProcessingResponse:
        headers = self._headers
        request = PickRequest(
            method=headers.get(":method", "GET"), path=headers.get(":path", "/"), headers=headers,
            body=body, subset=self._subset,
        )  # fmt: skip
        pick = await self._picker.pick(request)
        self._inflight = self._start(pick)
        length = len(body) if body is not None else None
        return protocol.destination_response(pick.endpoints, body_length=length)

    def _close_after_request(self) -> None:
        """``none``: the request is accounted as ended now, and the stream closes cleanly."""
        if self._config.response_mode is ResponseMode.NONE:
            self._status = 200  # not seen: the data plane goes on alone
            self._finish()
            self._closing = True

    def _response_headers(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        headers = protocol.header_map(message.response_headers.headers)
        status = headers.get(":status", "")
        self._status = int(status) if status.isdigit() else 0
        served = protocol.metadata_value(message.metadata_context, protocol.LB_NAMESPACE, protocol.SERVED_KEY)
        if self._inflight is not None and isinstance(served, str):
            self._inflight.served(served.split(",")[0].strip())
        streaming = headers.get("content-type", "").startswith("text/event-stream")
        self._usage = UsageReader(streaming=streaming)
        extra = {"x-kvgate-worker": self._inflight.worker} if self._inflight is not None else None
        answers = [protocol.continue_headers(response=True, extra=extra)]
        if message.response_headers.end_of_stream or self._config.response_mode is not ResponseMode.FULL:
            self._finish()
            self._closing = self._config.response_mode is not ResponseMode.FULL
        return answers

    def _response_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if self._usage is not None:
            self._usage.feed(body.body)
        if body.end_of_stream:
            self._finish()
        return [protocol.streamed_body(body.body, end_of_stream=body.end_of_stream, response=True)]

    def _finish(self) -> None:
        if self._inflight is not None:
            self._inflight.finish(self._status, self._usage.end() if self._usage is not None else None)
