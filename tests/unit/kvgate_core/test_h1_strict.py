"""The upstream client does not trust the worker's framing (security finding 7).

A response ends where its framing says; any byte after it (in the same read, or later while the connection
waits in the pool) makes the connection unusable: it is closed, never reused and never parsed into another
answer. A close-delimited body is read to EOF; a Content-Length the body falls short of, conflicting framing,
non-HTTP bytes and an oversized head are errors. Each case runs against a raw loopback server that writes
scripted bytes, through ``H1Pool`` and ``H1Connection`` as the proxy uses them.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest

from kvgate_core.h1 import H1Connection, H1Getter, H1Pool, Target, UpstreamConnectionError
from tests.support.waiting import eventually

CLOSE = "close"  # a step: close the connection
#: one step of an answer: bytes to write, seconds to wait, or ``CLOSE``
Step = bytes | float | str


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


def chunked(*parts: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@dataclass
class Scripted:
    """A raw HTTP/1.1 server: the n-th request it reads (over all connections) is answered by ``answers[n]``
    (requests past the script get ``ok(b"extra")``). ``seen`` holds, per request, the connection it came on."""

    answers: Sequence[Sequence[Step]]
    seen: list[int] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.append(task)
        self.connections += 1
        number = self.connections
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                index = len(self.seen)
                self.seen.append(number)
                steps = self.answers[index] if index < len(self.answers) else [ok(b"extra")]
                for step in steps:
                    if isinstance(step, bytes):
                        writer.write(step)
                        await writer.drain()
                    elif isinstance(step, float):
                        await asyncio.sleep(step)
                    else:
                        return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # cancelled: the test is over (a cancelled handler would be logged as an error)
        finally:
            writer.close()

    def abort_all(self) -> None:
        for writer in self._writers:
            writer.transport.abort()

    def reset_all(self) -> None:
        """Close every connection with a reset (RST), not a FIN."""
        for writer in self._writers:
            writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
        self.abort_all()


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    holder = Scripted([])
    server = await asyncio.start_server(holder.serve, "127.0.0.1", 0)
    holder.port = server.sockets[0].getsockname()[1]
    try:
        yield holder
    finally:
        server.close()
        holder.abort_all()
        for task in holder._tasks:
            task.cancel()
        await asyncio.gather(*holder._tasks)
        await server.wait_closed()


@pytest.fixture
async def pool() -> AsyncIterator[H1Pool]:
    pool = H1Pool(connect_timeout_s=2.0)
    try:
        yield pool
    finally:
        pool.close()


def target_of(server: Scripted) -> Target:
    return Target.parse(f"http://127.0.0.1:{server.port}")


async def request(pool: H1Pool, target: Target, method: bytes = b"POST") -> H1Connection:
    data = target.post_request(b"/x", b"{}") if method == b"POST" else target.request(method, b"/x")
    async with asyncio.timeout(5):
        return await pool.post(target, data)


async def body_of(pool: H1Pool, target: Target, conn: H1Connection) -> bytes:
    try:
        async with asyncio.timeout(5):
            return await conn.read_all()
    finally:
        pool.release(target, conn)


async def exchange(pool: H1Pool, target: Target) -> tuple[int, bytes]:
    conn = await request(pool, target)
    return conn.status, await body_of(pool, target, conn)


async def failure(pool: H1Pool, target: Target, method: bytes = b"POST") -> str:
    """The error the exchange raises, headers or body (the test fails if it raises none)."""

    async def whole() -> None:
        conn = await request(pool, target, method)
        await body_of(pool, target, conn)

    with pytest.raises(UpstreamConnectionError) as info:
        await whole()
    return str(info.value)


async def test_keep_alive_still_reuses_a_clean_connection(scripted: Scripted, pool: H1Pool) -> None:
    scripted.answers = [[ok(b"one")], [chunked(b"two")], [b"HTTP/1.1 204 No Content\r\n\r\n"], [ok(b"four")]]
    target = target_of(scripted)
    answers = [await exchange(pool, target) for _ in range(4)]
    assert answers == [(200, b"one"), (200, b"two"), (204, b""), (200, b"four")]
    assert scripted.seen == [1, 1, 1, 1]


# --- bytes after a complete response ---


@pytest.mark.parametrize(
    "second",
    [ok(b"SECOND"), chunked(b"SECOND"), b"\x00garbage", b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nSEC"],
    ids=["whole", "chunked", "garbage", "partial"],
)
async def test_a_second_response_glued_in_the_same_write_is_never_read(
    scripted: Scripted, pool: H1Pool, second: bytes
) -> None:
    scripted.answers = [[ok(b"first") + second], [ok(b"next")]]
    target = target_of(scripted)
    assert await exchange(pool, target) == (200, b"first")
    assert await exchange(pool, target) == (200, b"next")
    assert scripted.seen == [1, 2]  # the spoilt connection was not reused


async def test_a_stream_followed_by_a_second_response_ends_at_its_own_end(
    scripted: Scripted, pool: H1Pool
) -> None:
    scripted.answers = [[chunked(b"data: 1\n\n", b"data: [DONE]\n\n") + chunked(b"data: SECOND\n\n")]]
    target = target_of(scripted)
    conn = await request(pool, target)
    chunks = []
    async with asyncio.timeout(5):
        while chunk := await conn.read_chunk():
            chunks.append(chunk)
    assert conn.drained
    pool.release(target, conn)
    assert b"".join(chunks) == b"data: 1\n\ndata: [DONE]\n\n"
    assert await exchange(pool, target) == (200, b"extra")
    assert scripted.seen == [1, 2]


async def test_a_response_after_connection_close_is_not_read(scripted: Scripted, pool: H1Pool) -> None:
    scripted.answers = [[ok(b"first", b"connection: close\r\n") + ok(b"SECOND")]]
    target = target_of(scripted)
    assert await exchange(pool, target) == (200, b"first")
    assert await exchange(pool, target) == (200, b"extra")
    assert scripted.seen == [1, 2]


async def test_bytes_after_the_response_while_its_body_is_read_spoil_the_connection(
    scripted: Scripted, pool: H1Pool
) -> None:
    scripted.answers = [[ok(b"first"), 0.1, ok(b"SECOND")]]
    target = target_of(scripted)
    conn = await request(pool, target)
    await eventually(lambda: conn.closed, timeout_s=5)  # the second response arrived before the read
    assert (conn.status, await body_of(pool, target, conn)) == (200, b"first")  # the answer stands
    assert await exchange(pool, target) == (200, b"extra")
    assert scripted.seen == [1, 2]


@pytest.mark.parametrize(
    "late",
    [ok(b"LATE"), b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nLATE", b"\r\n"],
    ids=["whole", "partial", "crlf"],
)
async def test_bytes_that_arrive_while_idle_close_the_connection(
    scripted: Scripted, pool: H1Pool, late: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    scripted.answers = [[ok(b"first"), 0.05, late], [ok(b"next")]]
    target = target_of(scripted)
    conn = await request(pool, target)
    assert await body_of(pool, target, conn) == b"first"  # back in the pool, idle
    await eventually(lambda: conn.closed, timeout_s=5)  # the late bytes arrived: closed at once
    assert f"worker 127.0.0.1:{scripted.port} sent bytes after its response" in caplog.text
    assert await exchange(pool, target) == (200, b"next")
    assert scripted.seen == [1, 2]


async def test_bytes_before_the_request_was_sent_are_not_its_answer(scripted: Scripted, pool: H1Pool) -> None:
    scripted.answers = [[ok(b"first")], [ok(b"next")]]
    target = target_of(scripted)
    assert await exchange(pool, target) == (200, b"first")
    # the worker speaks first on the connection the pool holds idle: a response to nothing
    assert len(scripted._writers) == 1
    scripted._writers[0].write(ok(b"UNASKED"))
    await asyncio.sleep(0.1)
    assert await exchange(pool, target) == (200, b"next")
    assert scripted.seen == [1, 2]


# --- close-delimited bodies and truncation ---


async def test_a_close_delimited_body_is_read_to_eof(scripted: Scripted, pool: H1Pool) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n"
    scripted.answers = [[head + b'{"a":', 0.05, b' "b"}', CLOSE], [ok(b"next")]]
    target = target_of(scripted)
    conn = await request(pool, target)
    assert (conn.status, conn.content_type) == (200, b"application/json")
    assert await body_of(pool, target, conn) == b'{"a": "b"}'
    assert conn.complete
    assert await exchange(pool, target) == (200, b"next")
    assert scripted.seen == [1, 2]


async def test_a_close_delimited_answer_to_a_health_probe(scripted: Scripted, pool: H1Pool) -> None:
    scripted.answers = [[b"HTTP/1.0 200 OK\r\n\r\nhealthy", CLOSE]]
    async with asyncio.timeout(5):
        assert await H1Getter(pool)(f"http://127.0.0.1:{scripted.port}", "/health") == (200, b"healthy")


async def test_a_close_delimited_body_cut_by_a_reset_is_an_error(scripted: Scripted, pool: H1Pool) -> None:
    scripted.answers = [[b"HTTP/1.1 200 OK\r\n\r\npartial", 0.2]]
    target = target_of(scripted)
    conn = await request(pool, target)
    assert await conn.read_chunk() == b"partial"
    scripted.reset_all()  # not a FIN: the body may be cut anywhere
    with pytest.raises(UpstreamConnectionError):
        async with asyncio.timeout(5):
            await conn.read_all()
    pool.release(target, conn)


async def test_a_body_shorter_than_its_content_length_is_an_error(scripted: Scripted, pool: H1Pool) -> None:
    scripted.answers = [[b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this", CLOSE]]
    message = await failure(pool, target_of(scripted))
    assert "closed the connection" in message


async def test_the_error_stands_for_a_read_after_the_connection_was_lost(
    scripted: Scripted, pool: H1Pool
) -> None:
    """The reader was busy (not waiting) when the worker closed: its next read still fails, at once."""
    scripted.answers = [[b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this", 0.05, CLOSE]]
    target = target_of(scripted)
    conn = await request(pool, target)
    assert await conn.read_chunk() == b"only this"
    await eventually(lambda: conn.closed, timeout_s=5)
    with pytest.raises(UpstreamConnectionError):
        async with asyncio.timeout(2):
            await conn.read_chunk()
    assert not conn.complete
    pool.release(target, conn)


async def test_a_stream_cut_before_its_last_chunk_is_an_error(scripted: Scripted, pool: H1Pool) -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    scripted.answers = [[head + b"9\r\ndata: 1\n\n\r\n", 0.05, CLOSE]]
    target = target_of(scripted)
    conn = await request(pool, target)
    async with asyncio.timeout(5):
        assert await conn.read_chunk() == b"data: 1\n\n"
        with pytest.raises(UpstreamConnectionError):
            await conn.read_chunk()
    pool.release(target, conn)


# --- framing the client refuses ---


@pytest.mark.parametrize(
    ("head", "says"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 4\r\n\r\n4\r\nbody\r\n0\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-length: 5\r\n\r\nbody", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 4, 5\r\n\r\nbody", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nbody", "transfer coding"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\nbody", "transfer coding"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "bad response"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "bad response"),
        (b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n", "101"),
    ],
    ids=["cl-te", "te-cl", "two-cl", "cl-list", "te-gzip", "te-chunked-gzip", "ssh", "tls", "101"],
)  # fmt: skip
async def test_conflicting_or_foreign_framing_is_an_error(
    scripted: Scripted, pool: H1Pool, head: bytes, says: str
) -> None:
    scripted.answers = [[head, 0.5]]
    target = target_of(scripted)
    assert says in await failure(pool, target)
    assert await exchange(pool, target) == (200, b"extra")
    assert scripted.seen == [1, 2]


async def test_an_oversized_head_is_an_error(scripted: Scripted, pool: H1Pool) -> None:
    pad = b"".join(b"x-pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(70))  # 70 KiB of header lines
    scripted.answers = [[b"HTTP/1.1 200 OK\r\n" + pad + b"content-length: 2\r\n\r\nok"]]
    assert "head" in await failure(pool, target_of(scripted))


async def test_a_head_that_never_ends_is_an_error_once_over_the_bound(
    scripted: Scripted, pool: H1Pool
) -> None:
    line = b"x-pad: " + b"a" * 4000 + b"\r\n"
    scripted.answers = [[b"HTTP/1.1 200 OK\r\n", *[s for _ in range(40) for s in (line, 0.002)], 5.0]]
    assert "head" in await failure(pool, target_of(scripted))


async def test_a_header_line_that_never_ends_is_an_error_once_over_the_bound(
    scripted: Scripted, pool: H1Pool
) -> None:
    scripted.answers = [
        [b"HTTP/1.1 200 OK\r\nx-big: ", *[s for _ in range(40) for s in (b"a" * 4000, 0.002)], 5.0]
    ]
    assert "head" in await failure(pool, target_of(scripted))


async def test_a_large_body_in_the_first_read_is_not_taken_for_a_large_head(
    scripted: Scripted, pool: H1Pool
) -> None:
    body = b"b" * (1 << 20)
    scripted.answers = [[ok(body)]]
    assert await exchange(pool, target_of(scripted)) == (200, body)


# --- interim responses and HEAD ---


@pytest.mark.parametrize("pause", [False, True], ids=["one-write", "two-writes"])
async def test_interim_responses_are_skipped(scripted: Scripted, pool: H1Pool, pause: bool) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n"
    final = ok(b"final", b"content-type: application/json\r\n")
    scripted.answers = [[interim, 0.05, final] if pause else [interim + final], [ok(b"next")]]
    target = target_of(scripted)
    conn = await request(pool, target)
    assert (conn.status, conn.content_type) == (200, b"application/json")
    assert await body_of(pool, target, conn) == b"final"
    assert await exchange(pool, target) == (200, b"next")
    assert scripted.seen == [1, 1]  # a clean exchange: kept alive


async def test_endless_interim_responses_are_an_error(scripted: Scripted, pool: H1Pool) -> None:
    scripted.answers = [[b"HTTP/1.1 100 Continue\r\nx-pad: aaaaaaaaaa\r\n\r\n" * 5000, 1.0]]
    assert "head" in await failure(pool, target_of(scripted))


async def test_a_response_to_head_has_no_body(scripted: Scripted, pool: H1Pool) -> None:
    scripted.answers = [
        [b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 10\r\n\r\n"],
        [ok(b"next")],
    ]
    target = target_of(scripted)
    conn = await request(pool, target, b"HEAD")
    assert conn.status == 200
    assert await body_of(pool, target, conn) == b""
    assert await exchange(pool, target) == (200, b"next")


async def test_a_body_sent_to_head_is_not_read(scripted: Scripted, pool: H1Pool) -> None:
    scripted.answers = [[ok(b"0123456789")], [ok(b"next")]]
    target = target_of(scripted)
    conn = await request(pool, target, b"HEAD")
    assert await body_of(pool, target, conn) == b""
    assert await exchange(pool, target) == (200, b"next")
    assert scripted.seen == [1, 2]
