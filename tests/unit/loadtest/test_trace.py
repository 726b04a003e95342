from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from loadtest.trace import MOONCAKE_TRACE, TraceOptions, prompt_tokens, read_trace, trace_sessions


def _write(tmp_path: Path, records: list[dict]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    return path


def test_blocks_are_identical_exactly_when_hash_ids_are(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]},
            {"timestamp": 10, "input_length": 36, "output_length": 5, "hash_ids": [1, 2, 9]},
        ],
    )
    opts = TraceOptions(block_tokens=16)
    a, b = (prompt_tokens(r, opts) for r in read_trace(path))
    assert len(a) == 40 and len(b) == 36
    assert np.array_equal(a[:32], b[:32])  # blocks 1, 2 shared
    assert not np.array_equal(a[32:36], b[32:36])  # block 3 vs 9 differ
    assert not np.array_equal(a[:16], a[16:32])


def test_sessions_arrive_at_scaled_timestamps(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 20, "output_length": 7, "hash_ids": [1, 2]},
            {"timestamp": 3000, "input_length": 20, "output_length": 700, "hash_ids": [1, 3]},
        ],
    )
    sessions = trace_sessions(path, TraceOptions(block_tokens=16, speedup=2.0, max_output_tokens=50))
    assert [s.arrival_s for s in sessions] == [0.0, 1.5]
    assert [s.requests[0].body["max_tokens"] for s in sessions] == [7, 50]
    assert sessions[0].requests[0].endpoint == "completions"


def test_scale_shrinks_lengths_but_keeps_sharing(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1024, "output_length": 8, "hash_ids": [5, 6]},
            {"timestamp": 0, "input_length": 1000, "output_length": 8, "hash_ids": [5, 7]},
        ],
    )
    opts = TraceOptions(block_tokens=512, scale=8)
    a, b = (prompt_tokens(r, opts) for r in read_trace(path))
    assert len(a) == 128 and len(b) == 125
    assert np.array_equal(a[:64], b[:64]) and not np.array_equal(a[64:125], b[64:125])


def test_bad_line_names_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n{"oops": 1}\n')
    with pytest.raises(ValueError, match=":2:"):
        list(read_trace(path))


def test_real_trace_prefix_reuse_survives_conversion() -> None:
    recs = list(read_trace(MOONCAKE_TRACE, limit=200))
    opts = TraceOptions(scale=8)
    by_first: dict[int, np.ndarray] = {}
    for rec in recs:
        toks = prompt_tokens(rec, opts)
        assert len(toks) == rec.input_length // 8
        first = toks[:64]
        if rec.hash_ids[0] in by_first:
            assert np.array_equal(
                by_first[rec.hash_ids[0]][: len(first)], first[: len(by_first[rec.hash_ids[0]])]
            )
        by_first.setdefault(rec.hash_ids[0], first)


def test_bursts_spread_evenly_over_the_window_in_order() -> None:
    from loadtest.trace import spread_bursts

    out = spread_bursts([0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 2.0], 0.01)
    assert out == pytest.approx([0.0, 0.0025, 0.005, 0.0075, 1.0, 2.0, 2.005])
    assert spread_bursts([], 0.01) == []
