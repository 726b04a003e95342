"""The routing seam with fakes: what is computed per ``needs``, observers, index recording, errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from gateway.analyze.analyzer import PromptAnalysis, PromptAnalyzer
from gateway.errors import InvalidRequest, ModelNotFound, NoHealthyWorker
from gateway.fleet.health import apply_load
from gateway.fleet.registry import Fleet
from gateway.kvindex.index import PrefixHit
from gateway.observability.metrics import Metrics
from gateway.openai.schema import parse_request
from gateway.routing.hold import Hold
from gateway.routing.router import Router
from gateway.settings import BreakerSettings, WorkerSpec
from gateway.state.memory import MemoryLoadBoard
from kvgate_core.kvcontract.events import KVEvent
from kvgate_core.tokenize.request_prompt import Endpoint
from policies.api import Decision, Need, Outcome, RouteRequest, WorkerId, WorkerView
from policies.placement import Placement

BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":7,"user":"u1"}'


@dataclass
class FakePolicy:
    """Picks the healthy worker with the most GPU hit blocks (ties: first); records what it saw."""

    needs: frozenset[Need] = frozenset()
    name: str = "fake"
    seen: list[tuple[RouteRequest, tuple[WorkerView, ...]]] = field(default_factory=list)

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        self.seen.append((req, tuple(workers)))
        healthy = [w for w in workers if w.healthy]
        if not healthy:
            return Decision(worker=None)
        best = max(healthy, key=lambda w: w.gpu_hit_blocks)
        return Decision(worker=best.id, scores={w.id: 0.5 for w in workers})


@dataclass
class ObservingPolicy(FakePolicy):
    routed: list[Decision] = field(default_factory=list)
    finished: list[Outcome] = field(default_factory=list)

    def on_routed(self, req: RouteRequest, decision: Decision) -> None:
        self.routed.append(decision)

    def on_finished(self, outcome: Outcome) -> None:
        self.finished.append(outcome)


@dataclass
class FakeAnalyzer:
    calls: int = 0
    fail: bool = False

    def analyze(
        self, body: Mapping[str, Any], endpoint: Endpoint, model: str, tenant: str | None = None
    ) -> PromptAnalysis:
        self.calls += 1
        if self.fail:
            raise ValueError("cannot render these messages")
        return PromptAnalysis(num_tokens=40, block_hashes=(11, 22))


@dataclass
class FakeIndex:
    hits: dict[str, PrefixHit] = field(default_factory=dict)
    lookups: int = 0
    recorded: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    def apply(self, event: KVEvent) -> None: ...

    def record_routed(self, worker: str, hashes: Sequence[int]) -> None:
        self.recorded.append((worker, tuple(hashes)))

    def longest_prefix(self, hashes: Sequence[int], workers: Iterable[str]) -> Mapping[str, PrefixHit]:
        self.lookups += 1
        return {w: self.hits.get(w, PrefixHit()) for w in workers}

    def remove_worker(self, worker: str) -> None: ...

    def num_blocks(self) -> int:
        return 0

    def worker_blocks(self) -> Mapping[str, int]:
        return {}


def _fleet(*models: str) -> Fleet:
    fleet = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0)
    for i, model in enumerate(models):
        record = fleet.add(WorkerSpec(id=f"w{i}", url=f"http://w{i}"))
        record.healthy = True
        record.models = frozenset({model})
    return fleet


def _router(policy: FakePolicy, fleet: Fleet, analyzer: FakeAnalyzer, index: FakeIndex) -> Router:
    return Router(fleet=fleet, load=MemoryLoadBoard(), policy=policy, analyzer=cast(PromptAnalyzer, analyzer), kv_index=index,
                  block_size=16, metrics=Metrics())  # fmt: skip


def _parsed() -> Any:
    return parse_request(BODY, Endpoint.CHAT, max_tokens_limit=1000)


def test_policy_without_needs_skips_tokenizing_and_lookup() -> None:
    analyzer, index, policy = FakeAnalyzer(), FakeIndex(), FakePolicy()
    router = _router(policy, _fleet("m", "m"), analyzer, index)
    routed = router.route(router.prepare(_parsed(), {}))
    assert (analyzer.calls, index.lookups) == (0, 0)
    assert routed.request.num_prompt_tokens == 0 and routed.request.block_hashes == ()
    assert routed.request.session_id == "u1" and routed.request.max_tokens == 7
    assert index.recorded == []


def test_prefix_needs_feed_hits_to_the_policy_and_record_the_choice() -> None:
    analyzer, index = FakeAnalyzer(), FakeIndex(hits={"w1": PrefixHit(gpu_blocks=2, tier_blocks=1)})
    policy = FakePolicy(needs=frozenset({Need.BLOCK_HASHES, Need.PREFIX_HITS}))
    router = _router(policy, _fleet("m", "m"), analyzer, index)
    routed = router.route(router.prepare(_parsed(), {"x-session-id": "s9"}))
    _, views = policy.seen[-1]
    assert routed.record.id == "w1"
    assert routed.prefix_hit_tokens == 32
    assert routed.request.session_id == "s9"
    assert {v.id: (v.gpu_hit_blocks, v.tier_hit_blocks) for v in views} == {"w0": (0, 0), "w1": (2, 1)}
    assert index.recorded == [("w1", (11, 22))]


def test_routed_work_is_counted_per_worker_and_shown_to_the_policy() -> None:
    analyzer, index = FakeAnalyzer(), FakeIndex(hits={"w1": PrefixHit(gpu_blocks=2)})
    policy = FakePolicy(needs=frozenset({Need.BLOCK_HASHES, Need.PREFIX_HITS}))
    router = _router(policy, _fleet("m", "m"), analyzer, index)
    router.route(router.prepare(_parsed(), {}))  # 40 prompt tokens (32 predicted cached on w1) + max_tokens 7
    router.route(router.prepare(_parsed(), {}))
    _, views = policy.seen[-1]
    recent = {
        v.id: (round(v.recent_tokens), round(v.recent_requests), round(v.recent_cached_tokens)) for v in views
    }
    assert recent == {"w0": (0, 0, 0), "w1": (47, 1, 32)}  # the first request, seen by the second
    explained = router.explain(router.prepare(_parsed(), {}))
    w1 = next(v for v in explained.views if v.id == "w1")
    assert (round(w1.recent_tokens), round(w1.recent_cached_tokens)) == (94, 64)  # explain adds nothing
    again = router.explain(router.prepare(_parsed(), {}))
    assert round(next(v.recent_tokens for v in again.views if v.id == "w1")) == 94


def test_routing_counts_new_streams_and_follow_ups_per_worker() -> None:
    index = FakeIndex()
    policy = FakePolicy(needs=frozenset({Need.BLOCK_HASHES, Need.PREFIX_HITS}))
    router = _router(policy, _fleet("m", "m"), FakeAnalyzer(), index)
    router.route(router.prepare(_parsed(), {}))  # nobody holds the prompt: a new stream on w0
    index.hits = {"w0": PrefixHit(gpu_blocks=2)}
    router.route(router.prepare(_parsed(), {}))  # w0 holds it: a follow-up
    views = router.explain(router.prepare(_parsed(), {})).views
    counts = {v.id: (round(v.recent_streams, 2), round(v.recent_follow_ups, 2)) for v in views}
    assert counts == {"w0": (1.0, 1.0), "w1": (0.0, 0.0)}


def test_a_request_without_blocks_is_neither_a_stream_nor_a_follow_up() -> None:
    router = _router(FakePolicy(), _fleet("m", "m"), FakeAnalyzer(), FakeIndex())  # no needs: no blocks
    router.route(router.prepare(_parsed(), {}))
    load = router.explain(router.prepare(_parsed(), {})).views[0]
    assert load.recent_requests > 0 and (load.recent_streams, load.recent_follow_ups) == (0.0, 0.0)


@dataclass
class SplitPolicy(FakePolicy):
    """Prefills on w0, decodes on w1."""

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        return Decision(worker=WorkerId("w1"), prefill_worker=WorkerId("w0"))


def test_a_pd_prefill_worker_counts_its_own_new_stream() -> None:
    router = _router(
        SplitPolicy(needs=frozenset({Need.BLOCK_HASHES})), _fleet("m", "m"), FakeAnalyzer(), FakeIndex()
    )
    router.route(router.prepare(_parsed(), {}))  # nobody holds the prompt: both workers now do
    views = router.explain(router.prepare(_parsed(), {})).views
    assert {v.id: round(v.recent_streams, 2) for v in views} == {"w0": 1.0, "w1": 1.0}


def test_a_pd_prefill_worker_counts_the_prompt_with_its_own_predicted_hit() -> None:
    analyzer, index = FakeAnalyzer(), FakeIndex(hits={"w0": PrefixHit(gpu_blocks=1)})
    policy = SplitPolicy(needs=frozenset({Need.BLOCK_HASHES, Need.PREFIX_HITS}))
    router = _router(policy, _fleet("m", "m"), analyzer, index)
    routed = router.route(router.prepare(_parsed(), {}))
    assert routed.prefill is not None and routed.prefill.id == "w0"
    views = router.explain(router.prepare(_parsed(), {})).views
    # w0: the 40 prompt tokens, 16 of them predicted cached there, no decode; w1: the prompt + max_tokens 7
    assert {v.id: (round(v.recent_tokens), round(v.recent_cached_tokens)) for v in views} == {
        "w0": (40, 16),
        "w1": (47, 0),
    }


def test_a_stale_queue_probe_stops_counting_requests_seen_finishing_since() -> None:
    fleet = _fleet("m")
    record = fleet.get("w0")
    assert record is not None
    apply_load(record, {"waiting": 2, "running": 1})  # the probe caught two requests waiting
    policy = FakePolicy()
    router = _router(policy, fleet, FakeAnalyzer(), FakeIndex())
    routed = router.route(router.prepare(_parsed(), {}))
    assert policy.seen[-1][1][0].queue_depth == 2
    board = MemoryLoadBoard()
    Hold(board, routed.record, 10).end(answered=True)
    Hold(board, routed.record, 10).end(answered=False)  # a failed attempt says nothing about the queue
    router.route(router.prepare(_parsed(), {}))
    assert policy.seen[-1][1][0].queue_depth == 1  # one completion: the queue moved by one
    for _ in range(3):
        Hold(board, routed.record, 10).end(answered=True)
    router.route(router.prepare(_parsed(), {}))
    assert policy.seen[-1][1][0].queue_depth == 0
    apply_load(record, {"waiting": 3})  # a fresh probe is taken as it is
    router.route(router.prepare(_parsed(), {}))
    assert policy.seen[-1][1][0].queue_depth == 3 and record.queue_depth == 3


def test_tokens_need_without_prefix_need_skips_lookup() -> None:
    analyzer, index = FakeAnalyzer(), FakeIndex()
    router = _router(FakePolicy(needs=frozenset({Need.TOKENS})), _fleet("m"), analyzer, index)
    req = router.prepare(_parsed(), {})
    router.route(req)
    assert (analyzer.calls, index.lookups, req.num_prompt_tokens) == (1, 0, 40)


def test_analyzer_value_error_is_a_400() -> None:
    router = _router(
        FakePolicy(needs=frozenset({Need.TOKENS})), _fleet("m"), FakeAnalyzer(fail=True), FakeIndex()
    )
    with pytest.raises(InvalidRequest, match="cannot render"):
        router.prepare(_parsed(), {})


def test_observer_hooks_are_called() -> None:
    policy = ObservingPolicy()
    router = _router(policy, _fleet("m"), FakeAnalyzer(), FakeIndex())
    routed = router.route(router.prepare(_parsed(), {}))
    router.finished(routed, ok=True, cached_tokens=16, latency_s=0.1)
    assert policy.routed == [routed.decision]
    assert policy.finished[0].cached_tokens == 16 and policy.finished[0].ok
    assert (
        router.wants_outcomes
        and not _router(FakePolicy(), _fleet("m"), FakeAnalyzer(), FakeIndex()).wants_outcomes
    )


def test_explain_records_nothing() -> None:
    policy, index = ObservingPolicy(needs=frozenset({Need.BLOCK_HASHES})), FakeIndex()
    router = _router(policy, _fleet("m", "m"), FakeAnalyzer(), index)
    explanation = router.explain(router.prepare(_parsed(), {}))
    assert explanation.decision.worker == WorkerId("w0")
    assert [v.id for v in explanation.views] == ["w0", "w1"]
    assert policy.routed == [] and index.recorded == []


def test_model_routing_and_errors() -> None:
    fleet = _fleet("a", "m")
    router = _router(FakePolicy(), fleet, FakeAnalyzer(), FakeIndex())
    req = router.prepare(_parsed(), {})
    assert router.route(req).record.id == "w1"
    with pytest.raises(NoHealthyWorker):
        router.route(req, exclude=["w1"])
    with pytest.raises(ModelNotFound):
        router.route(RouteRequest(model="zzz"))
    for record in fleet:
        record.healthy = False
    with pytest.raises(NoHealthyWorker):
        router.route(req)


def test_unknown_model_before_any_probe_is_503_not_404() -> None:
    fleet = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0)
    fleet.add(WorkerSpec(id="w0", url="http://w0"))
    router = _router(FakePolicy(), fleet, FakeAnalyzer(), FakeIndex())
    with pytest.raises(NoHealthyWorker):
        router.route(RouteRequest(model="m"))


def test_a_worker_whose_engine_cannot_reuse_a_prefix_gets_no_hits_and_no_recorded_placement() -> None:
    fleet = _fleet("m", "m")
    mii = fleet.get("w0")
    assert mii is not None
    mii.facts.no_affinity_reason = "DeepSpeed-MII keeps no prefix cache"
    policy = FakePolicy(needs=frozenset({Need.BLOCK_HASHES, Need.PREFIX_HITS}))
    index = FakeIndex(hits={"w0": PrefixHit(gpu_blocks=2), "w1": PrefixHit(gpu_blocks=1)})
    router = _router(policy, fleet, FakeAnalyzer(), index)
    routed = router.route(router.prepare(_parsed(), {}))
    views = {v.id: v for v in policy.seen[-1][1]}
    assert views[WorkerId("w0")].gpu_hit_blocks == 0
    assert routed.record.id == "w1"
    mii.facts.no_affinity_reason = None
    policy.seen.clear()
    routed = router.route(router.prepare(_parsed(), {}))
    assert routed.record.id == "w0"
    assert ("w0", (11, 22)) in index.recorded and ("w1", (11, 22)) in index.recorded


@pytest.mark.parametrize(
    ("kind", "engine_block", "hit_blocks", "prompt", "expected"),
    [
        ("kvgate", None, 3, 40, 40),  # our own workers: the whole (capped) hit
        ("vllm", None, 2, 40, 32),  # engine block unknown: the gateway's blocks
        ("vllm", 32, 2, 40, 32),  # whole engine blocks only
        ("vllm", 32, 1, 40, 0),  # half an engine block is nothing to the engine
        ("vllm", 32, 4, 64, 32),  # fully cached and block-aligned: the last token is computed again
        ("sglang", 1, 4, 64, 63),
    ],
)
def test_a_foreign_engines_predicted_hit_is_what_it_will_report(
    kind: str, engine_block: int | None, hit_blocks: int, prompt: int, expected: int
) -> None:
    from gateway.engines.profiles import EngineKind

    fleet = _fleet("m")
    record = fleet.get("w0")
    assert record is not None
    record.facts.kind, record.facts.block_size = EngineKind(kind), engine_block
    router = _router(FakePolicy(), fleet, FakeAnalyzer(), FakeIndex())
    req = RouteRequest(model="m", num_prompt_tokens=prompt, block_hashes=tuple(range(hit_blocks)))
    assert router._cached_tokens(req, hit_blocks, record) == expected


@dataclass
class FixedUnits:
    """``TokenUnits`` with a fixed ratio of gateway tokens (bytes) per engine token; records outcomes."""

    ratio: float
    seen: list[dict[str, Any]] = field(default_factory=list)

    def engine_tokens(self, worker: str, gateway_tokens: int, /) -> int:
        return int(gateway_tokens / self.ratio)

    def observe_finished(self, worker: str, /, **outcome: Any) -> None:
        self.seen.append({"worker": worker, **outcome})


def test_with_bytes_for_tokens_the_prediction_is_counted_in_the_engines_tokens() -> None:
    from gateway.engines.profiles import EngineKind

    fleet = _fleet("m")
    record = fleet.get("w0")
    assert record is not None
    record.facts.kind, record.facts.block_size = EngineKind.VLLM, 16
    units = FixedUnits(ratio=4.0)
    router = Router(fleet=fleet, load=MemoryLoadBoard(), policy=FakePolicy(needs=frozenset(Need)),
                    analyzer=cast(PromptAnalyzer, FakeAnalyzer()), kv_index=FakeIndex(), block_size=64,
                    metrics=Metrics(), units=units)  # fmt: skip
    # 10 of the gateway's 64-byte blocks on a 1,000-byte prompt: 640 bytes, 160 engine tokens, 10 blocks
    req = RouteRequest(model="m", num_prompt_tokens=1_000, block_hashes=tuple(range(12)))
    assert router._cached_tokens(req, 10, record) == 160
    assert router._cached_tokens(req, 16, record) == 240  # the whole prompt: 250 tokens, its last not cached
    routed = router.route(router.prepare(_parsed(), {}))
    router.finished(routed, ok=True, cached_tokens=0, latency_s=0.1, prompt_tokens=11)
    assert units.seen == [
        {"worker": "w0", "gateway_prompt_tokens": 40, "engine_prompt_tokens": 11, "predicted_tokens": 0,
         "reported_tokens": 0, "tolerance_tokens": 16},
    ]  # fmt: skip


def test_the_best_prediction_is_counted_in_the_same_tokens_as_the_prediction() -> None:
    from gateway.engines.profiles import EngineKind

    fleet = _fleet("m", "m")
    for record in fleet:
        record.facts.kind, record.facts.block_size = EngineKind.VLLM, 4
    index = FakeIndex(hits={"w0": PrefixHit(gpu_blocks=1), "w1": PrefixHit(gpu_blocks=2)})
    router = Router(fleet=fleet, load=MemoryLoadBoard(), policy=FakePolicy(needs=frozenset(Need)),
                    analyzer=cast(PromptAnalyzer, FakeAnalyzer()), kv_index=index, block_size=16,
                    metrics=Metrics(), units=FixedUnits(ratio=4.0))  # fmt: skip
    routed = router.route(router.prepare(_parsed(), {}))  # 40 bytes of prompt, 16-byte blocks
    assert routed.record.id == "w1"
    # 2 blocks = 32 bytes = 8 engine tokens (of 10), in whole 4-token engine blocks: the same for both
    assert routed.prefix_hit_tokens == routed.best_hit_tokens == 8


def test_with_bytes_for_tokens_the_load_a_hit_spares_is_counted_in_the_gateways_tokens() -> None:
    """The prediction is in the engine's tokens, the load in the gateway's: a warm worker's request brings its
    uncached bytes, not its prompt's bytes less a hit in engine tokens (which made warm look cold)."""
    from gateway.engines.profiles import EngineKind

    fleet = _fleet("m")
    record = fleet.get("w0")
    assert record is not None
    record.facts.kind, record.facts.block_size = EngineKind.VLLM, 4
    load = MemoryLoadBoard()
    index = FakeIndex(hits={"w0": PrefixHit(gpu_blocks=2)})
    router = Router(fleet=fleet, load=load, policy=FakePolicy(needs=frozenset(Need)),
                    analyzer=cast(PromptAnalyzer, FakeAnalyzer()), kv_index=index, block_size=16,
                    metrics=Metrics(), units=FixedUnits(ratio=4.0))  # fmt: skip
    routed = router.route(router.prepare(_parsed(), {}))  # 40 bytes of prompt, 2 16-byte blocks cached
    assert routed.prefix_hit_tokens == 8  # engine tokens: what its usage will report
    assert routed.uncached_tokens == 40 - 32  # bytes: the load it brings
    assert load.loads(["w0"])[0].recent_cached_tokens == pytest.approx(32, rel=1e-3)  # a decaying window
    assert routed.moved_to(record).uncached_tokens == 40  # moved by load: nothing predicted cached
    assert routed.without_prefill().uncached_tokens == 8


def test_the_policy_sees_which_in_flight_prompts_still_wait_for_their_first_token() -> None:
    policy = FakePolicy(needs=frozenset({Need.BLOCK_HASHES}))
    load = MemoryLoadBoard()
    router = Router(fleet=_fleet("m"), load=load, policy=policy, analyzer=cast(PromptAnalyzer, FakeAnalyzer()),
                    kv_index=FakeIndex(), block_size=16, metrics=Metrics())  # fmt: skip
    first = router.route(router.prepare(_parsed(), {}))  # 40 prompt tokens, none cached, + max_tokens 7
    load.acquire("w0", 47)  # what the proxy holds while it is in flight
    assert router.explain(router.prepare(_parsed(), {})).views[0].prefill_tokens is None  # nothing reported
    second = router.route(router.prepare(_parsed(), {}))
    load.acquire("w0", 47)
    router.first_token(first)
    assert router.explain(router.prepare(_parsed(), {})).views[0].prefill_tokens == 40  # the second's prompt
    load.release("w0", 47)
    router.finished(second, ok=True, cached_tokens=0, latency_s=0.1)
    assert router.explain(router.prepare(_parsed(), {})).views[0].prefill_tokens == 0


def test_every_view_field_carries_its_own_figure() -> None:
    """The snapshot builds views positionally: each field must get its own figure, none a neighbour's."""
    policy = FakePolicy(needs=frozenset({Need.BLOCK_HASHES, Need.PREFIX_HITS}))
    fleet = _fleet("m")
    record = fleet.get("w0")
    assert record is not None
    record.queue_depth, record.kv_usage = 5, 0.375
    load = MemoryLoadBoard(clock=lambda: 1_000.0)
    load.acquire("w0", 300)
    load.acquire("w0", 300)
    load.add_routed("w0", 64, cached_tokens=16, placement=Placement.NEW_STREAM)
    load.add_routed("w0", 64, placement=Placement.FOLLOW_UP)
    load.add_routed("w0", 64, placement=Placement.FOLLOW_UP)
    index = FakeIndex(hits={"w0": PrefixHit(gpu_blocks=3, tier_blocks=2)})
    router = Router(fleet=fleet, load=load, policy=policy, analyzer=cast(PromptAnalyzer, FakeAnalyzer()),
                    kv_index=index, block_size=16, metrics=Metrics(), upstream_queue=lambda url: 7)  # fmt: skip
    (view,) = router.explain(router.prepare(_parsed(), {})).views
    expected = WorkerView(
        id=WorkerId("w0"), role=record.role, healthy=True, inflight_requests=2, inflight_tokens=600,
        queue_depth=12, kv_usage=0.375, gpu_hit_blocks=3, tier_hit_blocks=2, recent_tokens=192.0,
        recent_requests=3.0, recent_cached_tokens=16.0, recent_streams=1.0, recent_follow_ups=2.0,
        prefill_tokens=None,
    )  # fmt: skip
    assert dataclasses.astuple(view) == pytest.approx(dataclasses.astuple(expected))


def test_routing_weighs_a_bounded_prefix_of_a_long_prompt() -> None:
    analyzer, index = FakeAnalyzer(), FakeIndex()
    long_prompt = PromptAnalysis(num_tokens=5000, block_hashes=tuple(range(1, 301)))
    analyzer.analyze = lambda *_a, **_k: long_prompt  # type: ignore[method-assign]
    router = Router(fleet=_fleet("m"), load=MemoryLoadBoard(), policy=FakePolicy(needs=frozenset(Need)),
                    analyzer=cast(PromptAnalyzer, analyzer), kv_index=index, block_size=16, metrics=Metrics(),
                    max_blocks=100)  # fmt: skip
    req = router.prepare(_parsed(), {})
    assert req.num_prompt_tokens == 5000  # the count stays whole
    assert req.block_hashes == tuple(range(1, 101))
    router.route(req)
    assert [len(hashes) for _, hashes in index.recorded] == [100]
