"""The offline routing replay: real policies over simulated caches, sessions in order, replicas."""

from __future__ import annotations

import pytest

from loadtest.route_sim import SimFleet, SimResult, mean_row, poisson_arrivals, replay, spread_ties, window
from loadtest.workloads import Session, WorkloadSpec, multi_turn

FLEET = SimFleet(workers=4, capacity_tokens=8192)
SESSIONS = multi_turn(WorkloadSpec(num_sessions=12, turns=4, system_words=60, question_words=20))
ARRIVALS = poisson_arrivals(len(SESSIONS), rate=4.0)


def _run(policy: str, replicas: int = 1) -> SimResult:
    return replay(SESSIONS, ARRIVALS, {"type": policy}, fleet=FLEET, replicas=replicas)


def test_every_request_is_replayed_once_and_accounted() -> None:
    r = _run("round_robin")
    assert r.requests == len(SESSIONS) * 4 == len(r.ttfts)
    assert sum(r.per_worker) == r.prompt_tokens
    assert sum(r.prefill_per_worker) == r.prompt_tokens - r.hit_tokens
    assert 0 < r.hit_rate <= r.ideal_hit_rate + 1e-9  # this fleet's caches hold the working set
    assert r.imbalance >= 1.0


def test_round_robin_rotates_over_the_fleet() -> None:
    r = _run("round_robin")
    assert max(r.per_worker) / min(r.per_worker) < 1.6  # every worker serves a share


def test_prefix_aware_routing_follows_the_sessions() -> None:
    rr, pca = _run("round_robin"), _run("prefix_cache_aware")
    assert pca.hit_rate > rr.hit_rate + 0.15
    assert pca.hit_rate == pytest.approx(pca.ideal_hit_rate, abs=0.05)
    assert pca.ttft_p(0.5) < rr.ttft_p(0.5)


def test_replicas_on_shared_state_route_as_one_gateway() -> None:
    one, four = _run("prefix_cache_aware"), _run("prefix_cache_aware", replicas=4)
    assert four.hit_rate == pytest.approx(one.hit_rate, abs=0.02)


def test_max_requests_bounds_the_replay() -> None:
    r = replay(SESSIONS, ARRIVALS, {"type": "least_load"}, fleet=FLEET, max_requests=10)
    assert r.requests == 10


def test_replicas_see_each_others_routing_a_sync_interval_late() -> None:
    """A burst split over replicas: with a sync lag each replica misses the others' picks, and herds."""
    burst = multi_turn(WorkloadSpec(num_sessions=16, turns=1, system_words=60, question_words=20))
    fleet = SimFleet(workers=8, capacity_tokens=8192)

    def mean_ttft(lag: float) -> float:
        r = replay(burst, [0.0] * 16, {"type": "prefix_cache_aware"}, fleet=fleet, replicas=4, sync_lag_s=lag)
        return sum(r.ttfts) / len(r.ttfts)

    assert mean_ttft(0.05) > 1.2 * mean_ttft(0.0)


def test_window_takes_a_stretch_and_rebases_its_arrivals() -> None:
    timed = [Session(f"s{i}", (), arrival_s=10.0 + i) for i in range(6)]
    part, arrivals = window(timed, 2, 3)
    assert [s.id for s in part] == ["s2", "s3", "s4"]
    assert arrivals == [0.0, 1.0, 2.0]
    assert window(timed, 5, 3)[0] == timed[5:]
    assert window(timed, 9, 3) == ([], [])


def test_mean_row_averages_seeds_and_keeps_the_worst_imbalance() -> None:
    a = SimResult(per_worker=[100, 100], prefill_per_worker=[50, 50], prompt_tokens=200, hit_tokens=100)
    b = SimResult(per_worker=[150, 50], prefill_per_worker=[75, 25], prompt_tokens=200, hit_tokens=50)
    for r in (a, b):
        r.ideal_hit_rate = 0.5
        r.ttfts.extend([0.01, 0.03])
    b.ttfts.append(0.5)  # one slow request in one seed
    hit, p50, p99, imbalance, prefill_imb, worst, pooled = mean_row([a, b])
    assert hit == pytest.approx((1.0 + 0.5) / 2)
    assert imbalance == pytest.approx((1.0 + 1.5) / 2) and worst == pytest.approx(1.5)
    assert prefill_imb == pytest.approx((1.0 + 1.5) / 2)
    assert p50 == pytest.approx((a.ttft_p(0.5) + b.ttft_p(0.5)) * 1e3 / 2)
    assert p99 == pytest.approx((30.0 + 500.0) / 2)  # the mean of each seed's p99
    assert pooled == pytest.approx(500.0)  # the p99 of the five requests together


def test_spread_ties_spaces_out_only_equal_arrivals_in_order() -> None:
    assert spread_ties([0.0, 0.0, 0.0, 1.0, 2.0, 2.0], 0.001) == pytest.approx(
        [0.0, 0.001, 0.002, 1.0, 2.0, 2.001]
    )
    assert spread_ties([], 0.001) == []


def test_an_event_less_fleet_is_routed_on_placement_guessed_from_routing() -> None:
    """Word-token workers, byte-block hashes: the approximate index learns placement and still follows
    the sessions (hits counted in the workers' words)."""
    fleet = SimFleet(workers=4, capacity_tokens=2048, foreign=True, gateway_block_size=64)
    rr = replay(SESSIONS, ARRIVALS, {"type": "round_robin"}, fleet=fleet)
    pca = replay(SESSIONS, ARRIVALS, {"type": "prefix_cache_aware"}, fleet=fleet)
    assert pca.prompt_tokens == rr.prompt_tokens < sum(len(str(r.body)) for s in SESSIONS for r in s.requests)
    assert pca.hit_rate > rr.hit_rate + 0.15
    assert pca.hit_rate == pytest.approx(pca.ideal_hit_rate, abs=0.05)


def test_first_tokens_tell_queued_prefill_from_decoding() -> None:
    """A loaded fleet: with the first tokens seen, the policy waits less behind queued prefill."""
    loaded = SimFleet(workers=4, capacity_tokens=8192, prefill_tps=2_000.0)
    burst = multi_turn(WorkloadSpec(num_sessions=24, turns=2, system_words=120, question_words=20))
    arrivals = poisson_arrivals(len(burst), rate=12.0)

    def mean_ttft(first_token: bool) -> float:
        r = replay(burst, arrivals, {"type": "prefix_cache_aware"}, fleet=loaded, first_token=first_token)
        assert r.prefill_utilisation > 0.3
        return sum(r.ttfts) / len(r.ttfts)

    assert mean_ttft(True) <= mean_ttft(False)
