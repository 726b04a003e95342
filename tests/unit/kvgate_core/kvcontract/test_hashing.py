"""Properties of the chained block hashes (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvgate_core.kvcontract.hashing import Xxh3ChainScheme, as_token_array, chain_hashes, root_hash

TOKENS = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=80)
BLOCK = st.integers(min_value=1, max_value=9)
FAST = settings(max_examples=60, deadline=None)


@FAST
@given(tokens=TOKENS, block_size=BLOCK, root=st.integers(min_value=0, max_value=2**64 - 1))
def test_one_hash_per_full_block_and_lists_equal_arrays(
    tokens: list[int], block_size: int, root: int
) -> None:
    hashes = chain_hashes(tokens, root, block_size)
    assert len(hashes) == len(tokens) // block_size
    assert chain_hashes(np.asarray(tokens, dtype=np.uint64), root, block_size) == hashes
    assert all(0 <= h < 2**64 for h in hashes)


@FAST
@given(tokens=TOKENS, block_size=BLOCK, data=st.data())
def test_continuing_from_start_and_parent_equals_a_full_recompute(
    tokens: list[int], block_size: int, data: st.DataObject
) -> None:
    root = root_hash("m")
    full = chain_hashes(tokens, root, block_size)
    start = data.draw(st.integers(min_value=0, max_value=len(full)))
    parent = full[start - 1] if start else None
    assert chain_hashes(tokens, root, block_size, start=start, parent=parent) == full[start:]


@FAST
@given(tokens=TOKENS.filter(lambda t: len(t) >= 4), block_size=BLOCK, data=st.data())
def test_a_block_hash_depends_on_every_earlier_token(
    tokens: list[int], block_size: int, data: st.DataObject
) -> None:
    root = root_hash("m")
    full = chain_hashes(tokens, root, block_size)
    if not full:
        return
    pos = data.draw(st.integers(min_value=0, max_value=len(full) * block_size - 1))
    changed = list(tokens)
    changed[pos] = (changed[pos] + 1) % 2**32
    other = chain_hashes(changed, root, block_size)
    first = pos // block_size
    assert other[:first] == full[:first]  # blocks before the change are untouched
    assert all(a != b for a, b in zip(other[first:], full[first:], strict=True))  # every later one differs


@FAST
@given(
    tokens=TOKENS.filter(lambda t: len(t) >= 4),
    model=st.text(max_size=8),
    keys=st.lists(st.text(max_size=5), max_size=3),
)
def test_model_and_extra_keys_seed_the_whole_chain(tokens: list[int], model: str, keys: list[str]) -> None:
    a = chain_hashes(tokens, root_hash(model, keys), 4)
    b = chain_hashes(tokens, root_hash(model + "x", keys), 4)
    assert not set(a) & set(b)


def test_extra_keys_are_separated_from_the_model() -> None:
    assert root_hash("a", ["b"]) != root_hash("ab")
    assert root_hash("a", ["b", "c"]) != root_hash("a", ["bc"])
    assert root_hash("m", []) == root_hash("m")


@pytest.mark.parametrize("bad", [[-1], [2**32]], ids=["negative", "too-big"])
def test_token_ids_outside_uint32_are_rejected(bad: list[int]) -> None:
    with pytest.raises(ValueError, match="token ids"):
        as_token_array(bad)


def test_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="block_size"):
        chain_hashes([1, 2], 0, 0)
    with pytest.raises(ValueError, match="parent"):
        chain_hashes([1, 2], 0, 1, start=1)
    with pytest.raises(ValueError, match="block_size"):
        Xxh3ChainScheme(0)


def test_scheme_object_matches_the_functions() -> None:
    scheme = Xxh3ChainScheme(4)
    root = scheme.root("m", ["lora:x"])
    assert root == root_hash("m", ["lora:x"])
    assert scheme.block_hashes(list(range(10)), root) == chain_hashes(list(range(10)), root, 4)
