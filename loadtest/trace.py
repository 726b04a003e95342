"""Mooncake-format trace replay: JSONL lines of ``timestamp`` (ms), ``input_length``, ``output_length``
and ``hash_ids`` (one id per ``block_tokens``-token block; equal ids mean the same reusable prefix block).

A trace carries no text, so each hash id is turned into ``block_tokens`` token ids drawn from a generator
seeded by the id: two requests share a block's tokens exactly when they share its id, and the last block
holds the remainder of ``input_length``. Prompts go to ``/v1/completions`` as token-id lists.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import orjson

from loadtest.workloads import Session, WorkRequest

#: the Mooncake conversation trace, shipped with the repository (``loadtest/data/README.md``)
MOONCAKE_TRACE: Final = Path(__file__).resolve().parent / "data" / "mooncake_conversation.jsonl.gz"


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """How to replay: time compression, size scaling, and what vocabulary the token ids come from.

    ``scale`` divides every length (input, output and the block size) so a big production trace fits a
    small simulated fleet while keeping its reuse structure.
    """

    model: str = "kvgate-sim"
    speedup: float = 1.0
    block_tokens: int = 512
    scale: int = 1
    vocab_size: int = 250
    max_output_tokens: int | None = None
    limit: int | None = None
    #: spread each run of same-instant arrivals (the trace's timestamps sit on a coarse grid) evenly over
    #: this window, in order: live, such a burst reaches a gateway over some milliseconds, not at once
    burst_spread_ms: float = 0.0


def read_trace(path: str | Path, limit: int | None = None) -> Iterator[TraceRecord]:
    """Parse a Mooncake JSONL trace, gzipped when its name ends in ``.gz`` (blank lines skipped).

    Raises:
        ValueError: a line is not a valid record (its line number is in the message).
    """
    with gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb") as fh:
        count = 0
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
                rec = TraceRecord(
                    int(obj["timestamp"]),
                    int(obj["input_length"]),
                    int(obj["output_length"]),
                    tuple(int(h) for h in obj["hash_ids"]),
                )
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: not a Mooncake trace record: {exc}") from exc
            yield rec
            count += 1
            if limit is not None and count >= limit:
                return


def block_tokens_for(hash_id: int, n: int, vocab_size: int) -> np.ndarray:
    """The ``n`` token ids standing for trace block ``hash_id`` (deterministic in the id alone)."""
    return np.random.default_rng(hash_id).integers(0, vocab_size, size=n, dtype=np.uint32)


def prompt_tokens(rec: TraceRecord, opts: TraceOptions) -> np.ndarray:
    """Token ids whose ``block`` -sized blocks are equal exactly when their hash ids are."""
    block = max(1, opts.block_tokens // opts.scale)
    length = max(1, rec.input_length // opts.scale)
    parts = []
    remaining = length
    for hid in rec.hash_ids:
        if remaining <= 0:
            break
        take = min(block, remaining)
        # A block shorter than ``block`` is a prefix of the full block of the same id: still consistent.
        parts.append(block_tokens_for(hid, block, opts.vocab_size)[:take])
        remaining -= take
    if remaining > 0:  # more input than hash ids cover: unique filler
        parts.append(block_tokens_for(2**40 + rec.timestamp_ms * 131 + length, remaining, opts.vocab_size))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)


def spread_bursts(arrivals: list[float], window_s: float) -> list[float]:
    """``arrivals`` (sorted) with each run of equal times spread evenly over ``window_s``, in order: a run of
    ``k`` gets offsets ``0, window/k, 2·window/k, …``."""
    out = list(arrivals)
    start = 0
    while start < len(out):
        end = start
        while end + 1 < len(out) and arrivals[end + 1] == arrivals[start]:
            end += 1
        k = end - start + 1
        for j in range(k):
            out[start + j] = arrivals[start] + j * window_s / k
        start = end + 1
    return out


def trace_sessions(path: str | Path, opts: TraceOptions) -> list[Session]:
    """One single-request session per record, arriving at ``timestamp / speedup`` (bursts spread over
    ``opts.burst_spread_ms``)."""
    records = list(read_trace(path, opts.limit))
    arrivals = [rec.timestamp_ms / 1000.0 / opts.speedup for rec in records]
    if opts.burst_spread_ms > 0:
        arrivals = spread_bursts(arrivals, opts.burst_spread_ms / 1000.0)
    sessions = []
    for i, rec in enumerate(records):
        out = max(1, rec.output_length // opts.scale)
        if opts.max_output_tokens is not None:
            out = min(out, opts.max_output_tokens)
        body: dict[str, Any] = {
            "model": opts.model,
            "prompt": prompt_tokens(rec, opts),  # numpy: serialised by orjson at send time
            "max_tokens": out,
            "ignore_eos": True,
        }
        sessions.append(
            Session(
                f"trace-{i}",
                (WorkRequest("completions", body),),
                arrival_s=arrivals[i],
            )
        )
    return sessions
