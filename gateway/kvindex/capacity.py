"""What each worker's cache holds, in the gateway's units, learned from what its engine says and reports.

The approximate index assumes a worker keeps the blocks routed to it up to a capacity. That capacity is in
the *gateway's* blocks, while engines state theirs in their own tokens; when the gateway hashes bytes (no
exact tokenizer) one engine token is several gateway tokens. ``CapacityLearner`` keeps, per worker:

- ``ratio``: gateway tokens per engine token, an average of the prompt the gateway hashed over the
  ``usage.prompt_tokens`` the engine reported; it starts at 1 when the gateway has the engines' tokenizer
  (about 4 with bytes), and a ratio within 5% of 1 counts as 1 (chat templates differ by a token or two);
- the engine's KV capacity in its tokens (its metrics or server info, or ``#kv_tokens=``), when known;
- ``scale``: a correction learned from the closed loop on predictions. When a predicted hit does not come
  true (the engine reports fewer cached tokens than predicted) the worker evicted sooner than assumed and
  the assumed capacity shrinks; when the engine reports more than predicted while the assumed cache is full,
  the index forgot placement the worker still had and the capacity grows. Each by a factor that grows with
  the error (3% for a near miss, 15% for a whole one), bounded (1/64 to 4× of the start): a worker that
  announces nothing starts from the index's default, often several times its real cache, and is brought
  near it within tens of misses. (Capping the assumption on a miss at what the index holds was tried and
  dropped: it gained 11% throughput on ``bench_routing --scenarios chat_closed`` but lost 5–9 points of hit
  rate where misses are not evictions, as under load when running sequences take cache space; halving at
  most on such a miss: +3% and -3 points.)

The assumed capacity is ``engine tokens × ratio × scale / block size`` (or the index's default × scale when
the engine's is unknown), and the index keeps placement for ``headroom`` × that: the two errors do not cost
the same. Kept too long, a placement the worker has evicted sends a request to it for nothing more than the
prefill it would have paid anywhere, and that worker then holds the prefix again (affinity stands). Forgotten
too early, a placement the worker still has sends the prefix's next request elsewhere, a second copy that
crowds both caches, and gateway replicas whose ratios were learned from different samples (1% apart)
disagree at the margin on where a prefix lives (``route_sim --fleet foreign``, shared prefix, 4 replicas:
hit/ideal 0.95 at 1.0, 1.00 at 1.25). The index caps what it holds by its own memory budget whatever is
learned here. ``engine_tokens`` turns a count of gateway tokens into the engine's, so that predicted hits
(the ``x-kvgate-prefix-hit`` header, the drift alarm) compare with what the engine reports like for like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from gateway.kvindex.approximate import ApproximateKVIndex

#: bytes per token of a BPE tokenizer on English text: the byte tokenizer's ratio before usage is seen
BYTES_PER_TOKEN: Final = 4.0
_SAME_UNITS: Final = 0.05


class TokenUnits(Protocol):
    """What the router needs of the learner: conversion to a worker's tokens, and each outcome."""

    def engine_tokens(self, worker: str, gateway_tokens: int, /) -> int: ...

    def observe_finished(
        self,
        worker: str,
        /,
        *,
        gateway_prompt_tokens: int,
        engine_prompt_tokens: int | None,
        predicted_tokens: int,
        reported_tokens: int | None,
        tolerance_tokens: int,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class CapacityConfig:
    """How the learner starts and moves.

    Attributes:
        initial_ratio: gateway tokens per engine token before any usage was seen: 1 with the engines'
            tokenizer, ``BYTES_PER_TOKEN`` with the byte tokenizer.
        ratio_weight: weight of one usage sample in the ratio's running average.
        step: the relative change of ``scale`` on one prediction that missed or fell short by a little;
            one that missed by more moves it more, up to ``max_step`` for a prediction that missed whole
            (the engine had none of it) or a report of hits the index forgot entirely, so that a start
            several times off is corrected within tens of requests, and small errors move it little.
        max_step: the relative change on a whole miss or shortfall.
        min_scale: the least ``scale`` (a fleet that shares its cache with other traffic).
        max_scale: the most ``scale``.
        push_tolerance: a capacity that moved less than this share is not pushed to the index again.
        headroom: placement is kept for this many times the assumed capacity (see the module docstring).
    """

    initial_ratio: float = 1.0
    ratio_weight: float = 0.05
    step: float = 0.03
    max_step: float = 0.15
    min_scale: float = 1 / 64
    max_scale: float = 4.0
    push_tolerance: float = 0.02
    headroom: float = 1.25

    def __post_init__(self) -> None:
        if self.initial_ratio <= 0 or not 0 < self.ratio_weight <= 1:
            raise ValueError("initial_ratio > 0 and 0 < ratio_weight <= 1 are required")
        if not 0 < self.step <= self.max_step < 1:
            raise ValueError("0 < step <= max_step < 1 is required")
        if not 0 < self.min_scale <= 1 <= self.max_scale:
            raise ValueError("need 0 < min_scale <= 1 <= max_scale")
        if self.headroom < 1:
            raise ValueError("headroom must be >= 1")


@dataclass(slots=True)
class WorkerUnits:
    """One worker's learned figures (``/admin/workers`` shows them)."""

    ratio: float
    scale: float = 1.0
    engine_capacity_tokens: int | None = None
    samples: int = 0
    misses: int = 0  # predictions the engine did not confirm
    shortfalls: int = 0  # reports above the prediction while the assumed cache was full
    pushed_blocks: int = 0  # the assumed capacity, in the gateway's blocks
    kept_blocks: int = 0  # what the index keeps: ``headroom`` × that

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "gateway_tokens_per_engine_token": round(self.ratio, 3),
            "capacity_scale": round(self.scale, 3),
            "assumed_capacity_blocks": self.pushed_blocks,
            "kept_capacity_blocks": self.kept_blocks,
            "usage_samples": self.samples,
            "missed_predictions": self.misses,
            "short_predictions": self.shortfalls,
        }


class CapacityLearner:
    """Per-worker unit conversion and assumed-cache size; see the module docstring.

    Args:
        index: the approximate index whose per-worker capacity this sets.
        block_size: the gateway's tokens per block.
        config: starting values and steps.
    """

    __slots__ = ("_block_size", "_config", "_index", "_workers")

    def __init__(
        self, index: ApproximateKVIndex, *, block_size: int, config: CapacityConfig | None = None
    ) -> None:
        self._index = index
        self._block_size = block_size
        self._config = config or CapacityConfig()
        self._workers: dict[str, WorkerUnits] = {}

    def units(self, worker: str) -> WorkerUnits | None:
        return self._workers.get(worker)

    def ratio(self, worker: str) -> float:
        """Gateway tokens per engine token on ``worker``."""
        units = self._workers.get(worker)
        ratio = units.ratio if units is not None else self._config.initial_ratio
        return 1.0 if abs(ratio - 1.0) <= _SAME_UNITS else ratio

    def engine_tokens(self, worker: str, gateway_tokens: int) -> int:
        """``gateway_tokens`` in ``worker``'s engine tokens."""
        ratio = self.ratio(worker)
        return gateway_tokens if ratio == 1.0 else int(gateway_tokens / ratio)

    def set_engine_capacity(self, worker: str, tokens: int) -> None:
        """The engine says it holds ``tokens`` of its own tokens of KV."""
        if tokens <= 0:
            raise ValueError("capacity must be positive")
        units = self._ensure(worker)
        if units.engine_capacity_tokens != tokens:
            units.engine_capacity_tokens = tokens
            self._push(worker, units, force=True)

    def observe(
        self,
        worker: str,
        *,
        gateway_prompt_tokens: int,
        engine_prompt_tokens: int | None,
        predicted_tokens: int,
        reported_tokens: int | None,
        tolerance_tokens: int,
        learn_capacity: bool,
    ) -> None:
        """One finished request on ``worker``: learn the units from its usage and, when its placement is
        learned from routing (``learn_capacity``), correct the assumed capacity from the prediction
        (``predicted_tokens``, in engine tokens) against ``reported_tokens``."""
        units = self._ensure(worker)
        if engine_prompt_tokens and gateway_prompt_tokens > 0:
            sample = gateway_prompt_tokens / engine_prompt_tokens
            weight = max(self._config.ratio_weight, 1 / (units.samples + 1))  # the first samples count more
            units.ratio += weight * (sample - units.ratio)
            units.samples += 1
        if learn_capacity and reported_tokens is not None:
            cfg = self._config
            if predicted_tokens > 0 and reported_tokens + tolerance_tokens < predicted_tokens:
                units.misses += 1
                missed = 1 - max(0, reported_tokens) / predicted_tokens  # the share that did not come true
                units.scale = max(cfg.min_scale, units.scale * (1 - self._step(missed)))
            elif reported_tokens > predicted_tokens + tolerance_tokens and self._full(worker):
                units.shortfalls += 1
                forgotten = 1 - predicted_tokens / reported_tokens  # the share the index no longer had
                units.scale = min(cfg.max_scale, units.scale * (1 + self._step(forgotten)))
        self._push(worker, units)

    def _step(self, share: float) -> float:
        """The relative change of ``scale`` for an error of ``share`` (0..1) of the reported hit."""
        cfg = self._config
        return cfg.step + (cfg.max_step - cfg.step) * min(1.0, max(0.0, share))

    def forget(self, worker: str) -> None:
        self._workers.pop(worker, None)

    def _ensure(self, worker: str) -> WorkerUnits:
        units = self._workers.get(worker)
        if units is None:
            units = self._workers[worker] = WorkerUnits(ratio=self._config.initial_ratio)
        return units

    def _full(self, worker: str) -> bool:
        """Whether the index holds about as much for ``worker`` as it is assumed to keep."""
        units = self._workers.get(worker)
        assumed = (
            units.pushed_blocks if units is not None and units.pushed_blocks else self._index.capacity(worker)
        )
        return self._index.held(worker) >= 0.9 * assumed

    def _push(self, worker: str, units: WorkerUnits, *, force: bool = False) -> None:
        if units.engine_capacity_tokens is not None:
            blocks = units.engine_capacity_tokens * self.ratio(worker) * units.scale / self._block_size
        elif units.scale != 1.0 or force:
            blocks = self._index.config.capacity_blocks * units.scale
        else:
            return
        target = max(1, int(blocks))
        moved = abs(target - units.pushed_blocks) > self._config.push_tolerance * max(units.pushed_blocks, 1)
        if force or moved:
            units.pushed_blocks = target
            units.kept_blocks = max(1, int(target * self._config.headroom))
            self._index.set_capacity(worker, units.kept_blocks)
