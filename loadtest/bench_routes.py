"""Gateway CPU per request on ``/v1/responses`` beside ``/v1/chat/completions``, for the same prompt.

Run: ``python -m loadtest.bench_routes [--requests 2000] [--rounds 3] [--connections 8]``.

Starts 2 instant mock workers (a tiny asyncio HTTP server answering both routes with canned bodies: the
chat answer and its 8-chunk stream; the Responses answer and its stream of ``response.created``, 8 deltas
and ``response.completed``) and one gateway per policy: ``round_robin`` with no tokenizer (the proxy path
alone) and ``prefix_cache_aware`` with the byte tokenizer (render + tokenize + hash + index lookup too).
The same conversation goes out as a chat body (system + user message) and as a Responses body
(``instructions`` + ``input``), which the gateway renders into the same prompt. A load client in its own
process sends ``--requests`` requests per cell at ``--connections`` keep-alive connections; the cells of a
policy alternate (chat, responses, chat, …) for ``--rounds`` rounds so both routes see the same machine
load, and each cell's figure is the gateway's utime + stime (``/proc/<pid>/stat``) over the cell divided by
its requests. Prints a table and each route pair's ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from kvgate_core.net import free_ports
from loadtest.bench_proxy import _MockWorker, wait_http
from loadtest.bench_routing import cpu_seconds

SYSTEM = "You are a careful assistant for a hardware store. Answer in two sentences. " * 6
USER = "Which drill should I buy to hang shelves on a brick wall, and which plugs go with it? " * 10
_MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
_CHAT = {"model": "mock", "messages": _MESSAGES, "max_tokens": 8}
_RESPONSES = {"model": "mock", "instructions": SYSTEM, "input": USER, "max_output_tokens": 8}
BODIES = {"chat": _CHAT, "responses": _RESPONSES}
PATHS = {"chat": b"/v1/chat/completions", "responses": b"/v1/responses"}

_USAGE = {"prompt_tokens": 900, "completion_tokens": 8, "total_tokens": 908,
          "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
_CHAT_ANSWER = orjson.dumps({"id": "c", "object": "chat.completion", "model": "mock", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "tok " * 8}, "finish_reason": "length"}],
    "usage": _USAGE})  # fmt: skip
_CHAT_SSE = (
    b"".join(
        b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n'
        for _ in range(8)
    )
    + b"data: [DONE]\n\n"
)
_RESPONSE = {"id": "resp_bench", "object": "response", "status": "completed", "model": "mock", "output": [
    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "tok " * 8, "annotations": []}]}],
    "usage": {"input_tokens": 900, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 8,
              "total_tokens": 908}}  # fmt: skip
_RESPONSES_ANSWER = orjson.dumps(_RESPONSE)


def _event(kind: str, data: dict[str, object]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


_RESPONSES_SSE = (
    _event("response.created", {"response": {**_RESPONSE, "status": "in_progress"}, "sequence_number": 0})
    + b"".join(
        _event("response.output_text.delta", {"delta": "tok ", "sequence_number": i + 1}) for i in range(8)
    )
    + _event("response.completed", {"response": _RESPONSE, "sequence_number": 9})
)
_MODELS = b'{"object":"list","data":[{"id":"mock","object":"model","owned_by":"bench"}]}'


def _whole(body: bytes, ctype: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (ctype, len(body), body)


def _chunked(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


class _Mock(_MockWorker):
    """``bench_proxy``'s instant worker, answering both routes (``_answer``)."""

    @staticmethod
    def _answer(path: bytes, body: bytes) -> bytes:
        return _answer(path, body)


def _answer(path: bytes, body: bytes) -> bytes:
    stream = b'"stream":true' in body
    if path == b"/v1/chat/completions":
        return _chunked(_CHAT_SSE) if stream else _whole(_CHAT_ANSWER)
    if path == b"/v1/responses":
        return _chunked(_RESPONSES_SSE) if stream else _whole(_RESPONSES_ANSWER)
    if path == b"/v1/models":
        return _whole(_MODELS)
    return _whole(b'{"running":0,"waiting":0,"kv_usage":0.0}' if path == b"/load" else b"{}")


async def _serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Mock, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = (await reader.readuntil(b"\r\n\r\n")).lower()
    status = int(head.split(b" ", 2)[1])
    idx = head.find(b"content-length:")
    if idx >= 0:
        await reader.readexactly(int(head[idx + 15 :].split(b"\r\n", 1)[0]))
        return status
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return status


async def _load(port: int, request: bytes, total: int, connections: int, timeout_s: float) -> dict[str, int]:
    """Send ``total`` requests over ``connections`` keep-alive connections (bounded by ``timeout_s``)."""
    left = [total]
    errors = [0]

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while left[0] > 0:
                left[0] -= 1
                writer.write(request)
                if await _read_response(reader) != 200:
                    errors[0] += 1
        finally:
            writer.close()

    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(connections))), timeout_s)
    return {"requests": total, "errors": errors[0]}


def _request(route: str, stream: bool) -> bytes:
    body = orjson.dumps({**BODIES[route], "stream": stream})
    head = b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n" % PATHS[route]
    return head + b"content-length: %d\r\n\r\n%s" % (len(body), body)


def _cell(pid: int, port: int, route: str, stream: bool, args: argparse.Namespace) -> tuple[float, int]:
    """The gateway's CPU seconds over one cell, and the requests of the cell (run by a client process)."""
    spec = json.dumps([port, route, stream, args.requests, args.connections])
    before = cpu_seconds(pid)
    out = subprocess.run([sys.executable, "-m", "loadtest.bench_routes", "--client", spec],
                         capture_output=True, check=True, timeout=300)  # fmt: skip
    result = json.loads(out.stdout)
    if result["errors"]:
        raise RuntimeError(f"{route}: {result['errors']} requests failed")
    return cpu_seconds(pid) - before, int(result["requests"])


def _gateway(
    policy: Sequence[str], worker_ports: Sequence[int], logs: Path
) -> tuple[subprocess.Popen[bytes], int]:
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "kvgate.cli", "gateway", "--port", str(port), "--processes", "1",
            *policy, *(f"--worker=http://127.0.0.1:{p}" for p in worker_ports)]  # fmt: skip
    with open(logs / f"gateway-{port}.log", "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    wait_http(f"http://127.0.0.1:{port}/ready", timeout_s=60)
    return proc, port


POLICIES = {
    "round_robin": ["--policy", "round_robin", "--tokenizer", "none"],
    "prefix_cache_aware (bytes)": ["--policy", "prefix_cache_aware", "--tokenizer", "bytes"],
}


def run(args: argparse.Namespace) -> list[str]:
    lines = [
        "| policy | stream | chat µs/req | responses µs/req | responses / chat |",
        "|---|---|---|---|---|",
    ]
    ports = free_ports(2)
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        mocks = [subprocess.Popen([sys.executable, "-m", "loadtest.bench_routes", "--serve", str(p)],
                                  start_new_session=True) for p in ports]  # fmt: skip
        try:
            for p in ports:
                wait_http(f"http://127.0.0.1:{p}/health")
            for name, flags in POLICIES.items():
                gateway, port = _gateway(flags, ports, logs)
                try:
                    for stream in (False, True):
                        totals = {"chat": [0.0, 0], "responses": [0.0, 0]}
                        for _ in range(args.rounds):
                            for route in ("chat", "responses"):
                                cpu, n = _cell(gateway.pid, port, route, stream, args)
                                totals[route][0] += cpu
                                totals[route][1] += n
                        chat, resp = (totals[r][0] * 1e6 / totals[r][1] for r in ("chat", "responses"))
                        lines.append(f"| {name} | {stream} | {chat:.0f} | {resp:.0f} | {resp / chat:.2f}× |")
                finally:
                    gateway.terminate()
                    gateway.wait(30)
        finally:
            for mock in mocks:
                mock.terminate()
                mock.wait(10)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per cell")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two routes per policy")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.serve))
        return 0
    if args.client:
        port, route, stream, total, connections = json.loads(args.client)
        result = asyncio.run(_load(port, _request(route, stream), total, connections, timeout_s=240))
        print(json.dumps(result))
        return 0
    start = time.perf_counter()
    for line in run(args):
        print(line)
    print(f"({args.rounds} rounds × {args.requests} requests per cell, {args.connections} connections, "
          f"{time.perf_counter() - start:.0f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
