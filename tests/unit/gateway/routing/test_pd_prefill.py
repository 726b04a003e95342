"""The PD prefill call on the proxy's HTTP/1.1 pool, against a scripted worker on a local socket."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from gateway.fleet.breaker import BreakerState
from gateway.fleet.registry import Fleet, WorkerRecord
from gateway.routing.pd import PrefillRunner, prefill_body
from gateway.settings import BreakerSettings, WorkerSpec
from gateway.state.memory import MemoryLoadBoard
from kvgate_core.h1 import H1Pool
from tests.support.procs import free_port

PATH = "/v1/chat/completions"
BODY = prefill_body({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
HANG, BREAK = -1, -2  # scripted answers: never answer; send half a body, then close


@dataclass
class Worker:
    """Answers each request with the next scripted status (200 once the script is used up)."""

    script: list[int] = field(default_factory=list)
    heads: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # a connection ended
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
                self.heads.append(head)
                self.bodies.append(await reader.readexactly(int(length.group(1)) if length else 0))
                status = self.script.pop(0) if self.script else 200
                if status == HANG:
                    await reader.read()  # until the client gives up and closes
                    return
                if status == BREAK:
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nok")
                    await writer.drain()
                    return
                writer.write(b"HTTP/1.1 %d X\r\ncontent-length: 2\r\n\r\nok" % status)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection
        finally:
            self.closed.set()
            writer.close()


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    w = Worker()
    server = await asyncio.start_server(w.serve, "127.0.0.1", 0)
    w.port = server.sockets[0].getsockname()[1]
    try:
        yield w
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
async def pool() -> AsyncIterator[H1Pool]:
    p = H1Pool(connect_timeout_s=1.0)
    try:
        yield p
    finally:
        p.close()


def _record(port: int) -> WorkerRecord:
    fleet = Fleet(breaker=BreakerSettings(failures=1, open_s=60.0), clock=time.monotonic)
    return fleet.add(WorkerSpec(id="p", url=f"http://127.0.0.1:{port}"))


async def _run(pool: H1Pool, record: WorkerRecord, load: MemoryLoadBoard, timeout_s: float = 2.0) -> str:
    runner = PrefillRunner(pool=pool, load=load, timeout_s=timeout_s)
    outcome = await runner.run(record, PATH, BODY, prompt_tokens=40)
    assert outcome.worker == "p" and outcome.ok == (outcome.reason == "")
    assert load.get("p").inflight_requests == 0 and load.get("p").inflight_tokens == 0
    return outcome.reason


async def test_a_200_is_ok_with_the_pd_protocols_request(worker: Worker, pool: H1Pool) -> None:
    record, load = _record(worker.port), MemoryLoadBoard()
    assert await _run(pool, record, load) == ""
    head = worker.heads[0].lower()
    assert head.startswith(b"post /v1/chat/completions http/1.1\r\n")
    assert b"content-type: application/json\r\n" in head and b"x-kvgate-pd: prefill\r\n" in head
    assert worker.bodies == [BODY]
    assert record.breaker.state is BreakerState.CLOSED and record.finished_since_probe == 1


async def test_a_500_is_a_failure_on_the_breaker(worker: Worker, pool: H1Pool) -> None:
    worker.script = [500]
    record, load = _record(worker.port), MemoryLoadBoard()
    assert await _run(pool, record, load) == "status 500"
    assert record.breaker.state is BreakerState.OPEN and record.finished_since_probe == 0


async def test_a_silent_worker_times_out_and_its_connection_is_closed(worker: Worker, pool: H1Pool) -> None:
    worker.script = [HANG]
    record, load = _record(worker.port), MemoryLoadBoard()
    start = time.monotonic()
    assert await _run(pool, record, load, timeout_s=0.3) == "timeout"
    assert time.monotonic() - start < 1.0
    assert record.breaker.state is BreakerState.OPEN
    await asyncio.wait_for(worker.closed.wait(), 2.0)  # the worker saw the connection go
    assert await _run(pool, record, load) == ""  # on a new connection: the timed-out one never went back
    assert worker.connections == 2


async def test_a_connection_broken_mid_answer_is_a_connect_failure(worker: Worker, pool: H1Pool) -> None:
    worker.script = [BREAK]
    record, load = _record(worker.port), MemoryLoadBoard()
    assert (await _run(pool, record, load)).startswith("connect: ")
    assert await _run(pool, record, load) == ""
    assert worker.connections == 2


async def test_a_refused_connection_is_a_connect_failure(pool: H1Pool) -> None:
    record, load = _record(free_port()), MemoryLoadBoard()  # nothing listens there
    reason = await _run(pool, record, load)
    assert reason.startswith("connect: ") and "connect to 127.0.0.1" in reason
    assert record.breaker.state is BreakerState.OPEN


async def test_a_successful_calls_connection_is_kept_alive(worker: Worker, pool: H1Pool) -> None:
    record, load = _record(worker.port), MemoryLoadBoard()
    assert [await _run(pool, record, load) for _ in range(3)] == ["", "", ""]
    assert worker.connections == 1 and len(worker.bodies) == 3


async def test_a_failed_status_still_keeps_the_connection(worker: Worker, pool: H1Pool) -> None:
    worker.script = [503]
    record, load = _record(worker.port), MemoryLoadBoard()
    assert await _run(pool, record, load) == "status 503"
    assert await _run(pool, record, load) == ""
    assert worker.connections == 1  # the 503 was read whole, so its connection went back to the pool


async def test_a_saturated_prefill_worker_falls_back_without_a_breaker_failure(worker: Worker) -> None:
    """Its one connection is busy (a hanging prefill) and no request may wait: the next prefill is refused at
    once with nothing sent, decodes alone, and the worker's breaker stays closed (busy is not broken)."""
    worker.script = [HANG]
    record, load = _record(worker.port), MemoryLoadBoard()
    pool = H1Pool(connect_timeout_s=1.0, max_connections=1, max_waiting=0)
    try:
        runner = PrefillRunner(pool=pool, load=load, timeout_s=5.0)
        hanging = asyncio.create_task(runner.run(record, PATH, BODY, prompt_tokens=40))
        await asyncio.sleep(0.2)  # the first prefill holds the only connection
        assert await _run(pool, record, MemoryLoadBoard()) == "saturated"  # _run checks its load is released
        assert record.breaker.state is BreakerState.CLOSED and len(worker.heads) == 1
        hanging.cancel()
    finally:
        pool.close()
