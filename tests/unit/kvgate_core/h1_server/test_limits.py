"""The lean server against hostile clients, in both builds (``make test`` runs it compiled, CI's unit pass as
plain Python): pipelining without errors, absolute-form targets, head bytes counted as they arrive, deadlines
for a head and a body, and a body that is complete only when its framing says so."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kvgate_core.asgi import Message, Receive, Scope, Send
from kvgate_core.h1_server.context import ServerLimits
from tests.unit.kvgate_core.h1_server.harness import Client, request, running
from tests.unit.kvgate_core.h1_server.test_protocol import echo

pytestmark = pytest.mark.timeout(30)


def _no_errors(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not bad, [r.getMessage() for r in bad]


async def test_pipelined_requests_in_one_write_log_no_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with running(echo) as (_, port):
        client = await Client.connect(port)
        await client.send(b"".join(request("POST", f"/{i}", b"x%d" % i) for i in range(3)))
        answers = await client.responses(3)
        assert [a.body for a in answers] == [b"POST /%d  x%d" % (i, i) for i in range(3)]
        await client.send(request("GET", "/after"))  # the connection still serves
        (after,) = await client.responses()
        assert after.body == b"GET /after  "
        client.close()
    _no_errors(caplog)


async def test_absolute_form_targets(caplog: pytest.LogCaptureFixture) -> None:
    async with running(echo) as (_, port):
        for target, body in (
            ("http://x/health", b"GET /health  "),
            ("http://x/a%20b?q=1", b"GET /a b q=1 "),
            ("HTTP://X", b"GET /  "),
        ):
            client = await Client.connect(port)
            await client.send(request("GET", target))
            (resp,) = await client.responses()
            assert (resp.status, resp.body) == (200, body), target
            client.close()
        for target in ("*", "ftp://x/a", "x:80"):
            client = await Client.connect(port)
            await client.send(request("OPTIONS" if target == "*" else "GET", target))
            assert (await client.raw()).startswith(b"HTTP/1.1 400 "), target
    _no_errors(caplog)


async def test_a_header_line_that_never_ends_is_refused_as_it_arrives() -> None:
    limits = ServerLimits(max_head_bytes=16 * 1024)
    async with running(echo, limits=limits) as (_, port):
        client = await Client.connect(port)
        await client.send(b"GET / HTTP/1.1\r\nhost: t\r\nx-endless: ")
        sent = 0
        refused = False
        try:
            while sent < 8 * 1024 * 1024:  # the server must refuse long before: nothing it keeps grows
                await client.send(b"a" * 8192)
                sent += 8192
                await asyncio.sleep(0)
        except ConnectionError:
            refused = True
        raw = await client.raw() if not refused else b""
        assert refused or raw.startswith(b"HTTP/1.1 431 ")
        assert sent < 4 * 1024 * 1024


async def test_a_request_line_that_never_ends_is_refused() -> None:
    async with running(echo, limits=ServerLimits(max_head_bytes=4096)) as (_, port):
        client = await Client.connect(port)
        await client.send(b"GET /" + b"a" * 3000)
        await client.send(b"a" * 3000)
        assert (await client.raw()).startswith(b"HTTP/1.1 431 ")


async def _trickle(client: Client, data: bytes, pace_s: float) -> bytes:
    """Write ``data`` a byte every ``pace_s`` until the server answers; its first bytes (written before the
    next byte would meet a closed connection and lose them to a reset)."""
    first = asyncio.ensure_future(client.reader.read(65536))
    for byte in data:
        await asyncio.sleep(pace_s)
        if first.done():
            break
        client.writer.write(bytes([byte]))
    async with asyncio.timeout(5):
        return await first


@pytest.mark.parametrize("pace_s", [None, 0.05])
async def test_a_head_that_does_not_end_in_time_gets_408(pace_s: float | None) -> None:
    loop = asyncio.get_running_loop()
    async with running(echo, limits=ServerLimits(head_timeout_s=0.3)) as (_, port):
        client = await Client.connect(port)
        start = loop.time()
        await client.send(b"G")
        if pace_s is None:
            raw = await client.raw()
        else:  # a byte at a time, never done: the deadline counts from the first byte
            raw = await _trickle(client, b"ET / HTTP/1.1\r\nx-slow: " + b"a" * 60, pace_s)
        assert raw.startswith(b"HTTP/1.1 408 "), raw[:60]
        assert 0.25 <= loop.time() - start < 2.5


async def test_the_head_deadline_applies_to_later_requests_on_a_keep_alive_connection() -> None:
    async with running(echo, limits=ServerLimits(head_timeout_s=0.3, keep_alive_s=5)) as (_, port):
        client = await Client.connect(port)
        for _ in range(3):  # quick heads are fine, well past one head timeout in all
            await client.send(request("GET", "/?delay"))
            assert (await client.responses())[0].status == 200
        await client.send(b"GET / HTTP/1.1\r\n")
        assert (await client.raw()).startswith(b"HTTP/1.1 408 ")


async def test_a_body_that_trickles_gets_408_and_the_app_reads_a_disconnect() -> None:
    seen: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while True:
            message = await receive()
            seen.append(message)
            if message["type"] != "http.request" or not message["more_body"]:
                break
        if message["type"] == "http.request":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"whole"})

    limits = ServerLimits(body_timeout_s=0.3, min_body_rate=1000)
    async with running(app, limits=limits) as (_, port):
        client = await Client.connect(port)
        await client.send(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\nx")
        raw = await _trickle(client, b"x" * 60, 0.05)  # 20 B/s, far below the minimum
        assert raw.startswith(b"HTTP/1.1 408 "), raw[:60]
        assert seen and seen[-1]["type"] == "http.disconnect"
        assert all(m["type"] != "http.request" or m["more_body"] for m in seen)  # never taken as whole


async def test_a_body_at_a_sane_rate_outlasts_the_body_timeout() -> None:
    limits = ServerLimits(body_timeout_s=0.2, min_body_rate=1000)
    async with running(echo, limits=limits) as (_, port):
        client = await Client.connect(port)
        await client.send(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 2000\r\n\r\n")
        for _ in range(10):  # 200 bytes every 50 ms: 4,000 B/s over 0.5 s, past the 0.2 s base
            await asyncio.sleep(0.05)
            await client.send(b"y" * 200)
        (resp,) = await client.responses()
        assert resp.status == 200 and resp.body.endswith(b"y" * 2000)
        client.close()


async def test_expect_100_continue_does_not_start_the_body_clock_before_the_app_reads() -> None:
    async def late_reader(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await asyncio.sleep(0.5)  # past the body timeout: the client waits for 100, not its fault
        await echo(scope, receive, send)

    limits = ServerLimits(body_timeout_s=0.2, min_body_rate=1000)
    async with running(late_reader, limits=limits) as (_, port):
        client = await Client.connect(port)
        await client.send(b"POST / HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\n")
        interim = await client.reader.readuntil(b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100 ")
        await client.send(b"abc")
        (resp,) = await client.responses()
        assert resp.status == 200 and resp.body.endswith(b"abc")
        client.close()
