"""The sim's bag-of-tokens embeddings."""

from __future__ import annotations

import numpy as np
import pytest

from workers.sim.embedding import sim_embeddings


def test_vectors_are_deterministic_unit_and_order_free() -> None:
    a = sim_embeddings([[1, 2, 3], [3, 2, 1], [1, 2, 4], [900, 800]])
    again = sim_embeddings([[1, 2, 3]])
    assert a.shape == (4, 64) and a.dtype == np.float32
    np.testing.assert_array_equal(a[0], again[0])
    np.testing.assert_allclose(a[0], a[1], atol=1e-6)  # a bag of tokens
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-6)
    assert a[0] @ a[2] > a[0] @ a[3]  # sharing tokens makes vectors closer


def test_the_dimension_is_configurable() -> None:
    assert sim_embeddings([[7]], dim=16).shape == (1, 16)


@pytest.mark.parametrize("ids", [[], [-1]], ids=["empty", "negative"])
def test_bad_inputs_are_refused(ids: list[int]) -> None:
    with pytest.raises(ValueError, match="input"):
        sim_embeddings([ids])
