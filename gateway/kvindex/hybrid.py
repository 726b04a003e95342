"""The KV index mode follows each worker: precise where its KV events flow, approximate where none do.

``HybridKVIndex`` holds a precise index (``MemoryKVIndex``: the workers' events plus short routing
predictions) and an approximate one (``ApproximateKVIndex``: what was routed, assumed cached up to a capacity
and a lifetime) and answers each worker from the one its mode names:

* ``precise``: a KV-event feed follows the worker (kvgate's SSE, an engine's ZMQ publisher or HTTP drain);
* ``approximate``: no feed (TGI, LMDeploy, MII, an engine started without events, or a feed gone quiet):
  placement is learned from routing;
* ``none``: its blocks are not trusted and nothing is learned (a quiet feed under ``--kv-index precise``).

Modes switch at run time (``set_mode``): a worker leaving ``approximate`` forgets its guessed placement (its
events are authoritative now); one leaving ``precise`` keeps its event blocks, unused until it returns (a
feed that flows again resumes where it was). Workers the index was never told about take ``default``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal, get_args

from gateway.kvindex.approximate import ApproximateKVIndex
from gateway.kvindex.index import KVIndex, PrefixHit
from kvgate_core.kvcontract.events import KVEvent

IndexMode = Literal["precise", "approximate", "none"]
INDEX_MODES: Final[tuple[IndexMode, ...]] = get_args(IndexMode)
_NO_HIT: Final = PrefixHit()


class HybridKVIndex:
    """A ``KVIndex`` answering each worker from its mode's index.

    Args:
        precise: events and predictions (``MemoryKVIndex``).
        approximate: routing-learned placement (``ApproximateKVIndex``).
        default: the mode of a worker not set yet (``approximate`` in auto mode, ``precise`` under
            ``--kv-index precise``).
    """

    __slots__ = ("_approximate", "_default", "_modes", "_precise")

    def __init__(
        self, precise: KVIndex, approximate: ApproximateKVIndex, *, default: IndexMode = "approximate"
    ) -> None:
        self._precise = precise
        self._approximate = approximate
        self._default: IndexMode = default
        self._modes: dict[str, IndexMode] = {}

    @property
    def precise(self) -> KVIndex:
        return self._precise

    @property
    def approximate(self) -> ApproximateKVIndex:
        return self._approximate

    @property
    def follows_fleet(self) -> bool:
        """Workers without a feed are approximate (auto mode), not precise (``--kv-index precise``)."""
        return self._default == "approximate"

    def mode(self, worker: str) -> IndexMode:
        return self._modes.get(worker, self._default)

    def modes(self) -> dict[str, IndexMode]:
        """The mode of every worker set so far."""
        return dict(self._modes)

    def set_mode(self, worker: str, mode: IndexMode) -> bool:
        """Answer ``worker`` from ``mode`` from now on; True when that changed its mode."""
        old = self.mode(worker)
        self._modes[worker] = mode
        if old == mode:
            return False
        if old == "approximate":
            self._approximate.forget(worker)
        return True

    def apply(self, event: KVEvent) -> None:
        """Events come only from workers that publish them: the precise index takes them all."""
        self._precise.apply(event)

    def record_routed(self, worker: str, hashes: Sequence[int]) -> None:
        """An approximate worker learns the placement; others get the precise index's short prediction."""
        if self.mode(worker) == "approximate":
            self._approximate.record_routed(worker, hashes)
        else:
            self._precise.record_routed(worker, hashes)

    def longest_prefix(self, hashes: Sequence[int], workers: Iterable[str]) -> Mapping[str, PrefixHit]:
        by_mode: dict[IndexMode, list[str]] = {"precise": [], "approximate": [], "none": []}
        for worker in workers:
            by_mode[self.mode(worker)].append(worker)
        hits: dict[str, PrefixHit] = {}
        if by_mode["precise"]:
            hits.update(self._precise.longest_prefix(hashes, by_mode["precise"]))
        if by_mode["approximate"]:
            hits.update(self._approximate.longest_prefix(hashes, by_mode["approximate"]))
        for worker in by_mode["none"]:
            hits[worker] = _NO_HIT
        return hits

    def remove_worker(self, worker: str) -> None:
        self._precise.remove_worker(worker)
        self._approximate.remove_worker(worker)
        self._modes.pop(worker, None)

    def num_blocks(self) -> int:
        return self._precise.num_blocks() + self._approximate.num_blocks()

    def worker_blocks(self) -> Mapping[str, int]:
        """Blocks per worker from the index its mode reads (a worker in ``none`` mode holds none)."""
        precise, approximate = self._precise.worker_blocks(), self._approximate.worker_blocks()
        blocks: dict[str, int] = {}
        for worker in {*precise, *approximate}:
            mode = self.mode(worker)
            if mode != "none":
                blocks[worker] = (precise if mode == "precise" else approximate).get(worker, 0)
        return blocks
