"""``kvgate worker``: serve an engine (the real one, or ``--sim``) over the worker HTTP surface.

The real engine is built by ``workers.engine.serve.build_engine(args)``, imported only when ``--sim`` is
absent so a simulated worker needs neither torch nor model files.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import TYPE_CHECKING, Any

from kvgate_core.kvcontract.hashing import DEFAULT_BLOCK_SIZE

if TYPE_CHECKING:
    from kvgate_core.tokenize.bundle import TokenizerBundle
    from workers.engine_api import Engine
    from workers.server.response_store import ResponseStore
    from workers.sim.tier import SimTier

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``kvgate worker`` (each also reads ``KVGATE_<DEST>`` and the ``--config`` YAML)."""
    a = parser.add_argument
    a("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    a("--port", type=int, default=9001, help="port to bind (default 9001)")
    a("--model", default="tiny", help="model: a Hugging Face directory, a .gguf file, 'tiny' or 'smollm2'")
    a(
        "--model-name",
        default=None,
        help="served model id (default: kvgate-sim with --sim, else from --model)",
    )
    a("--worker-id", default=None, help="id stamped on KV events (default HOST:PORT)")
    a("--role", choices=["both", "prefill", "decode"], default="both", help="role in a PD fleet")
    a("--sim", action="store_true", help="run the simulated engine (no model, faithful KV accounting)")
    a(
        "--foreign",
        action="store_true",
        help="with --sim: look like a generic OpenAI engine (no KV events, /load or tokenizer routes; "
        "whitespace words as tokens; owned_by foreign-sim)",
    )
    a("--kv-tier", default=None, help="shared DRAM tier, redis://HOST:PORT/DB")
    a("--ssd-dir", default=None, help="directory of the SSD tier")
    a("--device", choices=["auto", "cpu", "cuda"], default="auto", help="device of the real engine")
    a("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="tokens per KV block (default 16)")
    a("--kv-tokens", type=int, default=None, help="KV pool capacity in tokens (sim default 1048576)")
    a("--max-model-len", type=int, default=None, help="context length (sim default 32768)")
    a("--prefill-tps", type=float, default=20_000.0, help="sim: uncached prompt tokens per second")
    a("--decode-tps", type=float, default=50.0, help="sim: output tokens per second per running sequence")
    a("--max-running", type=int, default=256, help="batch slots; further requests queue FIFO")
    a("--tokenizer", default=None, help="tokenizer.json, HF directory or .gguf (sim default: byte-level)")
    a("--seed", type=int, default=0, help="seed of the real engine's random weights/sampling")
    a(
        "--response-store-size",
        type=int,
        default=1024,
        help="finished /v1/responses objects kept for retrieval and previous_response_id (0: none)",
    )
    a(
        "--response-store-ttl",
        type=float,
        default=3600.0,
        help="seconds a stored /v1/responses object is kept (default 3600)",
    )
    a("--log-level", default="info", help="log level (debug, info, warning)")
    a("--otlp-endpoint", default=None, help="OTLP/HTTP traces endpoint: continue the gateway's traces")
    _sim_tier_arguments(parser)


def _sim_tier_arguments(parser: argparse.ArgumentParser) -> None:
    from workers.sim.tier import add_tier_arguments

    add_tier_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Build the engine and serve it until SIGINT/SIGTERM; returns the exit status."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        if args.foreign and not args.sim:
            raise ValueError("--foreign needs --sim (it makes the simulated worker look like another engine)")
        store = _response_store(args)
        engine = _build_sim(args) if args.sim else _build_real(args)
    except (ValueError, OSError, _MissingEngineError) as exc:
        print(f"kvgate worker: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from workers.server.app import create_app

    app: Any = create_app(engine, responses=store, **_surface(args))
    if args.otlp_endpoint:
        from kvgate_core.tracing import TracingMiddleware, build_tracer_provider

        provider = build_tracer_provider("kvgate-worker", otlp_endpoint=args.otlp_endpoint)
        app = TracingMiddleware(app, provider.get_tracer("kvgate.worker"))
    config = uvicorn.Config(
        app, host=args.host, port=args.port, loop="uvloop", http="httptools", access_log=False,
        log_level=args.log_level.lower(), timeout_graceful_shutdown=5, backlog=4096, timeout_keep_alive=75,
    )  # fmt: skip
    uvicorn.Server(config).run()  # handles SIGINT/SIGTERM: stops accepting, drains, runs the lifespan exit
    return 0


class _MissingEngineError(Exception):
    """The real engine is not installed or not built yet."""


def _response_store(args: argparse.Namespace) -> ResponseStore:
    """The store of finished ``/v1/responses`` objects, sized by ``--response-store-size/-ttl``."""
    from workers.server.response_store import ResponseStore

    return ResponseStore(args.response_store_size, args.response_store_ttl)


def _surface(args: argparse.Namespace) -> dict[str, Any]:
    """``create_app``'s keywords: a ``--foreign`` sim hides what would tell a gateway it is kvgate's."""
    if not args.foreign:
        return {}
    from workers.sim.foreign import FOREIGN_OWNED_BY

    return {"owned_by": FOREIGN_OWNED_BY, "introspection": False}


def _sim_bundle(args: argparse.Namespace, model: str) -> TokenizerBundle:
    from kvgate_core.tokenize.bundle import byte_bundle, load_bundle

    if args.foreign:
        if args.tokenizer:
            raise ValueError("--foreign brings its own tokenizer (whitespace words): drop --tokenizer")
        from workers.sim.foreign import foreign_bundle

        return foreign_bundle(model)
    return load_bundle(args.tokenizer, model=model) if args.tokenizer else byte_bundle(model)


def _build_sim(args: argparse.Namespace) -> Engine:
    from workers.sim.engine import DEFAULT_MODEL, SimConfig, SimEngine
    from workers.sim.scheduler import SimTiming

    model = args.model_name or DEFAULT_MODEL
    bundle = _sim_bundle(args, model)
    context = {"max_model_len": args.max_model_len} if args.max_model_len else {}
    timing = SimTiming(
        prefill_tps=args.prefill_tps, decode_tps=args.decode_tps, max_running=args.max_running, **context
    )
    pool = {"kv_tokens": args.kv_tokens} if args.kv_tokens else {}
    worker_id = args.worker_id or f"{args.host}:{args.port}"
    config = SimConfig(model=model, worker_id=worker_id, block_size=args.block_size, timing=timing, **pool)
    return SimEngine(config, bundle, tier=_sim_tier(args, model))


def _sim_tier(args: argparse.Namespace, model: str) -> SimTier | None:
    """The sim's shared tier when ``--kv-tier`` is given (pull costs from the ``--tier-pull-*`` flags)."""
    if not args.kv_tier:
        return None
    from workers.sim.tier import SimTier, pull_cost_from_args

    return SimTier.from_url(args.kv_tier, model, pull_cost_from_args(args, args.block_size))


def _build_real(args: argparse.Namespace) -> Engine:
    try:
        serve = importlib.import_module("workers.engine.serve")
    except ModuleNotFoundError as exc:
        hint = "install the worker extra: pip install 'kvgate[worker]'" if exc.name == "torch" else (
            f"the real engine is unavailable ({exc}); use --sim for a simulated worker")  # fmt: skip
        raise _MissingEngineError(hint) from exc
    engine: Engine = serve.build_engine(args)
    return engine


def main(argv: list[str] | None = None) -> int:
    """``python -m workers.cli``: the worker without the rest of the ``kvgate`` command."""
    parser = argparse.ArgumentParser(prog="kvgate worker", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
