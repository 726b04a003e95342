"""``bench_routing --fleet foreign``: the scenarios on workers a gateway cannot see inside.

``kvgate worker --sim --foreign`` publishes no KV events and serves no tokenizer or ``/load``, and counts
whitespace words as its tokens. A gateway on its default flags therefore detects a generic OpenAI engine,
routes on the byte tokenizer and learns an approximate index from its own routing: the fleet most sidecar
deployments meet. The scenarios stay the kvgate fleet's, made the same workload in the workers' units:

- the trace's token-id prompts become text, one pseudo-word per id (``w0`` …), so requests share a 16-word
  block exactly when they share its trace hash id;
- each worker's KV capacity and prefill rate are scaled by the workload's worker tokens per kvgate-sim token
  (words per byte for chat text, 1 for the trace), so a cache holds the same share of the working set and a
  prompt costs the same prefill time as on the kvgate fleet.

Hit rates, measured (``cached_tokens`` / ``prompt_tokens`` the workers report) and ideal, are in words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np

from gateway.kvindex.approximate import ApproximateKVIndex
from gateway.kvindex.capacity import BYTES_PER_TOKEN, CapacityConfig, CapacityLearner
from kvgate_core.kvcontract.hashing import DEFAULT_BLOCK_SIZE
from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint
from loadtest.ideal_cache import prompt_blocks
from loadtest.workloads import Session, WorkRequest
from workers.sim.engine import DEFAULT_MODEL
from workers.sim.foreign import foreign_bundle

#: the foreign workers' block size (their ``--block-size`` default), in words
WORD_BLOCK_SIZE: Final = DEFAULT_BLOCK_SIZE


def as_words(sessions: Sequence[Session]) -> list[Session]:
    """The sessions with every token-id prompt (the trace replay's numpy arrays) turned into words."""
    return [replace(s, requests=tuple(_as_words(r) for r in s.requests)) for s in sessions]


def _as_words(request: WorkRequest) -> WorkRequest:
    prompt = request.body.get("prompt")
    if not isinstance(prompt, np.ndarray):
        return request
    body: dict[str, Any] = {**request.body, "prompt": " ".join(f"w{int(i)}" for i in prompt)}
    return replace(request, body=body)


def worker_tokens_per_token(kvgate: Sequence[Session], foreign: Sequence[Session]) -> float:
    """Foreign-worker tokens (words) per kvgate-sim token (bytes, or trace token ids) of the same requests."""
    words = tokens = 0
    kvgate_bundle, word_bundle = byte_bundle(DEFAULT_MODEL), foreign_bundle(DEFAULT_MODEL)
    for ks, fs in zip(kvgate, foreign, strict=True):
        for kr, fr in zip(ks.requests, fs.requests, strict=True):
            tokens += prompt_blocks(kr.body, Endpoint(kr.endpoint), kvgate_bundle).num_tokens
            words += prompt_blocks(fr.body, Endpoint(fr.endpoint), word_bundle).num_tokens
    return words / tokens if tokens else 1.0


@dataclass(frozen=True, slots=True)
class WorkerFleet:
    """The workers a case runs on (``--fleet``) and the units their usage is in.

    Attributes:
        foreign: ``--sim --foreign`` workers (else kvgate's own ``--sim``).
        kv_tokens: each worker's ``--kv-tokens``, in its own tokens.
        prefill_tps: each worker's ``--prefill-tps``, in its own tokens.
        units_ratio: worker tokens per kvgate-sim token of this workload (1 on the kvgate fleet).
    """

    foreign: bool
    kv_tokens: int
    prefill_tps: float
    units_ratio: float = 1.0

    @classmethod
    def scaled(cls, kv_tokens: int, prefill_tps: float, ratio: float) -> WorkerFleet:
        """A foreign fleet as loaded by its workload as the kvgate one of ``kv_tokens``/``prefill_tps``."""
        blocks = max(1, round(kv_tokens * ratio / WORD_BLOCK_SIZE))
        return cls(True, blocks * WORD_BLOCK_SIZE, prefill_tps * ratio, ratio)

    def worker_args(self, decode_tps: float, max_running: int) -> tuple[str, ...]:
        sim = ("--prefill-tps", f"{self.prefill_tps:g}", "--decode-tps", f"{decode_tps:g}")
        mode = ("--foreign",) if self.foreign else ()
        return (*mode, "--kv-tokens", str(self.kv_tokens), *sim, "--max-running", str(max_running))

    def bundle(self) -> TokenizerBundle:
        """How the workers tokenize (the ideal cache counts in their units)."""
        return foreign_bundle(DEFAULT_MODEL) if self.foreign else byte_bundle()

    def describe(self, count: int = 8, announce: bool = True) -> str:
        """One line for the report: ``count`` workers, announcing their capacity (``#kv_tokens=``) or not."""
        if not self.foreign:
            return (
                f"fleet: kvgate ({count} --sim workers, KV events; {self.kv_tokens} tokens of KV and "
                f"{self.prefill_tps:g} prefill tokens/s each)"
            )
        told = f"#kv_tokens={self.kv_tokens}" if announce else "nothing: no capacity announced"
        return (
            f"fleet: foreign ({count} --sim --foreign workers: whitespace-word tokens, no KV events, no "
            f"tokenizer; gateway on default flags + {told}; {self.kv_tokens} words of KV and "
            f"{self.prefill_tps:.0f} prefill words/s each = the kvgate fleet's at "
            f"{self.units_ratio:.3f} words per kvgate token)"
        )


class GuessedPlacement:
    """One gateway replica's view of an event-less fleet, as the live gateway keeps it (for ``route_sim``):
    the approximate index of what was routed, in the gateway's byte blocks, sized per worker by the
    ``CapacityLearner`` from ``#kv_tokens=`` and corrected from the ``cached_tokens`` the workers report.

    Args:
        workers: worker ids.
        kv_tokens: each worker's KV capacity in its own tokens (``#kv_tokens=``).
        block_size: the gateway's block, in bytes.
        engine_block: the engines' block, in their tokens (predictions are rounded down to it).
        clock: simulated time.
    """

    def __init__(
        self,
        workers: Sequence[str],
        kv_tokens: int,
        *,
        block_size: int,
        engine_block: int = WORD_BLOCK_SIZE,
        clock: Callable[[], float],
    ) -> None:
        self.index = ApproximateKVIndex(clock=clock)
        self.units = CapacityLearner(
            self.index, block_size=block_size, config=CapacityConfig(initial_ratio=BYTES_PER_TOKEN)
        )
        self._block_size = block_size
        self._engine_block = engine_block
        for w in workers:
            self.units.set_engine_capacity(w, kv_tokens)

    def hits(self, hashes: Sequence[int], workers: Sequence[str]) -> list[int]:
        """Leading blocks of ``hashes`` assumed cached on each of ``workers``, in order."""
        found = self.index.longest_prefix(hashes, workers)
        return [found[w].gpu_blocks if w in found else 0 for w in workers]

    def predicted(self, worker: str, hit_blocks: int, prompt_tokens: int) -> int:
        """What the gateway predicts ``worker`` reports cached (``Router._cached_tokens``): engine tokens,
        whole engine blocks, never the prompt's last token."""
        tokens = self.units.engine_tokens(worker, min(hit_blocks * self._block_size, prompt_tokens))
        prompt = self.units.engine_tokens(worker, prompt_tokens)
        return max(0, min(tokens, prompt - 1) // self._engine_block * self._engine_block)

    def finished(
        self, worker: str, gateway_tokens: int, engine_tokens: int, predicted: int, reported: int
    ) -> None:
        """A request ended: its usage as the worker reported it."""
        self.units.observe(
            worker, gateway_prompt_tokens=gateway_tokens, engine_prompt_tokens=engine_tokens,
            predicted_tokens=predicted, reported_tokens=reported, tolerance_tokens=self._engine_block,
            learn_capacity=True,
        )  # fmt: skip
