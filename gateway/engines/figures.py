"""What a load scrape yields: one engine's figures, normalized, or the reason there are none."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One engine's load, in the units kvgate's own worker reports (the ``WorkerView`` fields).

    Attributes:
        running: requests in the running batch (summed over DP ranks).
        waiting: requests queued (summed over DP ranks).
        kv_usage: fraction of the KV cache in use, 0–1; None when the engine does not say.
        max_running: the engine's running slots (summed over DP ranks); 0 when it does not say.
        cached_blocks: blocks holding a reusable prefix (kvgate's own worker); None when not reported.
        block_size: the engine's KV block (page) size in tokens, where this signal tells it.
        capacity_tokens: the engine's KV capacity in tokens, where this signal tells it.
        prefix_caching: whether prefix caching is on, where this signal tells it (vLLM's cache info).
    """

    running: int
    waiting: int
    kv_usage: float | None = None
    max_running: int = 0
    cached_blocks: int | None = None
    block_size: int | None = None
    capacity_tokens: int | None = None
    prefix_caching: bool | None = None


@dataclass(frozen=True, slots=True)
class NoLoad:
    """No figures this time.

    Attributes:
        reason: why (for ``load_note`` and logs).
        keep_previous: the signal is fine but carried no new sample (TensorRT-LLM's drained stats queue): the
            last figures still stand.
    """

    reason: str
    keep_previous: bool = False
