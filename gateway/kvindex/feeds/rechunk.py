"""Engine KV events re-hashed into kvgate's block scheme, at any engine block size.

Engine hashes cannot be matched against the gateway's, but ``BlockStored`` carries the token ids, so each
stored block is re-hashed with ``chain_hashes`` from its parent's position in kvgate's chain. With an engine
block size ``B`` and the gateway's ``b``:

- ``B % b == 0`` (vLLM 16/32/128, TensorRT-LLM 32 against 16): an engine block becomes ``B / b`` kvgate
  blocks; removing it removes all of them.
- ``b % B == 0`` (SGLang page 1, or 16 against a gateway block of 64): consecutive pages of a chain are
  accumulated (per parent) until a full kvgate block exists, which is then stored; removing any page of
  it removes that kvgate block. Tokens that do not fill a kvgate block yet are not indexed.
- other ratios are skipped (counted, logged once).

Each engine hash maps to a ``_Node``: where its end sits in kvgate's chain (``seed`` = the last complete
kvgate block, ``pending`` = the tokens after it) and which kvgate blocks it is part of (``ours``). The map
is an LRU of ``max_mapped`` entries; a block whose parent fell out of it (or was stored before the feed
started) cannot be named and is skipped. Only GPU (or unspecified) media, local blocks and one
full-attention KV cache group are indexed; the namespace (LoRA, cache salt, multimodal) is ``namespace.py``.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, cast

from gateway.kvindex.feeds.decode import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineEvent,
    EngineHash,
    UnknownEvent,
)
from gateway.kvindex.feeds.namespace import chain_root, indexable_prefix
from kvgate_core.kvcontract.events import EventType, KVEvent, Tier
from kvgate_core.kvcontract.hashing import chain_hashes

logger = logging.getLogger(__name__)

_GPU_MEDIA: Final = frozenset({None, "GPU"})
_LOCAL: Final = frozenset({None, "LOCAL"})
# vLLM's KVCacheSpecKind values whose blocks name a whole prefix (sliding windows and Mamba states do not).
_FULL_PREFIX_KINDS: Final = frozenset({None, "full_attention", "mla_attention", "sink_full_attention"})


@dataclass(frozen=True, slots=True)
class TranslatorConfig:
    """How to name one engine's blocks in kvgate's scheme.

    Attributes:
        worker: the gateway registry id of the engine.
        model: the model id the gateway hashes this engine's prompts with (the chain's root).
        block_size: the gateway's block size (the engine's comes with each event).
        max_mapped: engine hashes remembered (LRU); older blocks can then not be removed or extended.
        lora_in_model: the engine's requests name a LoRA adapter in ``model`` (vLLM), so the adapter name
            is the root's model; otherwise it is a ``lora:`` extra key.
    """

    worker: str
    model: str
    block_size: int = 16
    max_mapped: int = 1_000_000
    lora_in_model: bool = False


@dataclass(slots=True)
class _Node:
    seed: int
    pending: tuple[int, ...]
    pages: tuple[EngineHash, ...]  # engine blocks whose tokens are in ``pending``
    ours: list[int]


class EngineEventTranslator:
    """Turns one engine's decoded events into kvgate ``KVEvent``s (stateful: keeps the engine-hash map).

    ``skipped`` counts what could not be indexed, by reason; each reason is logged once.
    """

    def __init__(self, config: TranslatorConfig) -> None:
        self.config = config
        self.skipped: Counter[str] = Counter()
        self._nodes: OrderedDict[EngineHash, _Node] = OrderedDict()
        self._group: int | None = None

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    @property
    def num_mapped(self) -> int:
        return len(self._nodes)

    def reset(self) -> None:
        """Forget every engine block (after a resync: the index was cleared for this worker)."""
        self._nodes.clear()

    def translate(self, events: Sequence[EngineEvent], ts: float = 0.0) -> list[KVEvent]:
        """kvgate events for a decoded batch; what cannot be indexed is skipped and counted."""
        worker, out = self.config.worker, []
        for event in events:
            if isinstance(event, BlockStored):
                if hashes := self._stored(event):
                    out.append(KVEvent(worker=worker, type=EventType.STORED, hashes=tuple(hashes), ts=ts))
            elif isinstance(event, BlockRemoved):
                if hashes := self._removed(event):
                    out.append(KVEvent(worker=worker, type=EventType.REMOVED, hashes=tuple(hashes), ts=ts))
            elif isinstance(event, AllBlocksCleared):
                self.reset()
                out.append(KVEvent(worker=worker, type=EventType.CLEARED, tier=Tier.GPU, ts=ts))
            elif isinstance(event, UnknownEvent):
                self._skip(f"unknown event type {event.tag!r}")
        return out

    def _stored(self, event: BlockStored) -> list[int]:
        size, ours = event.block_size, self.config.block_size
        reason = self._placement_reason(event.medium, event.locality)
        if reason is None and not self._accept_group(event.group_idx, event.spec_kind):
            reason = "not the full-attention KV cache group"
        if reason is None and size % ours and ours % size:
            reason = f"engine block size {size} and gateway block size {ours} do not divide"
        if reason is None and len(event.token_ids) != size * len(event.block_hashes):
            reason = "token count is not block_size times the block hashes"
        if reason is not None:
            return self._skip(reason)
        start = self._start(event)
        if start is None:
            return []
        limit, cut = indexable_prefix(event, is_root=event.parent is None)
        if cut is not None:
            self._skip(cut)
        return self._chain(event, start, limit)

    def _start(self, event: BlockStored) -> _Node | None:
        if event.parent is None:
            root = chain_root(event, model=self.config.model, lora_in_model=self.config.lora_in_model)
            if root is None:
                self._skip("LoRA id without a LoRA name")
                return None
            return _Node(root, (), (), [])
        node = self._nodes.get(event.parent)
        if node is None:
            self._skip("parent block unknown (stored before the feed started, or not indexed)")
            return None
        self._nodes.move_to_end(event.parent)
        return node

    def _chain(self, event: BlockStored, start: _Node, limit: int) -> list[int]:
        size, ours = event.block_size, self.config.block_size
        seed, pending, pages = start.seed, start.pending, start.pages
        out: list[int] = []
        for i in range(limit):
            engine_hash = event.block_hashes[i]
            block = cast("Sequence[int]", event.token_ids[i * size : (i + 1) * size])  # checked: ints
            tokens = (*pending, *block)
            hashes = chain_hashes(tokens, seed, ours)
            if hashes:
                for page in pages:  # the pages accumulated into the first completed block belong to it
                    if (node := self._nodes.get(page)) is not None and hashes[0] not in node.ours:
                        node.ours.append(hashes[0])
                seed, pending = hashes[-1], tokens[len(hashes) * ours :]
                pages = (engine_hash,) if pending else ()
            else:
                pending, pages = tokens, (*pages, engine_hash)
            self._remember(engine_hash, _Node(seed, pending, pages, hashes))
            out.extend(hashes)
        return out

    def _remember(self, engine_hash: EngineHash, node: _Node) -> None:
        old = self._nodes.pop(engine_hash, None)
        if old is not None:  # stored again (vLLM re-announces reused blocks): keep what it was part of
            node.ours.extend(h for h in old.ours if h not in node.ours)
        self._nodes[engine_hash] = node
        while len(self._nodes) > self.config.max_mapped:
            self._nodes.popitem(last=False)

    def _removed(self, event: BlockRemoved) -> list[int]:
        reason = self._placement_reason(event.medium, event.locality)
        if reason is None and self._group is not None and event.group_idx not in (None, self._group):
            reason = "not the full-attention KV cache group"
        if reason is not None:
            return self._skip(reason)
        gone: dict[int, None] = {}
        for engine_hash in event.block_hashes:
            node = self._nodes.pop(engine_hash, None)
            if node is not None:
                gone.update(dict.fromkeys(node.ours))
        return list(gone)

    def _accept_group(self, group: int | None, kind: str | None) -> bool:
        if kind not in _FULL_PREFIX_KINDS:
            return False
        if group is None:
            return True
        if self._group is None:
            self._group = group
        return group == self._group

    @staticmethod
    def _placement_reason(medium: str | None, locality: str | None) -> str | None:
        if (medium and medium.upper()) not in _GPU_MEDIA:
            return f"medium {medium} is not the engine's GPU cache"
        if (locality and locality.upper()) not in _LOCAL:
            return f"locality {locality} is not local"
        return None

    def _skip(self, reason: str) -> list[int]:
        if reason not in self.skipped:
            logger.warning("KV events of worker %s: not indexed: %s", self.config.worker, reason)
        self.skipped[reason] += 1
        return []
