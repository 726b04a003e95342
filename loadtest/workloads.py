"""Seeded, deterministic workloads for the load driver.

A workload is a list of ``Session``s. Requests of one session run in order (turn t waits for turn t-1);
sessions run concurrently (closed loop) or start at their arrival times (open loop). Each request carries
its OpenAI body ready to send, so the driver does no generation work on its hot path.

Workloads: ``multi_turn`` (growing chat histories behind a shared system prompt), ``shared_prefix``
(G long prefixes, many short questions each), ``long_doc_qa`` (N customers, a 6k-token document each,
short queries), ``agentic`` (a plan step, then parallel tool calls sharing its context), ``unique``
(no reuse). Trace replay lives in ``loadtest.trace``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

_VOCABULARY: Final = (
    "cache prefix token block worker gateway route model prompt decode prefill batch queue "
    "latency memory tensor layer attention stream request answer question system user assistant "
    "data value server fleet replica shard index event policy score load balance hit miss "
    "warm cold page slot"
)
_WORDS: Final = tuple(_VOCABULARY.split())


@dataclass(frozen=True, slots=True)
class WorkRequest:
    """One request to send: its endpoint (``chat`` or ``completions``) and body (without ``stream``)."""

    endpoint: str
    body: dict[str, Any]
    #: Requests with the same non-None ``parallel_group`` in a session are sent together.
    parallel_group: int | None = None


@dataclass(frozen=True, slots=True)
class Session:
    """Requests sent in order; ``arrival_s`` is the open-loop start offset (None: closed loop)."""

    id: str
    requests: tuple[WorkRequest, ...]
    arrival_s: float | None = None


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Knobs shared by the synthetic workloads; each workload reads the ones it needs."""

    model: str = "kvgate-sim"
    seed: int = 0
    num_sessions: int = 16
    turns: int = 4
    system_words: int = 300
    prefix_words: int = 1500
    question_words: int = 20
    max_tokens: int = 16
    fanout: int = 4
    extra: dict[str, Any] = field(default_factory=dict)


def words(rng: random.Random, n: int) -> str:
    """``n`` words drawn from a fixed vocabulary (about 1.5 tokens each for BPE tokenizers)."""
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _chat(spec: WorkloadSpec, messages: list[dict[str, str]], user: str | None = None) -> WorkRequest:
    body: dict[str, Any] = {"model": spec.model, "messages": list(messages), "max_tokens": spec.max_tokens}
    if user is not None:
        body["user"] = user
    return WorkRequest("chat", body)


def multi_turn(spec: WorkloadSpec) -> list[Session]:
    """Users with growing histories behind one shared system prompt."""
    rng = random.Random(spec.seed)
    system = {"role": "system", "content": words(rng, spec.system_words)}
    sessions = []
    for u in range(spec.num_sessions):
        history: list[dict[str, str]] = [system]
        reqs = []
        for _ in range(spec.turns):
            history.append({"role": "user", "content": words(rng, spec.question_words * 4)})
            reqs.append(_chat(spec, history, user=f"user-{u}"))
            history.append({"role": "assistant", "content": words(rng, spec.max_tokens)})
        sessions.append(Session(f"user-{u}", tuple(reqs)))
    return sessions


def shared_prefix(spec: WorkloadSpec) -> list[Session]:
    """G long prefixes (``num_sessions`` groups) with ``turns`` short questions each, interleaved."""
    rng = random.Random(spec.seed)
    prefixes = [words(rng, spec.prefix_words) for _ in range(spec.num_sessions)]
    sessions = []
    for q in range(spec.turns):
        for g, prefix in enumerate(prefixes):
            msgs = [
                {"role": "system", "content": prefix},
                {"role": "user", "content": words(rng, spec.question_words)},
            ]
            sessions.append(Session(f"group-{g}-q{q}", (_chat(spec, msgs),)))
    return sessions


def long_doc_qa(spec: WorkloadSpec) -> list[Session]:
    """N customers each with a long document (~6k tokens by default) and short queries in sequence."""
    rng = random.Random(spec.seed)
    doc_words = int(spec.extra.get("doc_words", 4000))
    sessions = []
    for c in range(spec.num_sessions):
        doc = words(rng, doc_words)
        reqs = tuple(
            _chat(
                spec,
                [
                    {"role": "system", "content": doc},
                    {"role": "user", "content": words(rng, spec.question_words)},
                ],
            )
            for _ in range(spec.turns)
        )
        sessions.append(Session(f"customer-{c}", reqs))
    return sessions


def agentic(spec: WorkloadSpec) -> list[Session]:
    """A plan step, then ``fanout`` parallel tool calls that share the plan's context."""
    rng = random.Random(spec.seed)
    sessions = []
    for a in range(spec.num_sessions):
        context = [
            {"role": "system", "content": words(rng, spec.system_words)},
            {"role": "user", "content": words(rng, spec.prefix_words // 4)},
        ]
        reqs = [_chat(spec, context)]
        context = [*context, {"role": "assistant", "content": words(rng, spec.max_tokens)}]
        for t in range(spec.fanout):
            call = [*context, {"role": "user", "content": f"tool {t}: " + words(rng, spec.question_words)}]
            reqs.append(WorkRequest("chat", _chat(spec, call).body, parallel_group=1))
        sessions.append(Session(f"agent-{a}", tuple(reqs)))
    return sessions


def unique(spec: WorkloadSpec) -> list[Session]:
    """Independent prompts with no shared prefix (a per-request random first word breaks sharing)."""
    rng = random.Random(spec.seed)
    return [
        Session(
            f"u-{i}",
            (_chat(spec, [{"role": "user", "content": f"{i} " + words(rng, spec.prefix_words // 4)}]),),
        )
        for i in range(spec.num_sessions * spec.turns)
    ]


WORKLOADS: Final[dict[str, Callable[[WorkloadSpec], list[Session]]]] = {
    "multi_turn": multi_turn,
    "shared_prefix": shared_prefix,
    "long_doc_qa": long_doc_qa,
    "agentic": agentic,
    "unique": unique,
}


def build_workload(name: str, spec: WorkloadSpec) -> list[Session]:
    """Build a named synthetic workload.

    Raises:
        ValueError: unknown workload name (the message lists the known ones).
    """
    try:
        factory = WORKLOADS[name]
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}, trace:FILE.jsonl"
        ) from None
    return factory(spec)
