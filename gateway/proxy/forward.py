"""The proxy: route, forward the client's original bytes, retry elsewhere before the first byte.
Compiled with mypyc (``docs/development.md``: what that rules out).

Each attempt holds the worker's in-flight accounting (a ``Hold``) until the worker has answered in full, and
at the latest until the attempt ends (``try/finally``), so a retried, failed, finished or cancelled request
always releases it. The hold ends before the client gets the answer's last bytes, so a client's next request
never sees its own finished request as the worker's load. Each attempt's body is shaped for its worker's
engine (``proxy.shaping``: the client's own bytes for kvgate's workers). Non-streaming answers are read whole
and passed on; streaming ones go through ``proxy.stream.StreamRelay``. Either way a client that leaves
cancels the attempt, which closes the upstream connection (``proxy.disconnect``). A response that reports
cached tokens teaches the worker's ``EngineFacts`` that its engine reuses prefixes (``note_cached_tokens``).
Each finished attempt is also counted in the worker's live window (``observability.worker_stats``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from gateway.engines.affinity import note_cached_tokens, note_usage
from gateway.errors import (
    NoHealthyWorker,
    ResponseNotFound,
    UpstreamError,
    UpstreamSaturated,
    WorkerTimeout,
    WorkerUnavailable,
)
from gateway.fleet.registry import WorkerRecord
from gateway.observability.metrics import Metrics
from gateway.observability.worker_stats import WorkerStats
from gateway.openai.responses_sse import response_id_of
from gateway.openai.schema import Framing, ParsedRequest
from gateway.openai.sse import usage_in_answer
from gateway.proxy.direct import DirectForwarder
from gateway.proxy.disconnect import cancel_on_disconnect
from gateway.proxy.failover import RetryableFailure, Shed, backoff_s, shed_from
from gateway.proxy.passthrough import upstream_headers
from gateway.proxy.responses import proxied_headers, send_whole
from gateway.proxy.result import Result
from gateway.proxy.shaping import shape
from gateway.proxy.shed import ShedLog
from gateway.proxy.sticky import ResponseAffinity
from gateway.proxy.stream import CLIENT_GONE, OnResponseId, StreamRelay
from gateway.routing.hold import Hold
from gateway.routing.pd import PD_HEADER, PrefillRunner, prefill_body
from gateway.routing.router import Routed, Router
from gateway.settings import DEFAULT_UPSTREAM_CONNECTIONS, RetrySettings, Timeouts, UpstreamLimits
from gateway.state.protocols import LoadBoard
from kvgate_core.asgi import Receive, Send
from kvgate_core.deadline import Deadline, DeadlineWheel
from kvgate_core.h1 import H1Pool, PoolSaturatedError, Target
from kvgate_core.spans import upstream_span
from kvgate_core.tokenize.request_prompt import Endpoint
from policies.api import RouteRequest

logger = logging.getLogger(__name__)
_PD_DECODE_HEADER = f"{PD_HEADER}: decode\r\n".encode()
_UNANSWERED = Result(502, ok=False)  # an attempt's result until it has one


class Proxy:
    """Forwards OpenAI requests to the workers the router picks.

    Args:
        pool: the pooled upstream client of the request path (the PD prefill calls use it too).
        router: chooses workers.
        load: in-flight accounting.
        metrics: request counters and timings.
        timeouts: connect / first byte / idle deadlines.
        retry: attempts and backoff.
        rng: jitter source.
        sleep: injected for tests.
        prefill: runs the PD prefill step (default: on ``pool``, deadline ``timeouts.ttfb_s``).
        limits: the upstream connection cap per worker (``pool`` holds the wait queue and its bounds).
        stats: each worker's recent attempts, for the admin page (a new ``WorkerStats`` if None).
        affinity: which worker stored each Responses API response (None: the Responses API's
            ``previous_response_id`` is answered 404, nothing is recorded).
    """

    def __init__(
        self,
        *,
        pool: H1Pool,
        router: Router,
        load: LoadBoard,
        metrics: Metrics,
        timeouts: Timeouts,
        retry: RetrySettings,
        rng: random.Random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        prefill: PrefillRunner | None = None,
        limits: UpstreamLimits | None = None,
        stats: WorkerStats | None = None,
        affinity: ResponseAffinity | None = None,
    ) -> None:
        self.affinity = affinity
        wheel = DeadlineWheel()  # one timer for every request's deadlines (``kvgate_core.deadline``)
        self._wheel = wheel
        self.direct = DirectForwarder(pool, timeouts, metrics, wheel)
        self.stats = stats if stats is not None else WorkerStats()
        self._pool = pool
        self._targets: dict[str, Target] = {}
        self._prefill = prefill or PrefillRunner(pool=pool, load=load, timeout_s=timeouts.ttfb_s)
        self._router = router
        self._load = load
        self._metrics = metrics
        self._timeouts = timeouts
        self._retry = retry
        self._rng = rng
        self._sleep = sleep
        self._relay = StreamRelay(pool, timeouts, on_first_token=router.first_token, wheel=wheel)
        self._limits = limits or UpstreamLimits()
        self._shed = ShedLog(metrics)

    async def handle(
        self, parsed: ParsedRequest, req: RouteRequest, raw: bytes, receive: Receive, send: Send
    ) -> None:
        """Answer one request through a worker, retrying on others before the first byte.

        Raises:
            ModelNotFound, NoHealthyWorker: nothing can serve it.
            UpstreamSaturated: the workers tried had no upstream connection to give (nothing was sent).
            UpstreamError: every attempt failed before the first byte.
        """
        pinned = None
        if parsed.previous_response_id is not None:
            pinned = await self._owner(parsed.previous_response_id, parsed.model, "previous_response_id")
        balanced = parsed.endpoint is None
        exclude: list[str] = []
        last: UpstreamError | UpstreamSaturated | None = None
        retrying = ""  # why the attempt before failed: counted as a retry once another worker takes it
        for attempt in range(self._retry.retries + 1):
            routed = self._route(req, pinned, exclude, balanced, last)
            if retrying:
                self._metrics.retry(retrying)
                retrying = ""
            if routed.prefill is not None:
                routed = await self._run_prefill(routed, parsed)
            try:
                with upstream_span(routed.record.id):
                    await self._attempt(routed, parsed, raw, receive, send)
                return
            except Shed as shed:
                self._shed.record(routed.record.id, shed.reason)
                if shed.final:
                    raise shed.error from None
                exclude.append(routed.record.id)
                last = shed.error
            except RetryableFailure as failure:
                routed.record.breaker.record_failure()
                exclude.append(routed.record.id)
                last = failure.error
                if pinned is not None:
                    raise last from None
                if attempt < self._retry.retries:
                    retrying = failure.reason
                    await self._sleep(backoff_s(attempt, self._retry, self._rng))
        assert last is not None, "the loop runs at least once"
        raise last

    def _route(
        self,
        req: RouteRequest,
        pinned: WorkerRecord | None,
        exclude: list[str],
        balanced: bool,
        last: UpstreamError | UpstreamSaturated | None,
    ) -> Routed:
        """The next attempt's worker: ``pinned`` (its history is there: never elsewhere), else the router's
        choice outside ``exclude``; when none is left after a failed attempt, that failure is raised."""
        try:
            if pinned is not None:
                return self._router.route_to(req, pinned, "previous_response_id")
            return self._router.route(req, exclude, balanced=balanced)
        except NoHealthyWorker:
            if last is not None:
                raise last from None
            raise

    async def _owner(self, response_id: str, model: str | None, param: str | None) -> WorkerRecord:
        if self.affinity is None:
            raise ResponseNotFound(f"Previous response with id '{response_id}' not found.", param=param)
        return await self.affinity.owner(response_id, model, param=param)

    async def _record_owner(self, routed: Routed, response_id: str) -> None:
        if self.affinity is not None:
            await self.affinity.record(response_id, routed.record.id)

    async def _run_prefill(self, routed: Routed, parsed: ParsedRequest) -> Routed:
        """PD step 1 (see ``gateway.routing.pd``): on failure, the decode worker serves alone."""
        assert routed.prefill is not None, "only called for a PD decision"
        body, tokens = prefill_body(parsed.body), routed.request.num_prompt_tokens
        outcome = await self._prefill.run(routed.prefill, parsed.route.path.decode(), body, tokens)
        self._metrics.stage("pd_prefill", outcome.seconds)
        return routed if outcome.ok else routed.without_prefill()

    async def _attempt(
        self, routed: Routed, parsed: ParsedRequest, raw: bytes, receive: Receive, send: Send
    ) -> None:
        worker = routed.record.id
        # the work this request brings: its uncached prefill (a predicted prefix hit costs nothing) + decode
        tokens = routed.uncached_tokens + (parsed.max_tokens or 0)
        target = self._targets.get(routed.record.url)
        if target is None:
            target = self._targets[routed.record.url] = Target.parse(routed.record.url)
        extra = _PD_DECODE_HEADER if routed.prefill is not None else b""
        extra += upstream_headers(routed.request.headers)
        want_usage = self._router.wants_outcomes and not routed.balanced
        framing = parsed.route.framing
        shaped = (
            shape(parsed, raw, routed.record.facts, want_usage=want_usage)
            if framing is Framing.DONE
            else None
        )
        body = raw if shaped is None else shaped.body
        request = target.post_request(parsed.route.path, body, extra)
        route = parsed.route.label
        on_id = (
            (lambda rid: self._record_owner(routed, rid))
            if parsed.endpoint is Endpoint.RESPONSES and self.affinity is not None
            else None
        )
        # ``UpstreamLimits.cap``, spelt out: a method of an interpreted dataclass is a frame per request
        fixed, running = self._limits.max_connections, routed.record.max_running
        cap = fixed if fixed is not None else running if running > 0 else DEFAULT_UPSTREAM_CONNECTIONS
        # held while waiting for a connection too: the policy sees the waiting requests as load
        hold = Hold.take(self._load, routed.record, tokens)
        start = time.perf_counter()
        result = _UNANSWERED
        try:
            if parsed.stream:
                result = await self._relay.relay(
                    routed,
                    target,
                    request,
                    receive,
                    send,
                    want_usage=want_usage,
                    on_answered=hold.end,
                    cap=cap,
                    shaped=shaped,
                    framing=framing,
                    on_response_id=on_id,
                )
            else:
                forwarded = await cancel_on_disconnect(
                    self._forward(routed, target, request, send, want_usage, hold, cap, on_id), receive
                )
                result = forwarded if forwarded is not None else Result(CLIENT_GONE, ok=False)
        except Shed:
            result = Result(503, ok=False)
            raise
        finally:
            hold.end(answered=False)
            latency_s = time.perf_counter() - start
            self._metrics.request(route, result.status, worker, latency_s)
            if result.ttfb_s is not None:
                self._metrics.ttfb(route, result.ttfb_s)
            usage = result.usage  # read once, both figures passed on
            cached, prompt = (usage.cached_tokens, usage.prompt_tokens) if usage is not None else (None, None)
            self._record_stats(routed, result, latency_s, cached, prompt)
            if cached and note_cached_tokens(routed.record.facts, cached):
                logger.info("worker reuses prefixes (it reported cached tokens)", extra={"worker": worker})
            if result.ok and want_usage and (hint := note_usage(routed.record.facts, cached)):
                logger.warning("worker %s: %s", worker, hint)
            self._router.finished(
                routed, ok=result.ok, cached_tokens=cached, latency_s=latency_s, prompt_tokens=prompt
            )

    def _record_stats(
        self, routed: Routed, result: Result, latency_s: float, cached: int | None, prompt: int | None
    ) -> None:
        """The attempt in the worker's live window; hit figures only where the feedback loop has them too
        (a prediction was made, and no PD prefill worker computed the prompt first). ``cached`` and
        ``prompt``: the worker's usage, None where it reported none."""
        req = routed.request
        # in the engine's tokens where it said (the prediction is in its tokens too)
        prompt_tokens = (
            (prompt or req.num_prompt_tokens) if req.block_hashes and routed.prefill is None else 0
        )
        ttft_s = result.ttfb_s if result.ttfb_s is not None else latency_s  # a whole answer: its latency
        self.stats.record(
            routed.record.id, result.ok, ttft_s, prompt_tokens, routed.prefix_hit_tokens, cached
        )

    async def _forward(
        self,
        routed: Routed,
        target: Target,
        request: bytes,
        send: Send,
        want_usage: bool,
        hold: Hold,
        cap: int,
        on_response_id: OnResponseId | None = None,
    ) -> Result:
        worker = routed.record.id
        try:
            async with Deadline(self._timeouts.ttfb_s, self._wheel):
                conn = await self._pool.post(target, request, cap)
                try:
                    body = await conn.read_all()
                finally:
                    self._pool.release(target, conn)
        except PoolSaturatedError as exc:
            raise shed_from(exc, worker) from None
        except TimeoutError:
            raise RetryableFailure(WorkerTimeout(f"worker {worker} timed out"), "timeout") from None
        except OSError as exc:
            raise RetryableFailure(WorkerUnavailable(f"worker {worker} failed: {exc}"), "connect") from None
        status = conn.status
        hold.end(answered=True)
        if status >= 500:
            raise RetryableFailure(
                WorkerUnavailable(f"worker {worker} answered {status}"), f"status_{status}"
            )
        routed.record.breaker.record_success()
        headers = proxied_headers(
            conn.content_type, worker, routed.prefix_hit_tokens, len(body), routed.prefill_id
        )
        if on_response_id is not None and status == 200 and (response_id := response_id_of(body)) is not None:
            await on_response_id(response_id)  # before the client can send a follow-up naming it
        await send_whole(send, status, headers, body)
        usage = usage_in_answer(body) if want_usage and status == 200 else None
        # No TTFB sample: for a whole answer it equals the latency recorded by ``_attempt``.
        return Result(status, ok=status == 200, usage=usage)
