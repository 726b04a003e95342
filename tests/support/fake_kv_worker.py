"""A tiny real HTTP server speaking a worker's KV surface: ``GET /kv/blocks`` and ``GET /kv/events`` (SSE).

For the KV index feed tests (owned by the kvindex tests); it runs in the test's event loop on loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson
from aiohttp import web

from kvgate_core.kvcontract.events import KVEvent, encode_events
from tests.support.procs import free_port


class FakeKVWorker:
    def __init__(self, worker_id: str, *, block_size: int = 16) -> None:
        self.worker_id = worker_id
        self.block_size = block_size
        self.tiers: dict[str, list[int]] = {"gpu": []}
        self.port = free_port()
        self.num_snapshots = 0
        self._subscribers: list[asyncio.Queue[bytes | None]] = []
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def num_subscribers(self) -> int:
        return len(self._subscribers)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/kv/blocks", self._blocks)
        app.router.add_get("/kv/events", self._events)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        self.drop_connections()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def emit(self, events: Sequence[KVEvent]) -> None:
        payload = encode_events(events)
        for queue in self._subscribers:
            queue.put_nowait(payload)

    def drop_connections(self) -> None:
        for queue in self._subscribers:
            queue.put_nowait(None)

    async def _blocks(self, request: web.Request) -> web.Response:
        self.num_snapshots += 1
        body = {"worker": self.worker_id, "block_size": self.block_size, "tiers": self.tiers}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._subscribers.append(queue)
        try:
            await resp.write(b": connected\n\n")
            while True:
                try:
                    payload = await asyncio.wait_for(queue.get(), 0.05)
                except TimeoutError:
                    await resp.write(b": heartbeat\n\n")  # notices a client that went away
                    continue
                if payload is None:
                    break
                await resp.write(b"data: " + payload + b"\n\n")
        except ConnectionError:
            pass
        finally:
            self._subscribers.remove(queue)
        return resp
