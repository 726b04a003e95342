"""The lean server's lifespan, scope and graceful shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kvgate_core.asgi import Receive, Scope, Send
from kvgate_core.h1_server.server import H1Server
from tests.unit.kvgate_core.h1_server.harness import Client, request, running

pytestmark = pytest.mark.timeout(20)


class StreamingApp:
    """Lifespan stores ``state``; ``/stream`` sends 10 chunks 50 ms apart; ``/scope`` answers the scope."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.streaming = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                self.events.append(message["type"])
                if message["type"] == "lifespan.startup":
                    scope["state"]["greeting"] = "hi"
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if scope["path"] == "/scope":
            keys = ("http_version", "method", "path", "raw_path", "query_string", "scheme", "root_path")
            seen: dict[str, Any] = {k: scope[k] for k in keys}
            seen.update(state=scope["state"], client=scope["client"][0], server=scope["server"][0])
            seen["headers"] = scope["headers"]
            await send({"type": "http.response.body", "body": repr(seen).encode()})
            return
        self.streaming.set()
        for i in range(10):
            await send({"type": "http.response.body", "body": b"%d;" % i, "more_body": True})
            await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b"done"})


async def test_the_scope_has_the_request_and_the_lifespan_state() -> None:
    app = StreamingApp()
    async with running(app) as (_, port):
        client = await Client.connect(port)
        await client.send(request("GET", "/scope?x=%41", extra="X-Mixed-Case: V\r\n"))
        (resp,) = await client.responses()
        seen = eval(resp.body)
        assert seen["http_version"] == "1.1" and seen["method"] == "GET" and seen["path"] == "/scope"
        assert seen["raw_path"] == b"/scope" and seen["query_string"] == b"x=%41"
        assert seen["scheme"] == "http" and seen["root_path"] == ""
        assert seen["state"] == {"greeting": "hi"}
        assert seen["client"] == "127.0.0.1" and seen["server"] == "127.0.0.1"
        assert (b"x-mixed-case", b"V") in seen["headers"]
        client.close()
    assert app.events == ["lifespan.startup", "lifespan.shutdown"]


async def test_shutdown_lets_an_in_flight_stream_finish_and_closes_idle_connections() -> None:
    app = StreamingApp()
    async with running(app) as (server, port):
        idle = await Client.connect(port)
        streaming = await Client.connect(port)
        await streaming.send(request("GET", "/stream"))
        async with asyncio.timeout(5):
            await app.streaming.wait()
        server.request_stop()
        assert await idle.closed_by_server()
        (resp,) = await streaming.responses()
        assert resp.body == b"0;1;2;3;4;5;6;7;8;9;done"
        assert await streaming.closed_by_server()
        with pytest.raises(OSError):
            await Client.connect(port)  # no longer accepting


async def test_shutdown_cuts_what_outlives_the_grace_period() -> None:
    app = StreamingApp()
    async with running(app, grace_s=0.1) as (server, port):
        client = await Client.connect(port)
        await client.send(request("GET", "/stream"))
        async with asyncio.timeout(5):
            await app.streaming.wait()
        server.request_stop()
        raw = await client.raw()
        assert b"done" not in raw


async def test_a_failed_startup_means_no_serving() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "lifespan"
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no workers"})

    server = H1Server(app)
    async with asyncio.timeout(5):
        await server.serve("127.0.0.1", 0)
    assert not server.started
