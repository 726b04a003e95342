"""A hostile worker for the adversarial suite: a raw asyncio HTTP/1.1 server (no framework, so it can write
invalid HTTP) whose answer to each POST is chosen by the request itself.

- ``GET /health``: 200; ``GET /v1/models``: one model, ``kvgate-sim``; ``GET /stats``: the POSTs received per
  mode and the connections accepted, as JSON; any other GET: 404.
- ``POST /v1/chat/completions`` and ``/v1/completions``: the mode is the last message's content (chat) or the
  prompt (completions) when it reads ``mode:NAME``, else ``ok``. ``MODES`` says what each mode writes.

Every correct answer's text is ``answer(mode)``; every glued second response carries ``GLUED`` instead, which
must reach no client.

Run: ``python -m tests.support.hostile_worker --port N``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
from typing import Any, Final

import orjson

MODEL: Final = "kvgate-sim"
GLUED: Final = "GLUED-SECOND-BODY"
#: what each mode writes after reading the request
MODES: Final = {
    "ok": "a correct JSON answer with usage (a correct SSE stream when the request asks for one); kept alive",
    "glue": "a correct JSON answer followed, in the same write, by a second complete response; kept alive",
    "close": "a body delimited by closing the connection (no Content-Length, no Transfer-Encoding)",
    "short": "a Content-Length 100 bytes larger than the body, then close",
    "garbage": "bytes that are not HTTP, then close",
    "cl_te": "both Content-Length and Transfer-Encoding: chunked; kept alive",
    "stream_glue": "a complete chunked SSE stream followed, in the same write, by a second response; kept alive",
    "stream_cut": "a chunked SSE stream: two events, then close without [DONE] or the last chunk",
}
_EVENTS: Final = 3  # content events of a stream


def answer(mode: str) -> str:
    """The text every correct answer in ``mode`` carries (a stream: its events' texts joined)."""
    return f"answer to mode:{mode}"


def mode_of(body: bytes) -> tuple[str, bool]:
    """The mode a request body asks for (``ok`` when it names none or an unknown one), and whether it asks
    for a stream."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "ok", False
    if not isinstance(doc, dict):
        return "ok", False
    messages = doc.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        text = messages[-1].get("content")
    else:
        text = doc.get("prompt")
    stream = doc.get("stream") is True
    if isinstance(text, str) and text.startswith("mode:") and text[5:] in MODES:
        return text[5:], stream
    return "ok", stream


def _whole(status: str, body: bytes, ctype: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
    return head % (status.encode(), ctype, len(body)) + body


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p)


_SSE_HEAD: Final = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_LAST_CHUNK: Final = b"0\r\n\r\n"


class Answers:
    """The bodies of one request's answers: JSON and SSE, for chat or completions."""

    def __init__(self, chat: bool) -> None:
        self._chat = chat

    def json(self, text: str) -> bytes:
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if self._chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        kind = "chat.completion" if self._chat else "text_completion"
        usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        return orjson.dumps(
            {
                "id": "hostile-1",
                "object": kind,
                "created": 0,
                "model": MODEL,
                "choices": [choice],
                "usage": usage,
            }
        )

    def event(self, text: str) -> bytes:
        choice: dict[str, Any] = {"index": 0, "finish_reason": None}
        if self._chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        kind = "chat.completion.chunk" if self._chat else "text_completion"
        doc = {"id": "hostile-1", "object": kind, "created": 0, "model": MODEL, "choices": [choice]}
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    def events(self, text: str) -> list[bytes]:
        """``text`` split over ``_EVENTS`` events."""
        step = -(-len(text) // _EVENTS)
        return [self.event(text[i : i + step]) for i in range(0, len(text), step)]

    def stream(self, text: str) -> bytes:
        """A complete chunked SSE response."""
        return _SSE_HEAD + _chunked(*self.events(text), b"data: [DONE]\n\n") + _LAST_CHUNK


class HostileWorker:
    """The server's state: the POSTs received per mode and the connections accepted."""

    def __init__(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await self._one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass  # the gateway closed the connection (it may, mid-answer), or sent what we cannot read
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it; whether the connection stays open."""
        head = await reader.readuntil(b"\r\n\r\n")
        line, *fields = head[:-4].split(b"\r\n")
        method, path, _ = line.split(b" ", 2)
        length = 0
        for field in fields:
            name, _, value = field.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await reader.readexactly(length)
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            return await self._post(writer, body, chat=path == b"/v1/chat/completions")
        if path == b"/health":
            writer.write(_whole("200 OK", b"{}"))
        elif path == b"/v1/models":
            card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "hostile"}
            writer.write(_whole("200 OK", orjson.dumps({"object": "list", "data": [card]})))
        elif path == b"/stats":
            stats = {"requests": dict(self.requests), "connections": self.connections}
            writer.write(_whole("200 OK", orjson.dumps(stats)))
        else:
            writer.write(_whole("404 Not Found", b'{"error": "not found"}'))
        await writer.drain()
        return True

    async def _post(self, writer: asyncio.StreamWriter, body: bytes, *, chat: bool) -> bool:
        mode, wants_stream = mode_of(body)
        self.requests[mode] += 1
        out = Answers(chat)
        text = answer(mode)
        if mode == "ok":
            writer.write(out.stream(text) if wants_stream else _whole("200 OK", out.json(text)))
        elif mode == "glue":
            writer.write(_whole("200 OK", out.json(text)) + _whole("200 OK", out.json(GLUED)))
        elif mode == "close":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + out.json(text))
        elif mode == "short":
            data = out.json(text)
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            writer.write(head % (len(data) + 100) + data)
        elif mode == "garbage":
            writer.write(b"\x16\x03\x01 this is not HTTP at all \xff\xfe\r\n\r\n")
        elif mode == "cl_te":
            data = out.json(text)
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            writer.write(
                head % len(data) + b"transfer-encoding: chunked\r\n\r\n" + _chunked(data) + _LAST_CHUNK
            )
        elif mode == "stream_glue":
            writer.write(out.stream(text) + out.stream(GLUED))
        else:  # stream_cut: two events, a pause (the gateway has started the client's stream), then close
            first, second, *_ = out.events(text)
            writer.write(_SSE_HEAD + _chunked(first))
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(_chunked(second))
        await writer.drain()
        return mode in ("ok", "glue", "cl_te", "stream_glue")


async def serve(port: int) -> None:
    worker = HostileWorker()
    server = await asyncio.start_server(worker.serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
