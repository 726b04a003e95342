"""``cancel_on_disconnect`` on the lean server (its disconnect callback) and on a plain ``receive``."""

from __future__ import annotations

import asyncio

import pytest

from gateway.proxy.disconnect import cancel_on_disconnect
from kvgate_core.asgi import Message, Receive, Scope, Send, disconnect_watch
from tests.unit.kvgate_core.h1_server.harness import Client, request, running


class _Hanging:
    """An app whose attempt never ends by itself: records how ``cancel_on_disconnect`` ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.outcome: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.watched: bool | None = None

    async def work(self) -> str:
        self.started.set()
        await asyncio.sleep(3600)
        return "finished"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await receive()  # the body
        self.watched = disconnect_watch(receive) is not None
        try:
            result = await cancel_on_disconnect(self.work(), receive)
        except BaseException as exc:
            self.outcome.set_result(type(exc))
            raise
        self.outcome.set_result(result)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"late"})


async def test_a_client_leaving_cancels_the_work_through_the_servers_callback() -> None:
    app = _Hanging()
    async with running(app) as (_server, port):
        client = await Client.connect(port)
        await client.send(request("POST", "/", b"{}"))
        await asyncio.wait_for(app.started.wait(), 5)
        client.close()
        assert await asyncio.wait_for(app.outcome, 5) is None
    assert app.watched is True  # the callback path, no watcher task


async def test_a_shutdown_cancellation_is_not_taken_for_a_disconnect() -> None:
    app = _Hanging()
    async with running(app, grace_s=0.1) as (server, port):
        client = await Client.connect(port)
        await client.send(request("POST", "/", b"{}"))
        await asyncio.wait_for(app.started.wait(), 5)
        server.request_stop()  # the grace runs out: the server cancels the request's task
        assert await asyncio.wait_for(app.outcome, 5) is asyncio.CancelledError
        client.close()


async def test_work_that_finishes_returns_its_result_and_stops_watching() -> None:
    calls: list[object] = []

    class _Watcher:
        def watch_disconnect(self, callback: object) -> bool:
            calls.append(callback)
            return True

        async def receive(self) -> Message:
            raise AssertionError("the callback path never reads receive")

    async def work() -> int:
        await asyncio.sleep(0)
        return 7

    assert await cancel_on_disconnect(work(), _Watcher().receive) == 7
    assert len(calls) == 2
    assert calls[1] is None  # unregistered


async def test_a_client_gone_before_the_work_starts_returns_none_at_once() -> None:
    class _Gone:
        def watch_disconnect(self, callback: object) -> bool:
            return False

        async def receive(self) -> Message:
            return {"type": "http.disconnect"}

    ran: list[bool] = []

    async def work() -> int:
        ran.append(True)
        return 1

    assert await cancel_on_disconnect(work(), _Gone().receive) is None
    assert ran == []


@pytest.mark.parametrize("leave", [False, True])
async def test_a_plain_receive_is_watched_by_a_task(leave: bool) -> None:
    gone = asyncio.Event()

    async def receive() -> Message:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def work() -> str:
        await asyncio.sleep(3600 if leave else 0)
        return "done"

    task = asyncio.create_task(cancel_on_disconnect(work(), receive))
    await asyncio.sleep(0.01)
    if leave:
        gone.set()
    assert await asyncio.wait_for(task, 5) == (None if leave else "done")
