"""The routing seam: request → ``RouteRequest`` + ``WorkerView`` snapshot → ``policy.select`` → bookkeeping.
Compiled with mypyc (``docs/development.md``: what that rules out).

The router gathers what the policy declared in ``needs`` (tokens and block hashes from the injected
``PromptAnalyzer``, prefix hits from the ``KVIndex``) and nothing more, hands the policy a frozen snapshot,
then records the decision (observer hooks, the index's predicted placement, the admin page's
``DecisionLog``). Proxying lives in ``gateway.proxy``; the policy's own logic in ``policies``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from gateway.analyze.analyzer import PromptAnalyzer
from gateway.engines.profiles import EngineKind
from gateway.errors import InvalidRequest, ModelNotFound, NoHealthyWorker
from gateway.fleet.registry import Fleet, WorkerRecord
from gateway.kvindex.capacity import TokenUnits
from gateway.kvindex.feedback import PrefixFeedback
from gateway.kvindex.index import KVIndex, PrefixHit
from gateway.observability.metrics import Metrics
from gateway.openai.schema import ParsedRequest
from gateway.routing.decision_log import DecisionLog
from gateway.routing.prefill_watch import PrefillWatch
from gateway.routing.routed import Routed
from gateway.state.protocols import LoadBoard
from kvgate_core.frozen import fast_constructor
from kvgate_core.kvcontract.extra_keys import TENANT_HEADER
from policies.api import Decision, Need, Observer, Outcome, Policy, RouteRequest, WorkerId, WorkerView
from policies.builtin.least_load import LeastLoad
from policies.placement import Placement, placement_of

__all__ = ["Explanation", "Routed", "Router"]

logger = logging.getLogger(__name__)
_NO_HIT = PrefixHit()


# built per request (the views: per worker per request)
_route_request = fast_constructor(RouteRequest)
_view = fast_constructor(WorkerView)
_outcome = fast_constructor(Outcome)


@dataclass(frozen=True, slots=True)
class Explanation:
    """``/admin/route``'s answer: the decision and the snapshot it was made on."""

    request: RouteRequest
    decision: Decision
    views: tuple[WorkerView, ...]


class Router:
    """Builds the policy's input, calls it, and records the decision.

    Args:
        fleet: the worker registry.
        load: in-flight accounting (read for the snapshot).
        policy: the configured policy.
        analyzer: tokenizer + hasher, required when the policy needs tokens or block hashes.
        kv_index: the prefix index, used when the policy needs prefix hits (and fed what was routed).
        block_size: tokens per block, to turn hit blocks into predicted cached tokens.
        metrics: stage timings.
        clock: monotonic clock for stage timings.
        feedback: joins predicted prefix hits with the cached tokens workers report.
        upstream_queue: requests waiting in the gateway for an upstream connection to a worker (by URL),
            added to the worker's reported queue depth.
        decisions: where the last decisions are kept for the admin page (a new ``DecisionLog`` if None).
        units: each worker's tokens per the gateway's, and the closed loop on its assumed cache (the KV
            service); None: the gateway's tokens are taken for the engines'.
        prefill_watch: this gateway's in-flight requests still waiting for their first token (a new
            ``PrefillWatch`` if None): ``WorkerView.prefill_tokens`` once the proxy reports first tokens.
        max_blocks: a prompt's block hashes beyond this many are not looked up or recorded (0: all). Index
            lookups and predictions run on the event loop at a few µs per block; a 7 MB prompt has ~470k
            blocks, which held the loop for seconds. The token count stays whole; only the prefix that the
            cache-aware choice weighs is bounded (``--max-prefix-tokens``).
    """

    def __init__(
        self,
        *,
        fleet: Fleet,
        load: LoadBoard,
        policy: Policy,
        analyzer: PromptAnalyzer | None,
        kv_index: KVIndex | None,
        block_size: int,
        metrics: Metrics,
        clock: Callable[[], float] = time.perf_counter,
        feedback: PrefixFeedback | None = None,
        upstream_queue: Callable[[str], int] = lambda _url: 0,
        decisions: DecisionLog | None = None,
        units: TokenUnits | None = None,
        prefill_watch: PrefillWatch | None = None,
        max_blocks: int = 0,
    ) -> None:
        self._watch = prefill_watch if prefill_watch is not None else PrefillWatch()
        self.decisions = decisions if decisions is not None else DecisionLog()
        self._units = units
        self._upstream_queue = upstream_queue
        self._feedback = feedback
        self._fleet = fleet
        self._load = load
        self._policy = policy
        self._observer = policy if isinstance(policy, Observer) else None
        self._analyzer = analyzer if policy.needs & {Need.TOKENS, Need.BLOCK_HASHES} else None
        self._index = kv_index if Need.PREFIX_HITS in policy.needs else None
        self._recorder = kv_index
        self._balancer = LeastLoad(random.Random(0))
        self._block_size = block_size
        self._max_blocks = max_blocks
        self._metrics = metrics
        self._clock = clock

    def prepare(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> RouteRequest:
        """The policy's view of the request; tokenizes and hashes only when the policy needs it.

        Raises:
            InvalidRequest: the analyzer cannot render the prompt.
        """
        num_tokens = 0
        hashes: tuple[int, ...] = ()
        # a load-balanced route has no prompt; a continued response's prompt is mostly on its worker
        if self._analyzer is not None and parsed.endpoint is not None and parsed.previous_response_id is None:
            start = self._clock()
            try:
                analysis = self._analyzer.analyze(
                    parsed.body, parsed.endpoint, parsed.model, tenant=headers.get(TENANT_HEADER)
                )
            except ValueError as exc:
                raise InvalidRequest(str(exc), param="messages") from None
            self._metrics.stage("analyze", self._clock() - start)
            num_tokens, hashes = analysis.num_tokens, analysis.block_hashes
            if 0 < self._max_blocks < len(hashes):
                hashes = hashes[: self._max_blocks]
        session = headers.get("x-session-id") or parsed.session_id
        return _route_request(
            model=parsed.model,
            num_prompt_tokens=num_tokens,
            block_hashes=hashes,
            session_id=session,
            headers=headers,
            max_tokens=parsed.max_tokens,
        )

    def snapshot(self, req: RouteRequest, exclude: Collection[str] = ()) -> tuple[WorkerView, ...]:
        """Views of the workers serving ``req.model``, minus ``exclude``.

        Raises:
            ModelNotFound: no worker serves the model.
            NoHealthyWorker: the model's workers are all excluded or none reported its models yet.
        """
        records = [r for r in self._fleet.serving(req.model or None) if r.id not in exclude]
        if not records:
            if self._fleet.knows_model(req.model) or not any(r.models for r in self._fleet):
                raise NoHealthyWorker(f"no healthy worker serves model {req.model!r}; retry later")
            raise ModelNotFound(f"the model {req.model!r} does not exist on any worker", param="model")
        # a worker whose engine cannot reuse a prefix (``EngineFacts.no_affinity_reason``) gets no hits: the
        # policy places its requests by load alone (a quiet KV-event feed is the index's business:
        # ``gateway.kvindex.hybrid`` answers that worker from routing, or not at all)
        hits = self._lookup(req, [r.id for r in records if r.facts.no_affinity_reason is None])
        # one view per worker per request (a 64-worker fleet builds 64): an index loop, positional arguments
        # in ``WorkerView``'s field order (an interpreted builder binds keywords at ~2x the cost of positions;
        # ``test_every_view_field_carries_its_own_figure`` checks the order) and no lookups without hits
        upstream_queue = self._upstream_queue
        watch = self._watch
        reporting = watch.reporting
        loads = self._load.loads([r.id for r in records])
        views = []
        for i in range(len(records)):
            r, load = records[i], loads[i]
            hit = hits.get(r.id, _NO_HIT) if hits else _NO_HIT
            inflight_tokens = load.inflight_tokens
            views.append(
                _view(
                    WorkerId(r.id), r.role, r.available, load.inflight_requests, inflight_tokens,
                    r.waiting_now + upstream_queue(r.url), r.kv_usage, hit.gpu_blocks, hit.tier_blocks,
                    load.recent_tokens, load.recent_requests, load.recent_cached_tokens, load.recent_streams,
                    load.recent_follow_ups,
                    watch.prefill_tokens(r.id, inflight_tokens) if reporting else None,
                )
            )  # fmt: skip
        return tuple(views)

    def _lookup(self, req: RouteRequest, worker_ids: list[str]) -> Mapping[str, PrefixHit]:
        if self._index is None or not req.block_hashes:
            return {}
        start = self._clock()
        hits = self._index.longest_prefix(req.block_hashes, worker_ids)
        self._metrics.stage("lookup", self._clock() - start)
        return hits

    def _select(self, req: RouteRequest, views: tuple[WorkerView, ...]) -> Decision:
        start = self._clock()
        decision = self._policy.select(req, views)
        self._metrics.stage("policy", self._clock() - start)
        return decision

    def route(self, req: RouteRequest, exclude: Collection[str] = (), *, balanced: bool = False) -> Routed:
        """Choose a worker for ``req`` and record the choice.

        ``balanced``: place it by load alone (the least loaded serving worker), whatever the policy: for
        routes with no prompt to hash (embeddings, pass-through); the policy's observer is not told.

        Raises:
            ModelNotFound: no worker serves the model.
            NoHealthyWorker: no eligible worker is available.
        """
        views = self.snapshot(req, exclude)
        decision = self._balancer.select(req, views) if balanced else self._select(req, views)
        record = self._fleet.get(decision.worker) if decision.worker is not None else None
        chosen = next((v for v in views if v.id == decision.worker), None) if record is not None else None
        if record is None or chosen is None or not chosen.healthy:
            raise NoHealthyWorker(f"no healthy worker can serve model {req.model!r} now; retry later")
        record.routed_total += 1
        if balanced:
            self._load.add_routed(record.id, req.max_tokens or 0)
            self.decisions.add(req, decision, views, None)
            return Routed(request=req, decision=decision, record=record, prefix_hit_tokens=0, balanced=True)
        if self._observer is not None:
            self._observer.on_routed(req, decision)
        if self._recorder is not None and req.block_hashes and record.facts.no_affinity_reason is None:
            self._recorder.record_routed(record.id, req.block_hashes)
        # Load is counted in the gateway's tokens (every load figure is), the prediction in the engine's (it
        # is compared with the engine's usage): with the byte tokenizer the two differ several-fold, and a
        # hit counted in engine tokens against a prompt in bytes made a warm worker look as loaded as a cold
        # one, so the policy balanced hits away.
        hit = self._hit_tokens(req, chosen.gpu_hit_blocks)
        placement = self._placement(req, views, record.id)
        self._load.add_routed(record.id, req.num_prompt_tokens + (req.max_tokens or 0), hit, placement)
        # in the chosen worker's tokens, as the prediction it is compared with (``kvgate_prefix_*_tokens``)
        best_blocks = max(v.gpu_hit_blocks for v in views) if req.block_hashes else 0  # no hashes: no hits
        best_tokens = self._cached_tokens(req, best_blocks, record)
        prefill = self._fleet.get(decision.prefill_worker) if decision.prefill_worker is not None else None
        if prefill is not None and (not prefill.available or prefill.id == record.id):
            prefill = None  # PD degrades to decode-only, never fails the request
        if prefill is not None:
            hit_blocks = next((v.gpu_hit_blocks for v in views if v.id == prefill.id), 0)
            how = self._placement(req, views, prefill.id)  # the prefill worker holds the prompt's KV next
            self._load.add_routed(prefill.id, req.num_prompt_tokens, self._hit_tokens(req, hit_blocks), how)
        self.decisions.add(req, decision, views, prefill.id if prefill is not None else None)
        # what the proxy holds on the worker (``gateway.proxy.forward``): uncached prompt + completion budget
        uncached = req.num_prompt_tokens - hit
        ticket = self._watch.open(record.id, uncached, uncached + (req.max_tokens or 0))
        return Routed(
            request=req, decision=decision, record=record,
            prefix_hit_tokens=self._predicted(req, hit, record), prefill=prefill,
            best_hit_tokens=best_tokens, ticket=ticket, uncached_tokens=uncached,
        )  # fmt: skip

    def route_to(self, req: RouteRequest, record: WorkerRecord, reason: str) -> Routed:
        """Send ``req`` to ``record`` (it holds state the request needs: a stored response) and record it.

        The policy is not asked and its observer is not told; a draining worker still takes it (it still
        holds the state).

        Raises:
            NoHealthyWorker: the worker is unhealthy or its breaker is open.
        """
        if not (record.healthy and record.breaker.allows()):
            raise NoHealthyWorker(f"worker {record.id!r}, which holds this request's state, is unavailable; "
                                  "retry later")  # fmt: skip
        record.routed_total += 1
        decision = Decision(worker=WorkerId(record.id), reason=reason)
        self._load.add_routed(record.id, req.num_prompt_tokens + (req.max_tokens or 0))
        self.decisions.add(req, decision, (), None)
        return Routed(request=req, decision=decision, record=record, prefix_hit_tokens=0, balanced=True)

    @staticmethod
    def _placement(req: RouteRequest, views: Sequence[WorkerView], worker: str) -> Placement:
        """What sending ``req`` to ``worker`` does to its sticky traffic; nothing is known without blocks."""
        if not req.block_hashes:
            return Placement.OTHER
        return placement_of([v for v in views if v.healthy], WorkerId(worker))

    def _hit_tokens(self, req: RouteRequest, hit_blocks: int) -> int:
        """Prompt tokens covered by ``hit_blocks`` leading cached blocks, in the gateway's tokens."""
        return min(hit_blocks * self._block_size, req.num_prompt_tokens) if hit_blocks > 0 else 0

    def _cached_tokens(self, req: RouteRequest, hit_blocks: int, record: WorkerRecord | None = None) -> int:
        """Prompt tokens covered by ``hit_blocks`` leading cached blocks (at most the whole prompt).

        On a foreign engine, what it will report: counted in its tokens (the gateway's tokens converted
        where they are not the engine's, e.g. bytes), in whole engine blocks where its block size is known,
        and never the prompt's last token (vLLM, SGLang and TensorRT-LLM always compute at least one token,
        so a fully cached, block-aligned prompt reports one block less).
        """
        return self._predicted(req, self._hit_tokens(req, hit_blocks), record)

    def _predicted(self, req: RouteRequest, tokens: int, record: WorkerRecord | None) -> int:
        """``tokens`` predicted cached (the gateway's) as ``record``'s engine will report them
        (``_cached_tokens``)."""
        if tokens <= 0:
            return 0  # in any unit
        if record is None or record.facts.kind in (EngineKind.KVGATE, EngineKind.AUTO):
            return tokens
        prompt = req.num_prompt_tokens
        if self._units is not None:
            tokens = self._units.engine_tokens(record.id, tokens)
            prompt = self._units.engine_tokens(record.id, prompt)
        engine_block = record.facts.block_size
        if not engine_block:
            return tokens
        tokens = min(tokens, prompt - 1)
        return max(0, tokens // engine_block * engine_block)

    def explain(self, req: RouteRequest) -> Explanation:
        """The decision the policy would make now, with the snapshot; nothing is recorded."""
        views = self.snapshot(req)
        return Explanation(request=req, decision=self._select(req, views), views=views)

    def finished(
        self,
        routed: Routed,
        *,
        ok: bool,
        cached_tokens: int | None,
        latency_s: float,
        prompt_tokens: int | None = None,
    ) -> None:
        """Tell an observing policy how a routed request ended, and join prediction with reality
        (``prompt_tokens`` and ``cached_tokens``: the engine's usage, None where it reported none)."""
        req = routed.request
        if routed.ticket is not None:
            self._watch.close(routed.ticket)
        if routed.balanced:
            return
        if ok and req.block_hashes and routed.prefill is None:
            if self._feedback is not None:
                self._feedback.record(routed.prefix_hit_tokens, routed.best_hit_tokens, cached_tokens)
            if self._units is not None:
                self._units.observe_finished(
                    routed.record.id, gateway_prompt_tokens=req.num_prompt_tokens,
                    engine_prompt_tokens=prompt_tokens, predicted_tokens=routed.prefix_hit_tokens,
                    reported_tokens=cached_tokens, tolerance_tokens=routed.record.facts.block_size or 16,
                )  # fmt: skip
        if self._observer is not None:
            self._observer.on_finished(
                _outcome(
                    routed.decision, routed.request, ok=ok, cached_tokens=cached_tokens, latency_s=latency_s
                )
            )

    def first_token(self, routed: Routed) -> None:
        """The worker sent ``routed``'s first token: its prefill is no longer ahead of other requests there
        (the proxy calls this on a stream's first chunk; a whole answer ends in ``finished``)."""
        if routed.ticket is not None:
            self._watch.first_token(routed.ticket)

    @property
    def feedback(self) -> PrefixFeedback | None:
        """The closed loop on prefix-hit predictions (its ``drift`` flag), when the KV index is used."""
        return self._feedback

    @property
    def wants_outcomes(self) -> bool:
        return self._observer is not None or self._feedback is not None
