"""The simulated worker's embeddings: deterministic bag-of-tokens vectors, with no model.

Every token id maps to a fixed pseudo-random vector (splitmix64 of ``id * dim + j``, uniform in [-1, 1));
an input's embedding is the mean of its tokens' vectors, L2-normalised. The same tokens always give the
same vector, and inputs sharing many tokens point in similar directions, which is all a simulated
client needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from workers.engine_api import Embeddings

SIM_EMBEDDING_DIM: Final = 64

_GAMMA: Final = np.uint64(0x9E3779B97F4A7C15)
_MIX1: Final = np.uint64(0xBF58476D1CE4E5B9)
_MIX2: Final = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    z = x + _GAMMA  # uint64 arithmetic wraps, as splitmix64 wants
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    out: npt.NDArray[np.uint64] = z ^ (z >> np.uint64(31))
    return out


def sim_embeddings(inputs: Sequence[Sequence[int]], dim: int = SIM_EMBEDDING_DIM) -> Embeddings:
    """``[len(inputs), dim]`` float32 rows of unit norm (see the module docstring).

    Raises:
        ValueError: an empty input or a negative token id.
    """
    rows = np.empty((len(inputs), dim), dtype=np.float32)
    columns = np.arange(dim, dtype=np.uint64)[None, :]
    for i, ids in enumerate(inputs):
        if not ids or min(ids) < 0:
            raise ValueError(f"input[{i}] must be a non-empty list of non-negative token ids")
        keys = np.asarray(ids, dtype=np.uint64)[:, None] * np.uint64(dim) + columns
        unit = (_splitmix64(keys) >> np.uint64(11)).astype(np.float64) * 2.0**-52 - 1.0
        pooled = unit.mean(axis=0)
        rows[i] = pooled / max(float(np.linalg.norm(pooled)), 1e-12)
    return rows
