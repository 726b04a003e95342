"""Child process of ``test_triton_engine``: the tiny engine with the Triton kernels (run under
``TRITON_INTERPRET=1``) and with the torch reference; prints each one's greedy tokens as JSON."""

from __future__ import annotations

import json

import torch

from tests.unit.workers.engine.tiny_engine import (
    CPU,
    build_core,
    greedy_request,
    run_to_completion,
    tokens_of,
)
from workers.engine.loader import ModelSource, load_model
from workers.kernels.dispatch import Kernels, reference_kernels, triton_kernels


def greedy_tokens(kernels: Kernels) -> dict[str, list[int]]:
    model = load_model(ModelSource("tiny"), kernels, device=CPU, dtype=torch.float32)
    # A 4-token block and an 8-token budget: chunked prefill over a cached prefix, then batched decode.
    core = build_core(model, block_size=4, max_batched_tokens=8)
    core.submit(greedy_request("a", list(range(30, 43)), 3))
    core.submit(greedy_request("b", list(range(30, 40)), 3))
    return {rid: tokens_of(chunks) for rid, chunks in run_to_completion(core).items()}


if __name__ == "__main__":
    print(
        json.dumps(
            {"triton": greedy_tokens(triton_kernels()), "reference": greedy_tokens(reference_kernels())}
        )
    )
