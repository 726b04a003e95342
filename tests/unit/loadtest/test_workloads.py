from __future__ import annotations

import pytest

from loadtest.workloads import WORKLOADS, WorkloadSpec, build_workload


def _prompt_text(body: dict) -> str:
    return "\n".join(m["content"] for m in body["messages"])


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workloads_are_deterministic_for_a_seed(name: str) -> None:
    spec = WorkloadSpec(num_sessions=4, turns=3, seed=7)
    assert build_workload(name, spec) == build_workload(name, spec)
    other = build_workload(name, WorkloadSpec(num_sessions=4, turns=3, seed=8))
    assert other != build_workload(name, spec)


def test_multi_turn_histories_grow_and_share_the_system_prompt() -> None:
    sessions = build_workload("multi_turn", WorkloadSpec(num_sessions=3, turns=4))
    systems = {s.requests[0].body["messages"][0]["content"] for s in sessions}
    assert len(systems) == 1
    for s in sessions:
        lengths = [len(r.body["messages"]) for r in s.requests]
        assert lengths == [2, 4, 6, 8]
        # each turn's prompt extends the previous one
        for prev, cur in zip(s.requests, s.requests[1:], strict=False):
            assert cur.body["messages"][: len(prev.body["messages"])] == prev.body["messages"]


def test_shared_prefix_groups_share_exactly_their_prefix() -> None:
    spec = WorkloadSpec(num_sessions=3, turns=5, prefix_words=50)
    sessions = build_workload("shared_prefix", spec)
    assert len(sessions) == 15
    prefixes = [s.requests[0].body["messages"][0]["content"] for s in sessions]
    assert len(set(prefixes)) == 3
    assert all(prefixes.count(p) == 5 for p in set(prefixes))
    assert all(len(p.split()) == 50 for p in prefixes)


def test_long_doc_qa_uses_one_document_per_customer() -> None:
    spec = WorkloadSpec(num_sessions=2, turns=3, extra={"doc_words": 100})
    sessions = build_workload("long_doc_qa", spec)
    for s in sessions:
        docs = {r.body["messages"][0]["content"] for r in s.requests}
        assert len(docs) == 1
        assert len(next(iter(docs)).split()) == 100
    assert sessions[0].requests[0].body["messages"][0] != sessions[1].requests[0].body["messages"][0]


def test_agentic_fans_out_in_one_parallel_group_after_the_plan() -> None:
    sessions = build_workload("agentic", WorkloadSpec(num_sessions=1, fanout=3))
    reqs = sessions[0].requests
    assert reqs[0].parallel_group is None
    assert [r.parallel_group for r in reqs[1:]] == [1, 1, 1]
    plan_context = reqs[0].body["messages"]
    assert all(r.body["messages"][: len(plan_context)] == plan_context for r in reqs[1:])


def test_unique_prompts_share_no_first_word() -> None:
    sessions = build_workload("unique", WorkloadSpec(num_sessions=5, turns=2))
    firsts = [_prompt_text(s.requests[0].body).split()[0] for s in sessions]
    assert len(set(firsts)) == len(firsts) == 10


def test_unknown_workload_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="multi_turn"):
        build_workload("nope", WorkloadSpec())
