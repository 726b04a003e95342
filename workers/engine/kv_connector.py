"""``KVConnector``: the real engine's link to the shared KV tier (pull on a prefix miss, push after compute).

Pull (event loop, before a request reaches the scheduler)::

    hashes of the prompt's full blocks -> local prefix hits (a hint read off the block manager)
    -> tier.contains_prefix(rest) -> plan_pull (pull vs recompute, by the measured pull bandwidth and
    prefill rate) -> tier.get_many -> check the leading run of good values (codec.decode)
    -> core.run_in_step(install): on the step thread, before admissions, the block manager registers the
       pulled hashes on free blocks (``import_blocks``) and their K/V are copied into those cache slots.

The scheduler then admits the request as usual and finds the pulled blocks as ordinary prefix-cache hits,
so it computes only the rest and reports them in ``num_cached_tokens`` (usage ``cached_tokens``).

Push (step thread, after every step): blocks whose hashes the step registered (``stored`` events), except
those that came from the tier, are dumped (``codec.dump``) while they cannot have been reused yet, and
handed to the event loop, which writes them with ``tier.put_many`` (write-behind on a layered tier).
``settle`` waits until every push so far is durable: a one-token request (a PD prefill, see
``gateway.routing.pd``) answers only after it, so the decode worker will find its blocks.

A tier outage never fails a request: the tier answers misses, and a bad value ends the pulled run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from kvgate_core.kvcontract.events import EventType, Tier
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from kvgate_core.kvcontract.wire import WireError
from workers.engine.core import EngineCore, StepResult
from workers.engine_api import GenerationRequest
from workers.kvtier.codec import BlockCodec, KVGeometry
from workers.kvtier.events import EventSink
from workers.kvtier.factory import TierSettings, open_tier
from workers.kvtier.planner import PullRates, PullRequest, RateEwma, plan_pull

if TYPE_CHECKING:
    from workers.kvtier.protocols import WritableTier

logger = logging.getLogger(__name__)


class KVConnector:
    """Pulls prefix blocks a request lacks from the tier and pushes the blocks the engine computes.

    Args:
        core: the engine core (block manager, KV cache, step hooks).
        settings: the tier to open (``open_tier``); opened by ``start``.
        worker_id: stamped on the tier's events.
        pull_latency_s: fixed cost of one batched read, for the pull-or-recompute plan.
        initial_pull_bps: assumed pull bandwidth until one is measured.
        initial_prefill_tps: assumed prefill rate until one is measured.
        batch_bytes: the most bytes one tier read or write carries (a batch must fit the tier's deadline).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        core: EngineCore,
        settings: TierSettings,
        *,
        worker_id: str,
        pull_latency_s: float = 0.002,
        initial_pull_bps: float = 200e6,
        initial_prefill_tps: float = 2000.0,
        batch_bytes: int = 8 << 20,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._core = core
        self._blocks = core.scheduler.blocks
        self._caches = core.runner.kv_cache.layers
        self._codec = BlockCodec(settings.model, KVGeometry.of(self._caches))
        self._batch_blocks = max(1, batch_bytes // self._codec.value_bytes)
        self._settings = settings
        self._worker_id = worker_id
        self._latency_s = pull_latency_s
        self.pull_bw = RateEwma(initial_pull_bps)
        self.prefill = RateEwma(initial_prefill_tps)
        self._clock = clock
        self._tier: WritableTier | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._from_tier: set[int] = set()  # pulled hashes: never pushed back
        self._pending: set[asyncio.Task[None]] = set()
        self._submitted: dict[str, float] = {}  # request id -> when it reached the scheduler
        self.pulled_blocks = 0
        self.pushed_blocks = 0

    @property
    def codec(self) -> BlockCodec:
        return self._codec

    async def start(self, sink: EventSink) -> None:
        """Open the tier (its ``dram``/``ssd`` events go to ``sink``) and hook the core's steps."""
        self._loop = asyncio.get_running_loop()
        settings = dataclasses.replace(self._settings, layout=self._codec.layout)
        self._tier = await open_tier(settings, sink=sink, worker_id=self._worker_id)
        self._core.step_hooks.append(self.on_step)

    async def aclose(self) -> None:
        await self.settle()
        if self._tier is not None:
            await self._tier.aclose()
            self._tier = None

    # -- pull (event loop) -----------------------------------------------------------------------------

    async def pull(self, request: GenerationRequest) -> int:
        """Fetch the blocks the tier holds after the local prefix and queue their install.

        The request is assumed submitted right after: its time to the first token measures the prefill
        rate the next plans use.

        Returns:
            Blocks queued for install (0: nothing worth pulling, or nothing there).
        """
        try:
            return await self._pull(request)
        finally:
            if len(self._submitted) > 4096:  # aborted before their first token: forget them
                self._submitted.clear()
            self._submitted[request.request_id] = self._clock()

    async def _pull(self, request: GenerationRequest) -> int:
        tier, bs = self._tier, self._blocks.block_size
        prompt = request.prompt_token_ids
        if tier is None or len(prompt) <= bs:
            return 0
        hashes = chain_hashes(prompt, root_hash(request.model or self._codec.model, request.extra_keys), bs)
        local = self._blocks.num_cached_prefix_blocks(hashes, len(prompt))  # a hint: the step thread owns it
        in_tier = await tier.contains_prefix(hashes[local:])
        req = PullRequest(len(prompt), bs, local, in_tier, self._codec.value_bytes)
        plan = plan_pull(req, PullRates(self.pull_bw.rate, self._latency_s, self.prefill.rate))
        if plan.num_blocks == 0:
            return 0
        wanted = hashes[local : local + plan.num_blocks]
        start = self._clock()
        values = await self._get(tier, wanted)
        good = _leading(values)
        host = self._decode([v for v in values[:good] if v is not None], wanted[:good])
        if host is None:
            return 0
        self.pull_bw.observe(sum(len(v or b"") for v in values[:good]), self._clock() - start)
        n = host.shape[0]
        self._core.run_in_step(lambda: self._install(hashes[: local + n], local, host))
        return n

    async def _get(self, tier: WritableTier, hashes: Sequence[int]) -> list[bytes | None]:
        """Values of ``hashes`` in batches of at most ``batch_bytes``, stopping at the first miss."""
        out: list[bytes | None] = []
        step = self._batch_blocks
        for i in range(0, len(hashes), step):
            values = await tier.get_many(hashes[i : i + step])
            out.extend(values)
            if _leading(values) < len(values):
                break
        return out

    def _decode(self, values: list[bytes], hashes: Sequence[int]) -> torch.Tensor | None:
        """Host tensor of the leading run of values that pass their checks (None when none does)."""
        try:
            return self._codec.decode(values, hashes) if values else None
        except WireError:
            pass
        good = 0
        for value, h in zip(values, hashes, strict=True):
            try:
                self._codec.decode([value], [h])
            except WireError:
                break
            good += 1
        return self._codec.decode(values[:good], hashes[:good]) if good else None

    def _install(self, chain: Sequence[int], start: int, host: torch.Tensor) -> None:
        """Step thread: register ``chain[start:]`` on free blocks and copy their K/V into the cache."""
        ids = self._blocks.import_blocks(chain, start)
        rows = [i for i, block in enumerate(ids) if block is not None]
        if not rows:
            return
        device = self._caches[0][0].device
        data = host[rows].to(device)
        index = torch.as_tensor([ids[i] for i in rows], dtype=torch.long, device=device)
        for layer, (k, v) in enumerate(self._caches):
            k.index_copy_(0, index, data[:, layer, 0])
            v.index_copy_(0, index, data[:, layer, 1])
        self._from_tier.update(chain[start + i] for i in rows)
        self.pulled_blocks += len(rows)

    # -- push (step thread, then event loop) -------------------------------------------------------------

    def on_step(self, result: StepResult) -> None:
        """Step thread: learn the prefill rate; dump the blocks this step registered, for the tier."""
        now = self._clock()
        for request_id, chunk in result.chunks:
            submitted = self._submitted.pop(request_id, None)
            computed = chunk.num_prompt_tokens - chunk.num_cached_tokens
            if submitted is not None and chunk.num_output_tokens == 1 and computed > 0:
                self.prefill.observe(computed, now - submitted)
        hashes: list[int] = []
        ids: list[int] = []
        for event in result.events:
            if event.type is not EventType.STORED or event.tier is not Tier.GPU:
                continue
            for h in event.hashes:
                block = self._blocks.block_of(h)
                if h in self._from_tier:
                    self._from_tier.discard(h)
                elif block is not None:
                    hashes.append(h)
                    ids.append(block)
        if hashes and self._loop is not None:
            values = self._codec.dump(self._caches, ids, hashes)
            self._loop.call_soon_threadsafe(self._push, list(zip(hashes, values, strict=True)))

    def _push(self, blocks: list[tuple[int, bytes]]) -> None:
        if self._tier is None:
            return
        step = self._batch_blocks
        for i in range(0, len(blocks), step):
            task = asyncio.get_running_loop().create_task(self._put(self._tier, blocks[i : i + step]))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _put(self, tier: WritableTier, blocks: list[tuple[int, bytes]]) -> None:
        self.pushed_blocks += await tier.put_many(blocks)

    async def settle(self) -> None:
        """Wait until every push handed over so far is durable in the tier."""
        if self._pending:
            await asyncio.wait(tuple(self._pending))
        flush = getattr(self._tier, "flush", None)
        if flush is not None:
            await flush()


def _leading(values: Sequence[bytes | None]) -> int:
    n = 0
    for value in values:
        if value is None:
            break
        n += 1
    return n
