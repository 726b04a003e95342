"""The command line of the engine fakes: run one of them on loopback.

``python -m tests.support.engines ENGINE --port N [--model NAME] [--slow-factor F] [--max-running R]
[--kv-tokens T] [--prefill-ms-per-token P] [--decode-ms-per-token D] [engine flags…]``

ENGINE is ``sglang``, ``trtllm``, ``tgi``, ``lmdeploy`` or ``mii``; ``python -m tests.support.engines ENGINE
--help`` lists the engine's own flags (named as the engine names them: ``--enable-metrics``, ``--page-size``,
``--kv-events-config``, ``--return-perf-metrics``, ``--enable-prefix-caching``, ``--broken`` …). The server
always binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

import uvicorn
from starlette.applications import Starlette

from tests.support.engines import lmdeploy, mii, sglang, tgi, trtllm

ENGINES: dict[str, ModuleType] = {m.NAME: m for m in (sglang, trtllm, tgi, lmdeploy, mii)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.engines", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="engine", required=True, metavar="ENGINE")
    for name, module in ENGINES.items():
        p = sub.add_parser(
            name, help=f"{name} {module.VERSION}", description=(module.__doc__ or "").split("\n")[0]
        )
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--model", default=module.DEFAULT_MODEL, help="served model (path or name)")
        p.add_argument("--slow-factor", type=float, default=1.0, help="multiply prefill and decode delays")
        p.add_argument("--max-running", type=int, default=8, help="running sequences; more wait in a queue")
        p.add_argument("--kv-tokens", type=int, default=65_536, help="KV cache capacity in tokens")
        p.add_argument("--prefill-ms-per-token", type=float, default=0.05, help="per uncached prompt token")
        p.add_argument("--decode-ms-per-token", type=float, default=5.0, help="per generated token")
        module.add_flags(p)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def create_app(argv: Sequence[str]) -> Starlette:
    """The app the command line describes (``ENGINE --port N …``), for in-process tests too."""
    args = parse_args(argv)
    app: Starlette = ENGINES[args.engine].create_app(args)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    app = ENGINES[args.engine].create_app(args)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", timeout_graceful_shutdown=2)
