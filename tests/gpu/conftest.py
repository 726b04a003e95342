"""GPU tests: every test here is skipped unless torch sees a CUDA device (and triton imports)."""

from __future__ import annotations

import importlib.util

import pytest


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


@pytest.fixture(autouse=True)
def _require_cuda() -> None:
    if not _cuda_available():
        pytest.skip("needs a CUDA device with torch and triton")
