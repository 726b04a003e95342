"""The proxy's HTTP/1.1 client against a real aiohttp server: reuse, chunked bodies, closed idle links."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from kvgate_core.h1 import H1Pool, Target, UpstreamConnectionError
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
