"""The lean HTTP/1.1 server over real loopback sockets: framing, keep-alive, pipelining, bodies, errors."""

from __future__ import annotations

import asyncio

import pytest

from kvgate_core.asgi import Message, Receive, Scope, Send
from kvgate_core.h1_server.context import ServerLimits
from tests.unit.kvgate_core.h1_server.harness import Client, request, running

pytestmark = pytest.mark.timeout(20)


async def _read_body(receive: Receive) -> tuple[bytes, int]:
    body, parts = b"", 0
    while True:
        message = await receive()
        assert message["type"] == "http.request"
        body += message["body"]
        parts += 1
        if not message["more_body"]:
            return body, parts


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers ``METHOD path query body``; ``?delay`` sleeps first, ``?stream`` answers in two parts."""
    if scope["type"] != "http":
        return
    body, _ = await _read_body(receive)
    query = scope["query_string"]
    if b"delay" in query:
        await asyncio.sleep(0.2)
    text = f"{scope['method']} {scope['path']} {query.decode()} ".encode() + body
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"echo")]})
    if b"stream" in query:
        await send({"type": "http.response.body", "body": text, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": True})  # no empty chunk on wire
        await send({"type": "http.response.body", "body": b"|end", "more_body": False})
    else:
        await send({"type": "http.response.body", "body": text})


async def test_keep_alive_serves_requests_on_one_connection_with_content_length() -> None:
    async with running(echo) as (_, port):
        client = await Client.connect(port)
        for i in range(3):
            await client.send(request("POST", f"/a%20b?i={i}", b"hello"))
            (resp,) = await client.responses()
            assert resp.status == 200
            assert resp.body == f"POST /a b i={i} hello".encode()
            assert resp.headers["content-length"] == str(len(resp.body))
            assert resp.headers["x-app"] == "echo" and "date" in resp.headers
        client.close()


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with running(echo) as (_, port):
        client = await Client.connect(port)
        await client.send(
            request("GET", "/1?delay") + request("POST", "/2", b"x") + request("GET", "/3?stream")
        )
        first, second, third = await client.responses(3)
        assert first.body == b"GET /1 delay "
        assert second.body == b"POST /2  x"
        assert third.body == b"GET /3 stream |end" and third.chunked
        client.close()


async def test_chunked_request_body_arrives_through_receive_in_parts() -> None:
    seen: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body, parts = await _read_body(receive)
        seen.append(parts)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    async with running(app) as (_, port):
        client = await Client.connect(port)
        await client.send(b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await asyncio.sleep(0.05)
        await client.send(b"6\r\n world\r\n0\r\n\r\n")
        (resp,) = await client.responses()
        assert resp.body == b"hello world"
        assert seen == [2]
        client.close()


async def test_chunked_response_when_the_app_gives_no_length() -> None:
    async with running(echo) as (_, port):
        client = await Client.connect(port)
        await client.send(request("GET", "/s?stream"))
        (resp,) = await client.responses()
        assert resp.chunked and "content-length" not in resp.headers
        assert resp.body == b"GET /s stream |end"
        await client.send(request("GET", "/again"))  # the connection stays usable
        assert (await client.responses())[0].body == b"GET /again  "
        client.close()


async def test_expect_100_continue_is_answered_when_the_app_reads_the_body() -> None:
    async with running(echo) as (_, port):
        client = await Client.connect(port)
        await client.send(b"POST /c HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n")
        async with asyncio.timeout(5):
            interim = await client.reader.readuntil(b"\r\n\r\n")
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        await client.send(b"data")
        (resp,) = await client.responses()
        assert resp.body == b"POST /c  data"
        client.close()


async def test_head_answers_the_headers_and_no_body() -> None:
    async with running(echo) as (_, port):
        client = await Client.connect(port)
        await client.send(request("HEAD", "/h") + request("GET", "/next"))
        async with asyncio.timeout(5):
            head = await client.reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 9\r\n" in head  # "HEAD /h  "
        (resp,) = await client.responses()  # the next response follows at once: no body bytes in between
        assert resp.body == b"GET /next  "
        client.close()


async def test_the_client_leaving_reaches_the_app_as_http_disconnect() -> None:
    got: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await _read_body(receive)
        got.set_result(await receive())

    async with running(app) as (_, port):
        client = await Client.connect(port)
        await client.send(request("POST", "/", b"x"))
        await asyncio.sleep(0.05)
        client.close()
        async with asyncio.timeout(5):
            assert (await got)["type"] == "http.disconnect"


async def test_an_error_before_the_response_starts_answers_500_and_closes() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raise ValueError("boom")

    async with running(app) as (_, port):
        client = await Client.connect(port)
        await client.send(request())
        raw = await client.raw()
        assert raw.startswith(b"HTTP/1.1 500 Internal Server Error\r\n") and b"connection: close" in raw


async def test_an_error_after_the_response_started_cuts_the_connection() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        raise RuntimeError("stream cut")

    async with running(app) as (_, port):
        client = await Client.connect(port)
        await client.send(request())
        raw = await client.raw()
        assert b"transfer-encoding: chunked" in raw and b"data: 1" in raw
        assert not raw.endswith(b"0\r\n\r\n")  # no last chunk: the client sees the stream was cut


async def test_malformed_requests_get_400_and_a_close() -> None:
    async with running(echo) as (_, port):
        client = await Client.connect(port)
        await client.send(b"NOT HTTP AT ALL\r\n\r\n")
        raw = await client.raw()
        assert raw.startswith(b"HTTP/1.1 400 Bad Request\r\n")


async def test_oversized_heads_get_431() -> None:
    async with running(echo, limits=ServerLimits(max_head_bytes=1024, max_headers=8)) as (_, port):
        client = await Client.connect(port)
        await client.send(request(extra=f"x-big: {'a' * 2000}\r\n"))
        assert (await client.raw()).startswith(b"HTTP/1.1 431 ")
        client = await Client.connect(port)
        await client.send(request(extra="".join(f"x-{i}: 1\r\n" for i in range(20))))
        assert (await client.raw()).startswith(b"HTTP/1.1 431 ")


async def test_idle_keep_alive_connections_are_closed() -> None:
    async with running(echo, limits=ServerLimits(keep_alive_s=0.1)) as (_, port):
        client = await Client.connect(port)
        await client.send(request())
        await client.responses()
        assert await client.closed_by_server()


async def test_keep_alive_counts_from_the_last_answer_not_from_the_connections_start() -> None:
    loop = asyncio.get_running_loop()
    async with running(echo, limits=ServerLimits(keep_alive_s=0.15)) as (_, port):
        client = await Client.connect(port)
        for path in ("/?delay", "/", "/?delay"):  # a request that outlasts the keep-alive does not end it
            await asyncio.sleep(0.1)  # idle, but less than the keep-alive
            await client.send(request("GET", path))
            (resp,) = await client.responses()
            assert resp.status == 200
        answered = loop.time()
        assert await client.closed_by_server()
        assert 0.1 <= loop.time() - answered < 1.0  # closed one keep-alive after the last answer


async def test_connection_close_from_the_client_is_honoured() -> None:
    async with running(echo) as (_, port):
        client = await Client.connect(port)
        await client.send(request(extra="connection: close\r\n"))
        raw = await client.raw()
        assert b"connection: close\r\n" in raw and raw.endswith(b"GET /  ")


async def test_a_large_body_for_a_slow_app_arrives_whole() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        total = 0
        while True:
            message = await receive()
            total += len(message["body"])
            await asyncio.sleep(0.001)
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(total).encode()})

    body = b"z" * (4 * 1024 * 1024)
    limits = ServerLimits(body_buffer_bytes=64 * 1024)
    async with running(app, limits=limits) as (_, port):
        client = await Client.connect(port)
        await client.send(request("POST", "/", body))
        (resp,) = await client.responses()
        assert resp.body == str(len(body)).encode()
        client.close()


async def test_an_apps_framing_headers_count_in_any_case() -> None:
    """The server frames by the app's Content-Length / Transfer-Encoding / Connection, however spelt."""

    async def cased(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await _read_body(receive)
        if scope["path"] == "/chunked":
            headers = [(b"Transfer-Encoding", b"chunked"), (b"X-Long-Header-Name", b"v")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"ab", "more_body": True})
            await send({"type": "http.response.body", "body": b"cd", "more_body": False})
            return
        headers = [(b"Content-Length", b"4"), (b"CONNECTION", b"Close")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"done"})

    async with running(cased) as (_, port):
        client = await Client.connect(port)
        await client.send(request(path="/chunked"))
        (resp,) = await client.responses()
        assert resp.body == b"abcd" and resp.headers["transfer-encoding"] == "chunked"
        assert "content-length" not in resp.headers
        await client.send(request(path="/length"))
        (resp,) = await client.responses()
        assert resp.body == b"done" and resp.headers["content-length"] == "4"
        assert await client.closed_by_server()  # the app's Connection: close ends the connection
        client.close()
