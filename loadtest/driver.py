"""The async load driver: closed loop (fixed concurrency) or open loop (Poisson or trace timestamps).

One aiohttp session with an unbounded connection pool; SSE is parsed per line and only ``data:`` frames
are decoded. Every run is bounded by a request count and a wall-clock deadline. Per request it records
TTFT, inter-token gaps, end-to-end latency, tokens, ``cached_tokens``, the worker that served it
(``x-kvgate-worker``), the gateway's predicted prefix hit and any error.
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from loadtest.workloads import Session, WorkRequest

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(slots=True)
class RequestRecord:
    """What one request did; times are seconds since the run started (``start_s``) or durations."""

    session: str
    start_s: float
    e2e_s: float = 0.0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    worker: str | None = None
    predicted_hit_tokens: int | None = None
    status: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class DriverConfig:
    """How to drive the target.

    ``concurrency`` is used when ``rate`` is None and the sessions carry no arrival times (closed loop);
    ``rate`` (sessions/s, Poisson) or the sessions' own ``arrival_s`` make it open loop.
    """

    target: str
    stream: bool = True
    concurrency: int = 8
    rate: float | None = None
    max_requests: int | None = None
    duration_s: float = 60.0
    request_timeout_s: float = 120.0
    seed: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    progress: bool = False

    def base_for(self, session_id: str) -> str:
        """The target URL for a session: ``target`` may list several gateways, comma-separated."""
        targets = [t.strip().rstrip("/") for t in self.target.split(",") if t.strip()]
        return targets[zlib.crc32(session_id.encode()) % len(targets)]


@dataclass(slots=True)
class RunResult:
    records: list[RequestRecord]
    wall_s: float
    config: DriverConfig


class _Budget:
    """Request count and deadline shared by every sender."""

    def __init__(self, max_requests: int | None, deadline: float, clock: Callable[[], float]) -> None:
        self.left = max_requests
        self.deadline = deadline
        self.clock = clock

    def take(self) -> bool:
        if self.clock() >= self.deadline:
            return False
        if self.left is None:
            return True
        if self.left <= 0:
            return False
        self.left -= 1
        return True


def _usage_into(rec: RequestRecord, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    rec.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    rec.cached_tokens = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0


def _has_content(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta")
        if (delta and (delta.get("content") or delta.get("reasoning_content"))) or choice.get("text"):
            return True
    return False


async def _read_stream(resp: aiohttp.ClientResponse, rec: RequestRecord, t0: float) -> None:
    last: float | None = None
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        chunk = orjson.loads(payload)
        if "error" in chunk:
            rec.error = str(chunk["error"].get("message", chunk["error"]))
            return
        now = time.perf_counter()
        if _has_content(chunk):
            if rec.ttft_s is None:
                rec.ttft_s = now - t0
            elif last is not None:
                rec.itl_s.append(now - last)
            last = now
        if chunk.get("usage"):
            _usage_into(rec, chunk["usage"])


async def send_one(
    http: aiohttp.ClientSession, cfg: DriverConfig, req: WorkRequest, session_id: str, run_t0: float
) -> RequestRecord:
    """Send one request and record what happened (never raises for HTTP or protocol errors)."""
    body = dict(req.body)
    body["stream"] = cfg.stream
    if cfg.stream:
        body["stream_options"] = {"include_usage": True}
    data = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    t0 = time.perf_counter()
    rec = RequestRecord(session=session_id, start_s=t0 - run_t0)
    try:
        async with (
            asyncio.timeout(cfg.request_timeout_s),
            http.post(
                cfg.base_for(session_id) + _PATHS[req.endpoint],
                data=data,
                headers={"content-type": "application/json", **cfg.headers},
            ) as resp,
        ):
            rec.status = resp.status
            rec.worker = resp.headers.get("x-kvgate-worker")
            hit = resp.headers.get("x-kvgate-prefix-hit")
            rec.predicted_hit_tokens = int(hit) if hit and hit.isdigit() else None
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
            elif cfg.stream:
                await _read_stream(resp, rec, t0)
            else:
                obj = orjson.loads(await resp.read())
                rec.ttft_s = time.perf_counter() - t0
                _usage_into(rec, obj.get("usage"))
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    rec.e2e_s = time.perf_counter() - t0
    return rec


async def _run_session(
    http: aiohttp.ClientSession,
    cfg: DriverConfig,
    session: Session,
    budget: _Budget,
    out: list[RequestRecord],
    run_t0: float,
    on_done: Callable[[int], None],
) -> None:
    i = 0
    reqs = session.requests
    while i < len(reqs):
        group = reqs[i].parallel_group
        j = i + 1
        while group is not None and j < len(reqs) and reqs[j].parallel_group == group:
            j += 1
        batch = [r for r in reqs[i:j] if budget.take()]
        if not batch:
            return
        recs = await asyncio.gather(*(send_one(http, cfg, r, session.id, run_t0) for r in batch))
        out.extend(recs)
        on_done(len(recs))
        i = j


def _arrivals(sessions: Sequence[Session], cfg: DriverConfig) -> list[float] | None:
    if cfg.rate is not None:
        rng = random.Random(cfg.seed)
        t, times = 0.0, []
        for _ in sessions:
            t += rng.expovariate(cfg.rate)
            times.append(t)
        return times
    if sessions and all(s.arrival_s is not None for s in sessions):
        return [float(s.arrival_s or 0.0) for s in sessions]
    return None


async def run_load(sessions: Sequence[Session], cfg: DriverConfig) -> RunResult:
    """Drive ``sessions`` against ``cfg.target`` until they are done, the count or the deadline is reached."""
    records: list[RequestRecord] = []
    run_t0 = time.perf_counter()
    budget = _Budget(cfg.max_requests, run_t0 + cfg.duration_s, time.perf_counter)
    bar = _progress(cfg, sessions)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        arrivals = _arrivals(sessions, cfg)
        try:
            async with asyncio.timeout(cfg.duration_s + cfg.request_timeout_s):
                if arrivals is None:
                    await _closed_loop(http, cfg, sessions, budget, records, run_t0, bar)
                else:
                    await _open_loop(http, cfg, sessions, arrivals, budget, records, run_t0, bar)
        except TimeoutError:
            pass
    bar(0, close=True)
    return RunResult(records=records, wall_s=time.perf_counter() - run_t0, config=cfg)


async def _closed_loop(
    http: aiohttp.ClientSession,
    cfg: DriverConfig,
    sessions: Sequence[Session],
    budget: _Budget,
    out: list[RequestRecord],
    run_t0: float,
    bar: Callable[..., None],
) -> None:
    queue: asyncio.Queue[Session] = asyncio.Queue()
    for s in sessions:
        queue.put_nowait(s)

    async def worker() -> None:
        while not queue.empty() and budget.clock() < budget.deadline:
            await _run_session(http, cfg, queue.get_nowait(), budget, out, run_t0, bar)

    async with asyncio.TaskGroup() as tg:
        for _ in range(max(1, cfg.concurrency)):
            tg.create_task(worker())


async def _open_loop(
    http: aiohttp.ClientSession,
    cfg: DriverConfig,
    sessions: Sequence[Session],
    arrivals: Sequence[float],
    budget: _Budget,
    out: list[RequestRecord],
    run_t0: float,
    bar: Callable[..., None],
) -> None:
    async with asyncio.TaskGroup() as tg:
        for session, at in sorted(zip(sessions, arrivals, strict=True), key=lambda p: p[1]):
            delay = run_t0 + at - time.perf_counter()
            if run_t0 + at >= budget.deadline:
                break
            if delay > 0:
                await asyncio.sleep(delay)
            tg.create_task(_run_session(http, cfg, session, budget, out, run_t0, bar))


def _progress(cfg: DriverConfig, sessions: Sequence[Session]) -> Callable[..., None]:
    if not cfg.progress:
        return lambda n, close=False: None
    from tqdm import tqdm

    total = sum(len(s.requests) for s in sessions)
    if cfg.max_requests is not None:
        total = min(total, cfg.max_requests)
    bar = tqdm(total=total, unit="req", dynamic_ncols=True)

    def update(n: int, close: bool = False) -> None:
        bar.update(n)
        if close:
            bar.close()

    return update
