"""On a CUDA device: the tiny engine on the Triton kernels (``select_kernels``) gives the same greedy
tokens as on the CPU torch reference, through chunked prefill, prefix-cache hits and batched decode."""

from __future__ import annotations

import pytest
import torch

from tests.unit.workers.engine.tiny_engine import (
    CPU,
    build_core,
    greedy_request,
    run_to_completion,
    tokens_of,
)
from workers.engine.loader import ModelSource, load_model
from workers.kernels.dispatch import reference_kernels, select_kernels

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _greedy(device: torch.device) -> dict[str, list[int]]:
    kernels = select_kernels(device) if device.type == "cuda" else reference_kernels()
    model = load_model(ModelSource("tiny"), kernels, device=device, dtype=torch.float32)
    core = build_core(model, num_blocks=64, block_size=16, max_batched_tokens=48)
    prompts = [list(range(1, 70)), list(range(1, 40)), [*range(1, 50), 7, 8, 9], [5] * 17]
    for i, prompt in enumerate(prompts):
        core.submit(greedy_request(f"r{i}", prompt, 16))
    return {rid: tokens_of(chunks) for rid, chunks in run_to_completion(core).items()}


def test_cuda_engine_matches_the_cpu_reference() -> None:  # pragma: no cover - CUDA only
    cuda = _greedy(torch.device("cuda"))
    assert select_kernels("cuda").name == "triton"
    assert cuda == _greedy(CPU)
