"""Gateway overhead benchmark: added latency at 1 connection and requests/s at 64, streaming and not.

Runs everything on loopback, bounded in time and count (``--duration-s`` and ``--max-requests`` per
measurement): N instant mock workers (a tiny asyncio HTTP server that answers a canned completion) or sim
workers (``--workers sim``), each router in turn (``kvgate gateway`` with ``round_robin``, no tokenizer,
first), and a load client in its own process. Prints one table for kvgate:

- p50/p99 latency at 1 keep-alive connection, direct to a worker and through the gateway, side by side;
- requests/s at 64 connections through the gateway;
- gateway CPU per request (µs, from ``/proc/<pid>/stat`` of the gateway's whole process tree: the steadier
  figure on a shared 2-core VM).

Other routers, off by default, add a side-by-side table (req/s and CPU µs per request at 1 and 64
connections, streaming and not, added p50/p99 at 1 connection against calling a worker directly):

- ``--kvgate-variant 'NAME=ARGS'``: kvgate again with extra flags (``'kvgate x2=--processes 2'``);
- ``--router-cmd 'NAME=COMMAND'``: any router; COMMAND is split like a shell line and has ``{port}``,
  ``{workers}`` (the worker URLs, space-separated), optionally ``{metrics_port}`` (loadtest.router_cmd);
- ``--paced-tokens N`` (mock workers): a third mode, ``paced``: a stream of N token chunks, each written
  ``--token-gap-ms`` apart as an engine decodes, so every token is a read and a write of its own through the
  router (the ``stream`` mode's canned answer arrives in one or two reads);
- ``--peer vllm-router[:cache_aware]`` / ``--peer sglang-router[:cache_aware]`` with ``--peer-venv PATH``
  (default ``/tmp/peer-routers``, made by ``python3 -m venv /tmp/peer-routers && /tmp/peer-routers/bin/pip
  install vllm-router==0.1.17 sglang-router==0.3.2``).

Usage: ``python -m loadtest.bench_proxy [--duration-s 5] [--connections 64] [--workers mock|sim]
[--kvgate-variant 'kvgate x2=--processes 2'] [--peer vllm-router --peer sglang-router]``.

Measured 2026-12-02 on the shared 2-core VM (load average 5-9 from other jobs, so req/s swings by 2x;
the load client shares the two cores), 4 mock workers, round_robin, ``--duration-s 5``, three runs:
non-streaming +0.25-0.33 ms added p50 at 1 connection, 1,772-6,120 req/s at 64 connections,
168-198 µs gateway CPU per request; streaming +0.32-0.69 ms, 1,667-2,833 req/s, 222-247 µs. A plain
aiohttp pass-through proxy measured 211-228 µs per request in the same hour; the first version of
this gateway (aiohttp client, full Starlette stack) 507-671 µs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from kvgate_core.net import free_ports
from loadtest.fleet import free_port
from loadtest.router_cmd import PEER_TEMPLATES, RouterCommand, parse_router_cmd, peer_command, tree_cpu_s

_COMPLETION = json.dumps({
    "id": "cmpl-bench", "object": "chat.completion", "created": 0, "model": "mock",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello there"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14,
              "prompt_tokens_details": {"cached_tokens": 0}},
}).encode()  # fmt: skip
_CHUNK = b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n'
_SSE = _CHUNK * 8 + b"data: [DONE]\n\n"
_MODELS = b'{"object":"list","data":[{"id":"mock","object":"model","owned_by":"bench"}]}'
_LOAD = b'{"running":0,"waiting":0,"kv_usage":0.0}'
_BODY = b'{"model":"mock","messages":[{"role":"user","content":"Say hello, please."}],"max_tokens":8}'
_STREAM_BODY = _BODY[:-1] + b',"stream":true}'
_DONE_FRAME = b"data: [DONE]\n\n"
MODES = ("non-stream", "stream", "paced")


def _paced_body(tokens: int, gap_ms: float) -> bytes:
    """A streamed request that asks the mock for ``tokens`` chunks ``gap_ms`` apart (in ``user``, a field
    every router passes on)."""
    return b'{"model":"mock","messages":[{"role":"user","content":"Say hello, please."}],"max_tokens":%d,' \
        b'"stream":true,"user":"paced-%s"}' % (tokens, str(gap_ms).encode())  # fmt: skip


def _paced_params(body: bytes) -> tuple[int, float] | None:
    """``(tokens, gap_ms)`` of a paced request, None for any other."""
    at = body.find(b'"user":"paced-')
    if at < 0:
        return None
    gap = body[at + 14 : body.index(b'"', at + 14)]
    mt = body.find(b'"max_tokens":')
    tokens = int(body[mt + 13 :].split(b",", 1)[0]) if mt >= 0 else 16
    return tokens, float(gap)


def _chunk_frame(frame: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(frame), frame)


_Cell = dict[str, float]  # one measurement: requests, rps, p50_ms, p99_ms, errors (+ cpu_us)


def _http_response(body: bytes, ctype: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (ctype, len(body), body)


def _chunked_response(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    frames = [f for f in body.split(b"\n\n") if f]
    return head + b"".join(b"%x\r\n%s\n\n\r\n" % (len(f) + 2, f) for f in frames) + b"0\r\n\r\n"


class _MockWorker(asyncio.Protocol):
    """An instant OpenAI worker: parses just enough HTTP/1.1 to answer each keep-alive request."""

    def __init__(self) -> None:
        self._buf = b""
        self._transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is a write transport

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while (end := self._buf.find(b"\r\n\r\n")) >= 0:
            head = self._buf[:end].lower()
            idx = head.find(b"content-length:")
            length = int(head[idx + 15 :].split(b"\r\n", 1)[0]) if idx >= 0 else 0
            if len(self._buf) < end + 4 + length:
                return
            body = self._buf[end + 4 : end + 4 + length]
            self._buf = self._buf[end + 4 + length :]
            assert self._transport is not None
            if (paced := _paced_params(body)) is not None:
                self._pace(*paced)
                continue
            self._transport.write(self._answer(head.split(b" ", 2)[1], body))

    def _pace(self, tokens: int, gap_ms: float) -> None:
        """Head now, then a token chunk every ``gap_ms``, then ``[DONE]`` and the body's end."""
        transport = self._transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        token = _chunk_frame(_CHUNK)
        end = _chunk_frame(_DONE_FRAME) + b"0\r\n\r\n"
        for i in range(1, tokens + 1):
            loop.call_later(i * gap_ms / 1e3, transport.write, token)
        loop.call_later((tokens + 1) * gap_ms / 1e3, transport.write, end)

    @staticmethod
    def _answer(path: bytes, body: bytes) -> bytes:
        if path == b"/v1/models":
            return _http_response(_MODELS)
        if path == b"/load":
            return _http_response(_LOAD)
        if path == b"/health":
            return _http_response(b"{}")
        if b'"stream":true' in body:
            return _chunked_response(_SSE)
        return _http_response(_COMPLETION)


async def _serve_mock(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_MockWorker, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


async def _read_response(reader: asyncio.StreamReader) -> None:
    head = (await reader.readuntil(b"\r\n\r\n")).lower()
    idx = head.find(b"content-length:")
    if idx >= 0:
        await reader.readexactly(int(head[idx + 15 :].split(b"\r\n", 1)[0]))
        return
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return


async def _client_conn(
    port: int, request: bytes, deadline: float, latencies: list[float], errors: list[str], limit: int
) -> int:
    """Send requests back to back on one keep-alive connection until ``deadline`` or until ``latencies``
    holds ``limit`` (shared by the connections); reconnect on errors."""
    done = 0
    while time.perf_counter() < deadline and len(latencies) < limit:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline and len(latencies) < limit:
                start = time.perf_counter()
                writer.write(request)
                await _read_response(reader)
                latencies.append(time.perf_counter() - start)
                done += 1
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            errors.append(repr(exc))
        finally:
            writer.close()
    return done


async def _run_client(
    port: int, connections: int, duration_s: float, mode: str, max_requests: int, paced: tuple[int, float]
) -> _Cell:
    body = {"non-stream": _BODY, "stream": _STREAM_BODY}.get(mode) or _paced_body(*paced)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    warm: list[float] = []
    errors: list[str] = []
    await _client_conn(port, request, time.perf_counter() + 0.3, warm, errors, max_requests)
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + duration_s
    counts = await asyncio.gather(
        *(_client_conn(port, request, deadline, latencies, errors, max_requests) for _ in range(connections))
    )
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "requests": float(sum(counts)),
        "rps": sum(counts) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
        "errors": float(len(errors)),
        "warm": float(len(warm)),  # sent before the timed run (a profiler attached throughout sees them)
    }


@dataclass(frozen=True, slots=True)
class _Router:
    """A router process to measure: its table name, argv (rendered) and readiness path."""

    name: str
    argv: list[str]
    port: int
    ready_path: str


def _spawn(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen(list(args), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def wait_http(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready within {timeout_s}s")


def start_workers(kind: str, num_workers: int, logs: Path) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    py = sys.executable
    procs: list[subprocess.Popen[bytes]] = []
    ports = free_ports(num_workers)
    for i, port in enumerate(ports):
        if kind == "sim":
            cmd = [py, "-m", "kvgate.cli", "worker", "--sim", "--host", "127.0.0.1", "--port", str(port),
                   "--model-name", "mock", "--prefill-tps", "1e9", "--decode-tps", "1e9"]  # fmt: skip
        else:
            cmd = [py, "-m", "loadtest.bench_proxy", "--serve-mock", str(port)]
        procs.append(_spawn(cmd, logs / f"worker{i}.log"))
    try:
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}/health")
    except TimeoutError:
        stop_procs(procs)
        raise
    return procs, ports


def kvgate_router(name: str, worker_ports: Sequence[int], gateway_args: Sequence[str]) -> _Router:
    """kvgate (``round_robin``, no tokenizer) in front of the workers, with extra gateway flags."""
    port = free_port()
    argv = [sys.executable, "-m", "kvgate.cli", "gateway", "--port", str(port), "--policy", "round_robin",
            "--tokenizer", "none", *[f"--worker=http://127.0.0.1:{p}" for p in worker_ports],
            *gateway_args]  # fmt: skip
    return _Router(name, argv, port, "/ready")


def command_router(cmd: RouterCommand, worker_ports: Sequence[int]) -> _Router:
    port, metrics_port = free_ports(2)
    argv = cmd.render(port, [f"http://127.0.0.1:{p}" for p in worker_ports], metrics_port)
    return _Router(cmd.name, argv, port, cmd.ready_path)


def stop_procs(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each process's group (a supervising router forwards it to its children), then wait."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def client_argv(
    port: int, connections: int, duration_s: float, mode: str, max_requests: int, paced: tuple[int, float]
) -> list[str]:
    """The command of one load client process (``--client``); it prints its cell as JSON."""
    return [sys.executable, "-m", "loadtest.bench_proxy", "--client",
            json.dumps([port, connections, duration_s, mode, max_requests, paced])]  # fmt: skip


def client_cell(
    port: int, connections: int, duration_s: float, mode: str, max_requests: int, paced: tuple[int, float]
) -> _Cell:
    cmd = client_argv(port, connections, duration_s, mode, max_requests, paced)
    out = subprocess.run(cmd, capture_output=True, check=True, timeout=duration_s + 120)
    result: _Cell = json.loads(out.stdout)
    return result


@dataclass(frozen=True, slots=True)
class _Load:
    duration_s: float
    connections: int
    max_requests: int
    modes: tuple[str, ...] = MODES[:2]
    paced: tuple[int, float] = (64, 1.0)  # tokens, ms between them


def _measure(router: _Router, pid: int, load: _Load, mode: str) -> tuple[_Cell, _Cell]:
    """The router at 1 connection and at ``load.connections``, each with its CPU µs per request."""
    cells = []
    for conns in (1, load.connections):
        cpu0 = tree_cpu_s(pid)
        cell = client_cell(router.port, conns, load.duration_s, mode, load.max_requests, load.paced)
        cell["cpu_us"] = (tree_cpu_s(pid) - cpu0) * 1e6 / max(1.0, cell["requests"])
        cells.append(cell)
    return cells[0], cells[1]


def _bench_router(router: _Router, logs: Path, load: _Load) -> dict[str, tuple[_Cell, _Cell]]:
    proc = _spawn(router.argv, logs / f"router-{router.port}.log")
    try:
        wait_http(f"http://127.0.0.1:{router.port}{router.ready_path}", timeout_s=90)
        time.sleep(1.0)  # let a multi-process router's last process join before measuring
        return {mode: _measure(router, proc.pid, load, mode) for mode in load.modes}
    finally:
        stop_procs([proc])


def _overhead_rows(direct: Mapping[str, _Cell], cells: Mapping[str, tuple[_Cell, _Cell]]) -> list[str]:
    """The original table's rows (one router)."""
    rows = []
    for mode, (via, many) in cells.items():
        d = direct[mode]
        rows.append(
            f"| {mode:10} | {d['p50_ms']:6.3f} | {via['p50_ms']:6.3f} | "
            f"{via['p50_ms'] - d['p50_ms']:+6.3f} | {d['p99_ms']:6.3f} | {via['p99_ms']:6.3f} | "
            f"{many['rps']:8.0f} | {many['p50_ms']:6.2f} | {many['cpu_us']:6.0f} | "
            f"{many['errors'] + via['errors']:.0f} |"
        )
    return rows


def side_by_side(
    direct: Mapping[str, _Cell], results: Mapping[str, Mapping[str, tuple[_Cell, _Cell]]], connections: int
) -> str:
    """Every router's figures in one table, a row per router and mode."""
    lines = [
        f"| router | mode | req/s @1 | CPU µs/req @1 | req/s @{connections} | CPU µs/req @{connections} | "
        "added p50 @1 ms | added p99 @1 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in direct:
        d = direct[mode]
        for name, cells in results.items():
            one, many = cells[mode]
            lines.append(
                f"| {name} | {mode} | {one['rps']:.0f} | {one['cpu_us']:.0f} | {many['rps']:.0f} | "
                f"{many['cpu_us']:.0f} | {one['p50_ms'] - d['p50_ms']:+.3f} | "
                f"{one['p99_ms'] - d['p99_ms']:+.3f} | {one['errors'] + many['errors']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench_proxy", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--duration-s", type=float, default=5.0, help="seconds per measurement (default 5)")
    parser.add_argument("--connections", type=int, default=64, help="connections for the req/s run")
    parser.add_argument(
        "--max-requests", type=int, default=500_000, help="cap on the requests of one measurement"
    )
    parser.add_argument(
        "--workers", choices=["mock", "sim"], default="mock", help="instant mocks or sim workers"
    )
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument(
        "--gateway-arg", action="append", default=[],
        help="extra gateway flag, repeatable, e.g. --gateway-arg=--trace (tracing overhead)",
    )  # fmt: skip
    parser.add_argument(
        "--kvgate-variant", action="append", default=[], metavar="NAME=ARGS",
        help="another kvgate run with extra flags, repeatable, e.g. 'kvgate x2=--processes 2'",
    )  # fmt: skip
    parser.add_argument(
        "--router-cmd", action="append", default=[], metavar="NAME=COMMAND",
        help="another router to measure, repeatable; COMMAND has {port} and {workers} (and {metrics_port})",
    )  # fmt: skip
    parser.add_argument(
        "--peer", action="append", default=[], metavar="PEER[:POLICY]",
        help=f"a preset router, repeatable: {', '.join(PEER_TEMPLATES)}; POLICY round_robin|cache_aware",
    )  # fmt: skip
    parser.add_argument(
        "--peer-venv", type=Path, default=Path("/tmp/peer-routers"), help="venv holding the peers"
    )
    parser.add_argument(
        "--paced-tokens", type=int, default=0,
        help="add the paced mode: streams of N token chunks, written --token-gap-ms apart (mock workers)",
    )  # fmt: skip
    parser.add_argument("--token-gap-ms", type=float, default=1.0, help="paced mode: ms between token chunks")
    parser.add_argument("--serve-mock", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--client", default=None, help=argparse.SUPPRESS)
    return parser


def _routers(args: argparse.Namespace, worker_ports: Sequence[int]) -> list[_Router]:
    routers = [kvgate_router("kvgate", worker_ports, args.gateway_arg)]
    for variant in args.kvgate_variant:
        name, _, extra = variant.partition("=")
        routers.append(kvgate_router(name, worker_ports, [*args.gateway_arg, *shlex.split(extra)]))
    commands = [parse_router_cmd(spec) for spec in args.router_cmd]
    commands += [peer_command(spec, args.peer_venv) for spec in args.peer]
    routers += [command_router(cmd, worker_ports) for cmd in commands]
    return routers


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import uvloop

    if args.serve_mock is not None:
        uvloop.run(_serve_mock(args.serve_mock))
        return 0
    if args.client is not None:
        port, conns, duration_s, mode, max_requests, paced = json.loads(args.client)
        cell = uvloop.run(_run_client(port, conns, duration_s, mode, max_requests, tuple(paced)))
        sys.stdout.write(json.dumps(cell))
        return 0
    if args.paced_tokens and args.workers != "mock":
        raise SystemExit("--paced-tokens needs the mock workers")
    modes = MODES if args.paced_tokens > 0 else MODES[:2]
    load = _Load(
        args.duration_s, args.connections, args.max_requests, modes, (args.paced_tokens, args.token_gap_ms)
    )
    results: dict[str, dict[str, tuple[_Cell, _Cell]]] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-") as tmp:
        procs, ports = start_workers(args.workers, args.num_workers, Path(tmp))
        try:
            routers = _routers(args, ports)
            direct = {
                m: client_cell(ports[0], 1, args.duration_s, m, args.max_requests, load.paced) for m in modes
            }
            for router in routers:
                results[router.name] = _bench_router(router, Path(tmp), load)
        finally:
            stop_procs(procs)
    sys.stdout.write(
        f"gateway overhead, {args.num_workers} {args.workers} workers, {args.duration_s:g}s per cell, "
        f"{os.cpu_count()} CPUs\n"
        f"| mode       | direct p50 ms | gw p50 ms | added p50 | direct p99 | gw p99 | "
        f"req/s @{args.connections} | p50 @{args.connections} | gw CPU µs/req | errors |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
        + "\n".join(_overhead_rows(direct, results["kvgate"])) + "\n"
    )  # fmt: skip
    if len(results) > 1:
        sys.stdout.write("\nside by side (CPU: the router's whole process tree)\n")
        sys.stdout.write(side_by_side(direct, results, args.connections))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
