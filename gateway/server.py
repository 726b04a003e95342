"""``kvgate gateway``: flags, then an HTTP server on uvloop serving ``create_app``: the lean one in
``kvgate_core.h1_server`` (``--http-server kvgate``, the default), or uvicorn (``--http-server uvicorn``),
both with the client limits of ``gateway.client_limits``.

Why not granian (measured 2026-12-07, ``docs/security.md``): through ASGI it cost 1.5-2x the lean server's
CPU per proxied request at 64 connections and 2.1-2.9x at one, and it has no body deadline."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import math
import os
import resource
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import uvicorn

from gateway.app import GatewayApp, create_app
from gateway.child_process import ChildRole, label_logs, reuse_port_socket, tag_responses
from gateway.client_limits import KEEP_ALIVE_S, add_client_limit_arguments, client_limits_from_args
from gateway.deps import Deps, DepsOverrides, preflight
from gateway.errors import ConfigError
from gateway.observability.logging import configure as configure_logging
from gateway.processes import Supervisor, find_redis_server, parse_processes, private_redis
from gateway.reload import WorkerSource
from gateway.security.setup import SecuritySettings, add_security_arguments, security_from_args, wrap_app
from gateway.settings import (
    BYTE_BLOCK_SIZE,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_HALF_LIFE_S,
    DEFAULT_INLINE_BYTES,
    DEFAULT_MAX_CONTAINERS,
    DEFAULT_MAX_PREFIX_TOKENS,
    DEFAULT_POLICY,
    Settings,
    Timeouts,
    UpstreamLimits,
    WorkerSpec,
    from_args,
    parse_connections,
)
from gateway.state.redis_client import is_redis_url
from gateway.uvicorn_limits import limited_protocol
from kvgate_core import native
from kvgate_core.asgi import ASGIApp
from kvgate_core.config import parse_layered
from kvgate_core.h1_server.context import ServerLimits
from kvgate_core.h1_server.server import H1Server
from kvgate_core.tracing import build_tracer_provider

if TYPE_CHECKING:
    from redis.asyncio import Redis

logger = logging.getLogger(__name__)

#: file descriptors kept for the gateway's own use besides client and proxied connections (the listening
#: socket, Redis, the control client, KV event feeds, logs)
_BASE_FDS = 64
#: a soft limit to aim for when the hard one is unlimited (Linux refuses more than fs.nr_open, 2**20)
_UNLIMITED_TARGET = 1 << 20
#: the HTTP servers ``--http-server`` picks from
HTTP_SERVERS = ("uvicorn", "kvgate")
#: ``--http-server``'s help
HTTP_SERVER_HELP = (
    "HTTP server for client connections: kvgate (default: the lean asyncio + httptools server, less CPU "
    "per request) | uvicorn"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the gateway's flags (each also readable from YAML and ``KVGATE_*``)."""
    t = Timeouts()
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument(
        "--worker", action="append", default=[],
        help="worker base URL, repeatable; URL[#role=prefill|decode|both&id=NAME&engine=auto|vllm|sglang|"
        "trtllm|tgi|lmdeploy|mii|openai|kvgate&events=tcp://H:P&model=M&kv_tokens=N&prefix_cache=on|off]",
    )  # fmt: skip
    parser.add_argument(
        "--policy", default=DEFAULT_POLICY, help=f"routing policy name (default {DEFAULT_POLICY})"
    )
    parser.add_argument(
        "--policy-config", default=None, help="YAML file with the policy spec (type, params…)"
    )
    parser.add_argument("--state", default="memory", help="state backend: memory | redis://HOST:PORT/DB")
    parser.add_argument(
        "--recent-half-life-s",
        type=float,
        default=DEFAULT_HALF_LIFE_S,
        help="half-life of the recent routed load per worker that balancing policies read (seconds)",
    )
    parser.add_argument(
        "--tokenizer", default="auto", help="auto | none | bytes | PATH to tokenizer.json/dir"
    )
    parser.add_argument(
        "--block-size", type=int, default=None,
        help=f"tokens per KV block (default {DEFAULT_BLOCK_SIZE}); when the byte tokenizer stands in for an "
        "engine's: one engine block in bytes, learned at start from the workers' usage.prompt_tokens "
        f"(else {BYTE_BLOCK_SIZE}); giving it turns the probe off",
    )  # fmt: skip
    parser.add_argument(
        "--max-body-bytes", type=int, default=8 * 1024 * 1024, help="request body limit (413)"
    )
    parser.add_argument(
        "--analyze-inline-bytes", type=int, default=DEFAULT_INLINE_BYTES,
        help="larger bodies are parsed and analysed on a thread of their own, off the event loop (default "
        f"{DEFAULT_INLINE_BYTES})",
    )  # fmt: skip
    parser.add_argument(
        "--max-prefix-tokens", type=int, default=DEFAULT_MAX_PREFIX_TOKENS,
        help="the prompt prefix, in tokens, that routing looks up in the KV index and records (longer "
        f"prompts are routed on this prefix; default {DEFAULT_MAX_PREFIX_TOKENS})",
    )  # fmt: skip
    parser.add_argument(
        "--max-body-objects", type=int, default=DEFAULT_MAX_CONTAINERS,
        help="JSON objects and arrays a body above --analyze-inline-bytes may hold, counted before it is "
        f"parsed (more: 400; default {DEFAULT_MAX_CONTAINERS})",
    )  # fmt: skip
    parser.add_argument(
        "--connect-timeout-s", type=float, default=t.connect_s, help="upstream connect deadline"
    )
    parser.add_argument("--ttfb-timeout-s", type=float, default=t.ttfb_s, help="deadline to the first byte")
    parser.add_argument(
        "--idle-timeout-s", type=float, default=t.idle_s, help="max gap between stream chunks"
    )
    parser.add_argument(
        "--retries", type=int, default=2, help="retries on other workers before the first byte"
    )
    parser.add_argument("--health-interval-s", type=float, default=1.0, help="seconds between health probes")
    u = UpstreamLimits()
    parser.add_argument(
        "--upstream-max-connections", type=parse_connections, default="auto",
        help="open connections per worker (in use + idle); auto: the worker's running slots "
        "(max_running in its /load), else 256",
    )  # fmt: skip
    parser.add_argument(
        "--upstream-max-waiting", type=int, default=u.max_waiting,
        help="requests per worker that may wait for a connection at its cap; more: 503 + Retry-After",
    )  # fmt: skip
    parser.add_argument(
        "--upstream-queue-timeout-s", type=float, default=u.queue_timeout_s,
        help="longest wait for a worker connection (at most half --ttfb-timeout-s); then 503 + Retry-After",
    )  # fmt: skip
    parser.add_argument(
        "--role-pools", default="auto",
        help="PD role pools: auto (under a PD policy) | on | off | ratio=2,dwell_s=10,…",
    )  # fmt: skip
    parser.add_argument(
        "--kv-index", default="auto", choices=["auto", "precise", "approximate"],
        help="auto: per worker, precise where its KV events flow and approximate (learned from routing) "
        "where none do; precise: events for all; approximate: routing for all",
    )  # fmt: skip
    parser.add_argument(
        "--engine-load", default="on", choices=["on", "off"],
        help="on: read each engine's own load signal (running, waiting, KV usage); off: the gateway's "
        "in-flight count only (for comparisons)",
    )  # fmt: skip
    parser.add_argument(
        "--response-ttl-s", type=float, default=24 * 3600.0,
        help="how long the gateway remembers which worker stored a Responses API response "
        "(previous_response_id and /v1/responses/{id} go there)",
    )  # fmt: skip
    parser.add_argument(
        "--response-max-entries", type=int, default=100_000,
        help="stored-response owners remembered per gateway process (least recently used go first)",
    )  # fmt: skip
    parser.add_argument("--log-level", default="warning", help="debug | info | warning | error")
    parser.add_argument(
        "--log-format", default="text", choices=["text", "json"], help="log lines as text or JSON"
    )
    parser.add_argument(
        "--shutdown-grace-s", type=float, default=30.0,
        help="on SIGTERM: stop accepting, let in-flight requests finish for up to this long",
    )  # fmt: skip
    parser.add_argument(
        "--processes", type=_processes, default="1",
        help="gateway processes serving the port (SO_REUSEPORT) under a supervising parent; auto: the cores "
        "this process may use. They share routing state through --state redis://…; with memory state, "
        "through a private redis-server (from PATH) the parent runs",
    )  # fmt: skip
    parser.add_argument(
        "--http-server",
        default="kvgate",
        choices=HTTP_SERVERS,
        help=HTTP_SERVER_HELP,
    )
    parser.add_argument("--process-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    add_security_arguments(parser)
    add_client_limit_arguments(parser)


def _processes(text: str) -> int:
    try:
        return parse_processes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _worker_source(argv: Sequence[str]) -> WorkerSource:
    """Re-parse the gateway's sources (flags, env, ``--config`` file) for the worker list."""

    def source() -> tuple[WorkerSpec, ...]:
        parser = argparse.ArgumentParser(prog="kvgate gateway")
        parser.add_argument("--config")
        add_arguments(parser)
        return from_args(parse_layered(parser, list(argv)[1:], os.environ)).workers

    return source


def build_asgi(
    settings: Settings,
    security: SecuritySettings,
    reload_source: WorkerSource | None = None,
    deps: DepsOverrides | None = None,
) -> ASGIApp:
    """The gateway app wrapped in its protective layers (auth and the control plane's access mode for
    ``settings.host``, limits, admission, tracing), with the worker allow-list of ``POST /admin/workers``."""
    tracer = None
    if security.trace:
        provider = build_tracer_provider(otlp_endpoint=security.otlp_endpoint)
        tracer = provider.get_tracer("kvgate.gateway")
    app = create_app(settings, deps, reload_source=reload_source)
    # what POST /admin/workers may register (gateway.api.admin_routes reads it from the app's state)
    app.state.worker_allow = security.worker_allow_for(w.url for w in settings.workers)
    logger.info("POST /admin/workers may register workers at: %s", app.state.worker_allow)
    redis = _state_redis(app) if is_redis_url(settings.state_url) else None
    return wrap_app(app, security, host=settings.host, redis=redis, tracer=tracer)


def _state_redis(app: GatewayApp) -> Callable[[], Redis | None]:
    """The state's one Redis client once the app's lifespan has opened it (``app.state.deps``), else None:
    the protective layers wrap the app from outside that lifespan, so they are handed the client late."""

    def client() -> Redis | None:
        deps: Deps | None = getattr(app.state, "deps", None)
        return deps.state.redis if deps is not None else None

    return client


def serve(
    settings: Settings,
    security: SecuritySettings,
    grace_s: float,
    reload_source: WorkerSource | None = None,
    child: ChildRole | None = None,
    http_server: str = "kvgate",
    reraise_signal: bool = False,
    limits: ServerLimits | None = None,
) -> bool:
    """Run the gateway until SIGINT/SIGTERM (graceful: in-flight requests get ``grace_s``); as ``child``
    of a ``--processes`` parent, on a port it shares with its siblings; with ``http_server`` (one of
    ``HTTP_SERVERS``) handling the client connections. ``reraise_signal``: once shut down, raise the
    signal that stopped the server again, for a caller whose own handler says how the process ended
    (``kvgate demo``; uvicorn always does this). ``limits``: the client connections' (``--client-*``).

    Raises:
        ConfigError: the preflight (``gateway.deps.preflight``) found the configuration unworkable.
    """
    sockets = None
    if child is None:
        check_port_free(settings.host, settings.port)
    else:
        try:
            sockets = [reuse_port_socket(settings.host, settings.port)]
        except OSError as exc:
            raise ConfigError(
                f"--host {settings.host} --port {settings.port}: cannot listen there ({exc.strerror})"
            ) from None
    settings, deps = asyncio.run(preflight(settings))
    app = build_asgi(settings, security, reload_source, deps)
    if child is not None:
        app = tag_responses(app, child.index)
    on_started = child.report_ready if child is not None else None
    if limits is None:
        limits = ServerLimits(keep_alive_s=KEEP_ALIVE_S)
    if http_server == "kvgate":
        lean = H1Server(app, grace_s=grace_s, limits=limits, backlog=4096, on_started=on_started)
        gc.freeze()  # as below
        lean.run(settings.host, settings.port, sockets)
        if reraise_signal and lean.stopped_by is not None:
            signal.raise_signal(lean.stopped_by)
        return lean.started
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=limited_protocol(limits),
        lifespan="on",
        access_log=False,
        log_level=settings.log_level,
        backlog=4096,
        timeout_keep_alive=max(1, math.ceil(limits.keep_alive_s)),
        h11_max_incomplete_event_size=limits.max_head_bytes,
        timeout_graceful_shutdown=max(1, math.ceil(grace_s)),
    )
    server = _Server(config, on_started)
    # Everything imported so far (FastAPI, pydantic, the routes' models: ~100k objects) lives as long as the
    # process; frozen, the garbage collector stops rescanning it on every full collection (measured:
    # streaming CPU per request 170 → 151-160 µs in loadtest.bench_proxy).
    gc.freeze()
    server.run(sockets)
    return server.started


class _Server(uvicorn.Server):
    """uvicorn's server, calling ``on_started`` once it serves (a ``--processes`` child tells its parent)."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None] | None) -> None:
        super().__init__(config)
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_started is not None:
            self._on_started()


def supervise(num_processes: int, settings: Settings, argv: Sequence[str], grace_s: float) -> int | None:
    """Run ``num_processes`` gateway processes under this one (``gateway.processes``); None when they
    cannot share routing state (memory state and no ``redis-server``): the caller serves alone.

    Raises:
        ConfigError: the address is taken or the preflight failed (checked before any child starts).
    """
    redis_server = find_redis_server() if settings.state_url == "memory" else None
    if settings.state_url == "memory" and redis_server is None:
        logger.warning(
            "--processes %d needs shared routing state: give --state redis://… or put redis-server on "
            "PATH; serving with 1 process", num_processes,
        )  # fmt: skip
        return None
    check_port_free(settings.host, settings.port)
    served, _ = asyncio.run(preflight(settings))
    # The children hash in the block the parent's probe chose: probes of their own could disagree (a worker
    # answering one child late), and processes sharing an index must hash alike.
    pinned = ["--block-size", str(served.block_size)] if served.block_size != settings.block_size else []
    with contextlib.ExitStack() as stack:
        state_url = settings.state_url
        if redis_server is not None:
            try:
                state_url = stack.enter_context(private_redis(redis_server))
            except RuntimeError as exc:
                sys.stderr.write(f"kvgate gateway: {exc}\n")
                return 1

        def command(index: int, ready_fd: int | None) -> list[str]:
            ready = ["--ready-fd", str(ready_fd)] if ready_fd is not None else []
            return [sys.executable, "-m", "kvgate.cli", *argv, "--processes", "1", "--state", state_url,
                    "--process-index", str(index), *pinned, *ready]  # fmt: skip

        code: int = Supervisor(num_processes, command, grace_s).run()
    return code


def check_port_free(host: str, port: int) -> None:
    """Fail before start-up work when the address is taken (uvicorn would find out only after it).

    Raises:
        ConfigError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"--host {host} --port {port}: cannot listen there ({exc.strerror})") from None


def raise_open_files_limit(
    settings: Settings,
    *,
    getrlimit: Callable[[int], tuple[int, int]] = resource.getrlimit,
    setrlimit: Callable[[int, tuple[int, int]], None] = resource.setrlimit,
) -> int:
    """Raise the soft open-files limit to the hard one (kept as it is when that is not permitted), log how
    many client connections the gateway can hold, and return that number.

    Each proxied request holds a client connection and an upstream one; the upstream ones are bounded by
    the workers' caps (``UpstreamLimits.cap``; before a worker advertises its slots, the default), which
    are reserved from the limit with the gateway's own descriptors.
    """
    soft, hard = getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    wanted = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if wanted > soft:
        try:
            setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            logger.info("cannot raise the open files limit", extra={"error": repr(exc)})
    workers = len(settings.workers)
    reserved = workers * (settings.upstream.cap(0) + 1) + _BASE_FDS  # + 1: the worker's health probes
    clients = max(0, soft - reserved)
    level = logging.WARNING if clients < workers * settings.upstream.cap(0) else logging.INFO
    logger.log(
        level,
        "open files limit %d (was %d): room for about %d concurrent client connections "
        "(%d descriptors reserved for %d worker(s)' upstream connections and the gateway's own)",
        soft, before, clients, reserved, workers,
    )  # fmt: skip
    return clients


def _log_build() -> None:
    """Say whether the request path runs compiled (``kvgate_core.native``): a stale build is plain Python."""
    state = native.guard()
    if state.compiled:
        logger.info("request path: compiled with mypyc")
    elif native.compiled_modules():
        logger.warning("request path: plain Python, the compiled build is not used (%s)", state.reason)
    else:
        logger.info("request path: plain Python (%s)", state.reason)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, json=args.log_format == "json")
    child = ChildRole(args.process_index, args.ready_fd) if args.process_index is not None else None
    if child is not None:
        label_logs(child.index, json=args.log_format == "json")
    try:
        settings = from_args(args)
        security = security_from_args(args)
        limits = client_limits_from_args(args)
        if not settings.workers:
            raise ConfigError("give at least one --worker URL (or KVGATE_WORKER / worker: in --config)")
        raise_open_files_limit(settings)
        _log_build()
        argv = ["gateway", *sys.argv[sys.argv.index("gateway") + 1 :]] if "gateway" in sys.argv else None
        if args.processes > 1 and child is None and argv is not None:
            code = supervise(args.processes, settings, argv, args.shutdown_grace_s)
            if code is not None:
                return code
        source = _worker_source(argv) if argv is not None else None
        started = serve(
            settings, security, args.shutdown_grace_s, source, child, args.http_server, limits=limits
        )
    except ConfigError as exc:
        sys.stderr.write(f"kvgate gateway: {exc.message}\n")
        return 2
    except ValueError as exc:  # security and client-limit flags
        sys.stderr.write(f"kvgate gateway: {exc}\n")
        return 2
    return 0 if started else 1
