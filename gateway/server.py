"""``kvgate gateway``: flags, then uvicorn (uvloop + httptools) serving ``create_app``."""

from __future__ import annotations

import argparse
import logging
import sys
import time

import uvicorn

from gateway.app import create_app
from gateway.deps import build_policy
from gateway.errors import ConfigError
from gateway.settings import DEFAULT_POLICY, Settings, Timeouts, from_args

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the gateway's flags (each also readable from YAML and ``KVGATE_*``)."""
    t = Timeouts()
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument(
        "--worker", action="append", default=[],
        help="worker base URL, repeatable; URL#role=prefill|decode|both[&id=NAME]",
    )  # fmt: skip
    parser.add_argument(
        "--policy", default=DEFAULT_POLICY, help=f"routing policy name (default {DEFAULT_POLICY})"
    )
    parser.add_argument(
        "--policy-config", default=None, help="YAML file with the policy spec (type, params…)"
    )
    parser.add_argument("--state", default="memory", help="state backend: memory | redis://HOST:PORT/DB")
    parser.add_argument(
        "--tokenizer", default="auto", help="auto | none | bytes | PATH to tokenizer.json/dir"
    )
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    parser.add_argument(
        "--max-body-bytes", type=int, default=8 * 1024 * 1024, help="request body limit (413)"
    )
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
    parser.add_argument(
        "--role-pools", default="auto",
        help="PD role pools: auto (under a PD policy) | on | off | ratio=2,dwell_s=10,…",
    )  # fmt: skip
    parser.add_argument("--log-level", default="warning", help="debug | info | warning | error")


def serve(settings: Settings) -> bool:
    """Run the gateway until SIGINT/SIGTERM; False when it failed to start."""
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=settings.log_level,
        backlog=4096,
        timeout_keep_alive=30,
    )
    server = uvicorn.Server(config)
    server.run()
    return server.started


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = from_args(args)
        if not settings.workers:
            raise ConfigError("give at least one --worker URL (or KVGATE_WORKER / worker: in --config)")
        build_policy(settings, time.monotonic)  # fail fast on a bad policy, before binding the port
        started = serve(settings)
    except ConfigError as exc:
        sys.stderr.write(f"kvgate gateway: {exc.message}\n")
        return 2
    return 0 if started else 1
