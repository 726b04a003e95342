"""The proxy's HTTP/1.1 client against a real aiohttp server: reuse, chunked bodies, closed idle links."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from kvgate_core.h1 import H1Pool, PoolSaturatedError, PoolWaitTimeoutError, Target, UpstreamConnectionError
from tests.support.procs import free_port


@pytest.fixture
async def server() -> AsyncIterator[tuple[Target, list[object]]]:
    peers: list[object] = []

    async def echo(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        body = await request.read()
        if request.path == "/base/chunked":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for part in (b"data: 1\n\n", b"data: 2\n\n"):
                await resp.write(part)
            await resp.write_eof()
            return resp
        headers = {"x-pd": request.headers.get("x-kvgate-pd", "")}
        return web.Response(body=body, content_type="application/json", headers=headers)

    app = web.Application()
    app.router.add_post("/{tail:.*}", echo)
    runner = web.AppRunner(app, handle_signals=False, keepalive_timeout=0.05)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield Target.parse(f"http://127.0.0.1:{port}/base"), peers
    finally:
        await runner.cleanup()


async def test_post_reuses_the_connection_and_reads_bodies(server: tuple[Target, list[object]]) -> None:
    target, peers = server
    pool = H1Pool(connect_timeout_s=1.0)
    bodies = []
    for i in range(3):
        conn = await pool.post(
            target, target.post_request(b"/echo", b'{"i":%d}' % i, b"x-kvgate-pd: decode\r\n")
        )
        bodies.append((conn.status, conn.content_type, await conn.read_all()))
        pool.release(target, conn)
    pool.close()
    assert bodies == [(200, b"application/json", b'{"i":%d}' % i) for i in range(3)]
    assert len(set(peers)) == 1


async def test_chunked_stream_is_decoded(server: tuple[Target, list[object]]) -> None:
    target, _ = server
    pool = H1Pool(connect_timeout_s=1.0)
    conn = await pool.post(target, target.post_request(b"/chunked", b"{}"))
    chunks = []
    while chunk := await conn.read_chunk():
        chunks.append(chunk)
    pool.release(target, conn)
    pool.close()
    assert b"".join(chunks) == b"data: 1\n\ndata: 2\n\n"


async def test_connection_closed_while_idle_is_replaced(server: tuple[Target, list[object]]) -> None:
    target, peers = server
    pool = H1Pool(connect_timeout_s=1.0)
    conn = await pool.post(target, target.post_request(b"/a", b"{}"))
    await conn.read_all()
    pool.release(target, conn)
    await asyncio.sleep(0.3)  # past the server's keep-alive timeout: it closes the idle connection
    again = await pool.post(target, target.post_request(b"/b", b"{}"))
    assert await again.read_all() == b"{}"
    pool.release(target, again)
    pool.close()
    assert len(set(peers)) == 2


async def test_refused_connection_raises() -> None:
    pool = H1Pool(connect_timeout_s=1.0)
    with pytest.raises(UpstreamConnectionError):
        await pool.post(Target.parse(f"http://127.0.0.1:{free_port()}"), b"")


async def test_a_cancelled_request_on_a_reused_connection_closes_it() -> None:
    closed = asyncio.Event()
    served = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        while await reader.readuntil(b"\r\n\r\n"):
            served += 1
            if served == 1:  # answer the first request only; the second one hangs
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        closed.set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handle(reader, writer)
        except asyncio.IncompleteReadError:
            closed.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = H1Pool(connect_timeout_s=1.0)
    target = Target.parse(f"http://127.0.0.1:{port}")
    try:
        conn = await pool.post(target, target.get_request(b"/health"))
        assert (conn.status, await conn.read_all()) == (200, b"ok")
        pool.release(target, conn)  # kept alive, idle
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.post(target, target.get_request(b"/health"))  # reuses it, then is cancelled
        assert conn.closed
        await asyncio.wait_for(closed.wait(), 5)  # the worker saw the connection go
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def test_fetch_reads_the_whole_answer_and_keeps_the_connection(
    server: tuple[Target, list[object]],
) -> None:
    target, peers = server
    pool = H1Pool(connect_timeout_s=1.0)
    answers = [await pool.fetch(target, target.post_request(b"/echo", b'{"i":%d}' % i)) for i in range(2)]
    pool.close()
    assert answers == [(200, b'{"i":%d}' % i) for i in range(2)]
    assert len(set(peers)) == 1


async def test_fetch_cancelled_mid_body_closes_the_connection() -> None:
    connections: list[asyncio.Event] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        gone = asyncio.Event()
        connections.append(gone)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nok")  # 8 bytes short, then silence
        await writer.drain()
        await reader.read()
        gone.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    target = Target.parse(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    pool = H1Pool(connect_timeout_s=1.0)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.fetch(target, target.get_request(b"/x"))
        await asyncio.wait_for(connections[0].wait(), 5)  # the worker saw the connection go
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.fetch(target, target.get_request(b"/x"))
        assert len(connections) == 2  # the half-read connection never went back to the pool
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


# --- the per-host cap, the wait queue and paced connects (real loopback sockets) ---


class CountingServer:
    """A raw HTTP/1.1 server that counts connections and requests (each answered after ``delay_s``)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.connections = 0
        self.requests = 0
        self.delay_s = delay_s
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._done: list[asyncio.Event] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        done = asyncio.Event()
        self._writers.append(writer)
        self._done.append(done)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.requests += 1
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            done.set()

    async def __aenter__(self) -> Target:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return Target.parse(f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}")

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await asyncio.wait_for(asyncio.gather(*(d.wait() for d in self._done)), 5)
        await self._server.wait_closed()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0.01)


async def test_the_request_over_the_cap_waits_and_reuses_the_released_connection() -> None:
    async with CountingServer() as target:
        pool = H1Pool(connect_timeout_s=1.0, max_connections=1)
        first = await pool.post(target, target.get_request(b"/a"))
        second = asyncio.create_task(pool.post(target, target.get_request(b"/b")))
        await _settle()
        assert not second.done()
        assert (pool.waiting(target), pool.num_waiting, pool.open_connections(target)) == (1, 1, 1)
        assert await first.read_all() == b"ok"
        pool.release(target, first)
        conn = await asyncio.wait_for(second, 5)
        assert conn is first  # handed over, reused
        assert await conn.read_all() == b"ok"
        pool.release(target, conn)
        pool.close()
    assert pool.num_waiting == 0


async def test_a_per_call_limit_overrides_the_pool_default() -> None:
    server = CountingServer()
    async with server as target:
        pool = H1Pool(connect_timeout_s=1.0, max_connections=100)
        first = await pool.post(target, target.get_request(b"/a"), limit=1)
        second = asyncio.create_task(pool.post(target, target.get_request(b"/b"), limit=1))
        await _settle()
        assert pool.waiting(target) == 1
        await first.read_all()
        pool.release(target, first)
        pool.release(target, await asyncio.wait_for(second, 5))
        pool.close()
    assert server.connections == 1


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    server = CountingServer()
    async with server as target:
        pool = H1Pool(connect_timeout_s=1.0, max_connections=1, max_waiting=1)
        first = await pool.post(target, target.get_request(b"/a"))
        waiter = asyncio.create_task(pool.post(target, target.get_request(b"/b")))
        await _settle()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (pool.waiting(target), pool.num_waiting) == (0, 0)
        # its place is free again: one more may wait
        again = asyncio.create_task(pool.post(target, target.get_request(b"/c")))
        await _settle()
        assert pool.waiting(target) == 1
        await first.read_all()
        pool.release(target, first)
        pool.release(target, await asyncio.wait_for(again, 5))
        pool.close()
    assert (server.connections, server.requests) == (1, 2)  # the cancelled one never reached the worker


async def test_a_connection_handed_to_a_waiter_that_left_goes_to_the_next() -> None:
    server = CountingServer()
    async with server as target:
        pool = H1Pool(connect_timeout_s=1.0, max_connections=1)
        first = await pool.post(target, target.get_request(b"/a"))
        leaving = asyncio.create_task(pool.post(target, target.get_request(b"/b")))
        staying = asyncio.create_task(pool.post(target, target.get_request(b"/c")))
        await _settle()
        await first.read_all()
        pool.release(target, first)  # handed to ``leaving``, which is cancelled before it runs
        leaving.cancel()
        conn = await asyncio.wait_for(staying, 5)
        assert conn is first
        assert leaving.cancelled()
        pool.release(target, conn)
        pool.close()
    assert server.connections == 1


async def test_a_full_queue_refuses_at_once_without_writing() -> None:
    server = CountingServer()
    async with server as target:
        pool = H1Pool(connect_timeout_s=1.0, max_connections=1, max_waiting=1)
        first = await pool.post(target, target.get_request(b"/a"))
        waiter = asyncio.create_task(pool.post(target, target.get_request(b"/b")))
        await _settle()
        with pytest.raises(PoolSaturatedError) as refused:
            await pool.post(target, target.get_request(b"/c"))
        assert not isinstance(refused.value, PoolWaitTimeoutError)
        assert "cap 1" in str(refused.value)
        assert (server.connections, server.requests) == (1, 1)
        await first.read_all()
        pool.release(target, first)
        pool.release(target, await asyncio.wait_for(waiter, 5))
        pool.close()


async def test_a_wait_past_the_longest_wait_times_out() -> None:
    server = CountingServer()
    async with server as target:
        pool = H1Pool(connect_timeout_s=1.0, max_connections=1, max_wait_s=0.05)
        first = await pool.post(target, target.get_request(b"/a"))
        with pytest.raises(PoolWaitTimeoutError):
            await pool.post(target, target.get_request(b"/b"))
        assert pool.num_waiting == 0
        await first.read_all()
        pool.release(target, first)
        pool.close()
    assert server.requests == 1


async def test_a_burst_opens_at_most_the_cap_and_every_request_completes() -> None:
    server = CountingServer(delay_s=0.005)

    async def one(target: Target, pool: H1Pool, i: int) -> bytes:
        conn = await pool.post(target, target.post_request(b"/x", b'{"i":%d}' % i))
        try:
            return await conn.read_all()
        finally:
            pool.release(target, conn)

    async with server as target:
        pool = H1Pool(connect_timeout_s=1.0, max_connections=8, max_waiting=64)
        async with asyncio.timeout(10):
            bodies = await asyncio.gather(*(one(target, pool, i) for i in range(50)))
        pool.close()
    assert bodies == [b"ok"] * 50
    assert server.connections <= 8
    assert server.requests == 50


async def test_connects_are_paced(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    real = loop.create_connection
    in_flight, most = 0, 0

    async def slow_connect(*args: object, **kwargs: object) -> object:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.01)
            return await real(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            in_flight -= 1

    monkeypatch.setattr(loop, "create_connection", slow_connect)
    server = CountingServer(delay_s=0.02)
    async with server as target:
        pool = H1Pool(connect_timeout_s=1.0, max_connections=40, max_connecting=3)
        conns = await asyncio.wait_for(
            asyncio.gather(*(pool.post(target, target.get_request(b"/x")) for _ in range(20))), 10
        )
        for conn in conns:
            await conn.read_all()
            pool.release(target, conn)
        pool.close()
    assert most == 3
    assert server.requests == 20


async def test_lowering_the_cap_closes_the_excess_on_release() -> None:
    server = CountingServer()
    async with server as target:
        pool = H1Pool(connect_timeout_s=1.0, max_connections=4)
        conns = [await pool.post(target, target.get_request(b"/x")) for _ in range(3)]
        waiter = asyncio.create_task(pool.post(target, target.get_request(b"/y"), limit=1))
        await _settle()
        assert pool.waiting(target) == 1  # 3 open, the cap now 1
        for conn in conns:
            await conn.read_all()
            pool.release(target, conn)  # the first two close (over the cap), the third is handed over
        last = await asyncio.wait_for(waiter, 5)
        assert last is conns[2]
        assert (conns[0].closed, conns[1].closed) == (True, True)
        await last.read_all()
        pool.release(target, last)
        assert pool.open_connections(target) == 1
        pool.close()
    assert server.connections == 3


async def test_closing_the_pool_fails_the_waiters() -> None:
    async with CountingServer() as target:
        pool = H1Pool(connect_timeout_s=1.0, max_connections=1)
        first = await pool.post(target, target.get_request(b"/a"))
        waiter = asyncio.create_task(pool.post(target, target.get_request(b"/b")))
        await _settle()
        pool.close()
        with pytest.raises(UpstreamConnectionError):
            await asyncio.wait_for(waiter, 5)
        await first.read_all()
        pool.release(target, first)
        assert pool.open_connections(target) == 0


async def test_a_connect_seen_late_because_the_loop_stalled_is_not_failed() -> None:
    async with CountingServer() as target:
        pool = H1Pool(connect_timeout_s=0.2)
        asyncio.get_running_loop().call_soon(time.sleep, 0.5)  # the loop is busy past the connect deadline
        conn = await pool.post(target, target.get_request(b"/x"))
        assert await conn.read_all() == b"ok"
        pool.release(target, conn)
        pool.close()


async def test_a_connect_that_never_completes_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(*_args: object, **_kwargs: object) -> object:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "create_connection", never)
    pool = H1Pool(connect_timeout_s=0.1)
    target = Target.parse("http://127.0.0.1:9")
    started = loop.time()
    with pytest.raises(UpstreamConnectionError, match="timed out"):
        await pool.post(target, target.get_request(b"/x"))
    assert 0.1 <= loop.time() - started < 0.5
    assert pool.open_connections(target) == 0
