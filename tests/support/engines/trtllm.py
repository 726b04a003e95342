"""A fake TensorRT-LLM ``trtllm-serve`` (PyTorch backend), after its own source (the files read: docs/engines.md).

Version: TensorRT-LLM ``main`` of 2026 (``tensorrt_llm/serve/openai_server.py``; PyPI lists 1.2.1, which
``/version`` reports).

Reproduces:

- ``GET /v1/models``: one card, ``id`` = the basename of ``--model`` when it is an existing directory (else
  ``--model`` as given), ``owned_by: "tensorrt_llm"``; the request's ``model`` is not checked and replies name
  the served id.
- ``GET /health`` (200, empty), ``/health_generate`` (a one-token chat: "Generation health check OK"),
  ``/version`` (``{"version": "1.2.1"}``), ``/perf_metrics`` (``[]``).
- ``GET /metrics`` is JSON, *drains*, and is *slow*: the iteration stats recorded since the last read
  (``iter``, ``iterLatencyMS``, ``numActiveRequests``, ``numQueuedRequests``, ``numCompletedRequests``,
  ``maxNumActiveRequests``, ``kvCacheStats{…tokensPerBlock, allocTotalBlocks, maxNumBlocks…}``,
  ``inflightBatchingStats{…numPausedRequests…}`` …). The handler iterates ``get_stats_async(2)``
  (``serve/openai_server.py``), an ``IterationResult`` (``executor/result.py``) whose ``__anext__`` waits up
  to 2 s for each next entry and ends only after 2 s without one; ended, it answers ``[]`` at once until a
  new request is submitted (``mark_undone``). So after any traffic a read takes ≥ 2 s, and under steady load
  it does not answer until the load pauses. Stats are recorded only with ``--enable-iter-perf-stats``
  (``enable_iter_perf_stats`` defaults to False on the PyTorch backend, ``llmapi/llm_args.py``): without it
  ``/metrics`` is always ``[]``. An iteration is recorded every decode step while requests are active (plus
  one when the engine goes idle), at most 1000 kept.
- ``/prometheus/metrics`` only with ``--return-perf-metrics`` (``trtllm_num_requests_running``,
  ``trtllm_num_requests_waiting``, ``trtllm_kv_cache_utilization`` …); with it the server's own collector
  drains the stats queue every 0.2 s, so a JSON ``/metrics`` reader then mostly gets ``[]`` (the real
  second-reader problem).
- ``POST /kv_cache_events`` drains the KV events (only with ``--event-buffer-max-size N`` > 0, as
  ``kv_cache_config.event_buffer_max_size``; ``[]`` otherwise) in ``KVCacheEventSerializer``'s JSON:
  ``{"event_id", "window_size", "data": {"type": "created" | "stored" | "removed", …}}``; a ``created`` event
  first; ``stored`` carries ``parent_hash`` and ``blocks[{type: "stored_block", block_hash, tokens[{type:
  "unique_token", token_id, token_extra_id}], cache_level, priority}]``; partial trailing blocks are stored
  and announced (partial reuse is on by default: ``--no-partial-reuse`` turns it off);
  ``--extra-window-size W`` repeats every event for a second, smaller attention window (VSWA models).
- ``tokens_per_block`` 32 (``--tokens-per-block``); ``cached_tokens`` always in usage (0 when none).
- Streams echo the request's ``model`` in every chunk (``ChatPostprocArgs.from_request``), where
  non-streamed replies name the served id.
- Streams: the first (role) chunk is written ``data: {json} \\n\\n`` (a space before the blank line); chunks
  are dumped ``exclude_none``; usage chunk only with ``include_usage``; **no error event**: a mid-stream
  failure re-raises and the connection drops without ``[DONE]``. A failed non-streamed request is answered
  400 ``BadRequestError`` (the server's blanket ``except Exception``).
- Token-in: ``prompt_token_ids`` on the chat route; ``cache_salt`` salts the first block.

Not reproduced: the ZMQ KV-event push of main (PR #17023), ``/v1/chat/completions/render``, ``/server_info``,
the responses API, disaggregation, the libstdc++ ``BlockKeyHasher`` (hashes are this fake's own 64-bit chain).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.engines.cache import Block
from tests.support.engines.core import EngineStats, FakeEngine, GenRequest
from tests.support.engines.oai_response import Formatter, Reply, drop_none, json_response
from tests.support.engines.prom import Sample, metrics_response
from tests.support.engines.server import FakeServer, build_app, engine_config

NAME = "trtllm"
VERSION = "1.2.1"
DEFAULT_MODEL = "trtllm-fake"
WINDOW_SIZE = 32_768
MAX_ITERATIONS = 1000


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens-per-block", type=int, default=32, help="KV block size (default 32)")
    parser.add_argument("--event-buffer-max-size", type=int, default=0, help="KV events kept for the drain")
    parser.add_argument("--return-perf-metrics", action="store_true", help="mount /prometheus/metrics")
    parser.add_argument(
        "--enable-iter-perf-stats", action="store_true", help="record iteration stats (off: /metrics is [])"
    )
    parser.add_argument(
        "--metrics-wait-s", type=float, default=2.0,
        help="how long /metrics waits for a next iteration entry (the engine's 2 s; shorter in tests)",
    )  # fmt: skip
    parser.add_argument("--no-partial-reuse", action="store_true", help="no partial trailing blocks")
    parser.add_argument("--extra-window-size", type=int, default=None, help="a second attention window")


def served_id(model: str) -> str:
    path = Path(model)
    return path.name if path.is_dir() else model


class EventDrain:
    """The KV event queue behind ``POST /kv_cache_events`` (a ``core.CacheListener``)."""

    def __init__(self, max_size: int, windows: Sequence[int], num_blocks: int) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=max(1, max_size))
        self.enabled = max_size > 0
        self.windows = windows
        self._next_id = 0
        created = {"type": "created", "num_blocks_per_cache_level": [num_blocks, 0]}
        self._add(created)

    def _add(self, data: dict[str, Any]) -> None:
        if not self.enabled:
            return
        for window in self.windows:
            self.events.append({"event_id": self._next_id, "data": data, "window_size": window})
            self._next_id += 1

    def on_cache_events(self, stored: Sequence[Block], removed: Sequence[Block], cleared: bool) -> None:
        if removed:
            self._add({"type": "removed", "block_hashes": [b.hash for b in removed]})
        if stored:
            blocks = [
                {"type": "stored_block", "block_hash": b.hash, "cache_level": 0, "priority": 35,
                 "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in b.tokens]}
                for b in stored
            ]  # fmt: skip
            self._add({"type": "stored", "parent_hash": stored[0].parent, "blocks": blocks})

    def drain(self) -> list[dict[str, Any]]:
        out = list(self.events)
        self.events.clear()
        return out


def iteration_stat(s: EngineStats, n: int, completed: int, latency_ms: float) -> dict[str, Any]:
    max_blocks = s.kv_tokens // s.block_size
    used = min(max_blocks, -(-s.kv_used_tokens // s.block_size))
    return {
        "cpuMemUsage": 0, "gpuMemUsage": 1_500_000_000, "pinnedMemUsage": 0, "iter": n,
        "iterLatencyMS": round(latency_ms, 3), "newActiveRequestsQueueLatencyMS": 0.0,
        "maxBatchSizeRuntime": s.max_running, "maxNumActiveRequests": s.max_running,
        "numActiveRequests": s.running, "numQueuedRequests": s.waiting, "numCompletedRequests": completed,
        "numNewActiveRequests": 0, "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
        "kvCacheStats": {
            "maxNumBlocks": max_blocks, "freeNumBlocks": max_blocks - used, "usedNumBlocks": used,
            "tokensPerBlock": s.block_size, "allocTotalBlocks": used, "allocNewBlocks": 0, "reusedBlocks": 0,
            "missedBlocks": 0, "cacheHitRate": round(s.cache_hit_rate, 4),
        },
        "inflightBatchingStats": {
            "numScheduledRequests": s.running, "numContextRequests": 0, "numGenRequests": s.running,
            "numPausedRequests": 0, "numCtxTokens": 0, "microBatchId": 0, "avgNumDecodedTokensPerIter": 1.0,
        },
    }  # fmt: skip


class IterationStats:
    """The executor's iteration-stats queue: filled while the engine works (only with
    ``enable_iter_perf_stats``), drained by every reader; ``read`` is the JSON ``/metrics`` handler's
    ``IterationResult`` iteration (see the module docstring)."""

    def __init__(self, engine: FakeEngine, *, enabled: bool, wait_s: float = 2.0) -> None:
        self.engine = engine
        self.enabled = enabled
        self.wait_s = wait_s
        self.queue: deque[dict[str, Any]] = deque(maxlen=MAX_ITERATIONS)
        self.last: dict[str, Any] | None = None
        self._iter = 0
        self._done = False  # the result ended (2 s without an entry): [] until a new request comes
        self._added = asyncio.Event()

    def drain(self) -> list[dict[str, Any]]:
        out = list(self.queue)
        self.queue.clear()
        if out:
            self.last = out[-1]
        return out

    async def read(self) -> list[dict[str, Any]]:
        """Entries until none came for ``wait_s``; nothing, at once, once ended and no request came since."""
        out: list[dict[str, Any]] = []
        while not self._done:
            out += self.drain()
            self._added.clear()
            try:
                await asyncio.wait_for(self._added.wait(), self.wait_s)
            except TimeoutError:
                self._done = True
        return out

    async def run(self) -> None:
        cfg = self.engine.config
        step = max(0.005, cfg.decode_ms_per_token * cfg.slow_factor / 1000)
        was_active, finished, submitted = False, 0, 0
        while True:
            await asyncio.sleep(step)
            s = self.engine.stats()
            if (now_submitted := s.running + s.waiting + s.finished_total) > submitted:
                self._done = False  # a new request: the executor's mark_undone
            submitted = now_submitted
            active = s.running + s.waiting > 0
            if self.enabled and (active or was_active):
                self.queue.append(iteration_stat(s, self._iter, s.finished_total - finished, step * 1000))
                self._added.set()
                self._iter += 1
                finished = s.finished_total
            was_active = active

    async def collect(self) -> None:
        """The server's Prometheus collector loop (``--return-perf-metrics``): it drains the queue too."""
        while True:
            await asyncio.sleep(0.2)
            self.drain()


class TrtFormatter(Formatter):
    def __init__(self, model_id: str) -> None:
        self.model_id = model_id

    def model_name(self, reply: Reply) -> str:
        return self.model_id

    def envelope(self, reply: Reply, *, chunk: bool) -> dict[str, Any]:
        out = super().envelope(reply, chunk=chunk)
        if chunk:  # streamed chunks echo the request's model
            out["model"] = reply.job.body.get("model", self.model_id)
        return out

    def usage(self, reply: Reply) -> dict[str, Any] | None:
        base = super().usage(reply) or {}
        return {**base, "prompt_tokens_details": {"cached_tokens": reply.gen.cached_tokens}}

    def response(self, reply: Reply, text: str, finish: str) -> dict[str, Any]:
        out = super().response(reply, text, finish)
        choice = out["choices"][0]
        if reply.chat:
            choice["message"].update(reasoning_content=None, tool_calls=[])
        choice.update(stop_reason=None, disaggregated_params=None)
        out["prompt_token_ids"] = None
        return out

    def error_event(self, message: str) -> dict[str, Any] | None:
        return None  # no SSE error event: the exception drops the connection

    def failure_response(self, message: str) -> Response:
        return self.error_response(400, message)

    def frame(self, obj: dict[str, Any], *, first: bool) -> bytes:
        choices = obj.get("choices") or [{}]
        role_chunk = first and "role" in (choices[0].get("delta") or {})
        return b"data: " + orjson.dumps(drop_none(obj)) + (b" \n\n" if role_chunk else b"\n\n")


def _prometheus(stats: IterationStats) -> Response:
    s = stats.engine.stats()
    labels = {"model_name": "undefined", "engine_type": "undefined"}
    gauges = {
        "trtllm_num_requests_running": s.running, "trtllm_num_requests_waiting": s.waiting,
        "trtllm_kv_cache_utilization": s.kv_usage, "trtllm_kv_cache_hit_rate": s.cache_hit_rate,
        "trtllm_kv_cache_max_blocks": s.kv_tokens // s.block_size, "trtllm_kv_cache_tokens_per_block": s.block_size,
        "trtllm_kv_cache_used_blocks": s.kv_used_tokens // s.block_size,
        "trtllm_kv_cache_free_blocks": (s.kv_tokens - s.kv_used_tokens) // s.block_size,
    }  # fmt: skip
    samples = [Sample(k, v, labels=labels) for k, v in gauges.items()]
    samples.append(
        Sample("trtllm_prompt_cached_tokens_total", s.cached_tokens_total, kind="counter", labels=labels)
    )
    return metrics_response(samples)


def create_app(args: argparse.Namespace) -> Starlette:
    model_id = served_id(args.model)
    bs = args.tokens_per_block
    windows = [WINDOW_SIZE] + ([args.extra_window_size] if args.extra_window_size else [])
    drain = EventDrain(args.event_buffer_max_size, windows, args.kv_tokens // bs)
    engine = FakeEngine(engine_config(args, block_size=bs, partial_blocks=not args.no_partial_reuse), [drain])
    stats = IterationStats(engine, enabled=args.enable_iter_perf_stats, wait_s=args.metrics_wait_s)
    fmt = TrtFormatter(model_id)
    server = FakeServer(NAME, VERSION, engine, fmt, token_field="prompt_token_ids")

    async def models(_: Request) -> Response:
        card = {"id": model_id, "object": "model", "created": int(time.time()), "owned_by": "tensorrt_llm"}
        return json_response({"object": "list", "data": [card]})

    async def health(_: Request) -> Response:
        return Response(status_code=503 if engine.faults.unhealthy else 200)

    async def health_generate(_: Request) -> Response:
        await engine.submit(GenRequest([104, 105], 1)).collect()
        return Response("Generation health check OK")

    async def version(_: Request) -> Response:
        return json_response({"version": VERSION})

    async def metrics(_: Request) -> Response:
        return json_response(await stats.read())

    async def perf_metrics(_: Request) -> Response:
        return json_response([])

    async def kv_cache_events(_: Request) -> Response:
        return json_response(drain.drain())

    async def prometheus(_: Request) -> Response:
        return _prometheus(stats)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(stats.run())]
        if args.return_perf_metrics:
            tasks.append(loop.create_task(stats.collect()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    routes = [
        Route("/v1/models", models), Route("/health", health), Route("/health_generate", health_generate),
        Route("/version", version), Route("/metrics", metrics), Route("/perf_metrics", perf_metrics),
        Route("/kv_cache_events", kv_cache_events, methods=["POST"]),
    ]  # fmt: skip
    if args.return_perf_metrics:
        routes.append(Route("/prometheus/metrics", prometheus))
    return build_app(server, routes, lifespan=lifespan)
