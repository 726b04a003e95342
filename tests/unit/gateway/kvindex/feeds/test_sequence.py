"""Sequence numbers of a ZMQ publisher (gaps, replayed duplicates, restarts) and the replay reply frames."""

from __future__ import annotations

import pytest

from gateway.kvindex.feeds.sequence import SequenceTracker, Verdict
from gateway.kvindex.feeds.zmq_feed import parse_live, parse_replay_reply


def seq(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


def test_first_in_order_gap_and_restart() -> None:
    t = SequenceTracker()
    assert t.classify_live(7) is Verdict.APPLY  # nothing known before the first batch
    t.applied(7, live=True)
    assert t.classify_live(8) is Verdict.APPLY
    assert t.classify_live(10) is Verdict.GAP
    assert t.classify_live(7) is Verdict.RESTART
    assert t.classify_live(0) is Verdict.RESTART


def test_a_replay_opens_a_window_of_duplicates_that_live_catch_up_closes() -> None:
    t = SequenceTracker()
    t.applied(4, live=True)
    for n in (5, 6, 7):  # replayed after a gap seen at live 7
        assert t.classify_replayed(n) is Verdict.APPLY
        t.applied(n, live=False)
    assert t.classify_replayed(6) is Verdict.DUPLICATE
    assert t.classify_replayed(9) is Verdict.GAP
    assert t.classify_live(7) is Verdict.DUPLICATE
    assert t.classify_live(8) is Verdict.APPLY
    t.applied(8, live=True)
    assert t.classify_live(6) is Verdict.RESTART


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        ([b"", b"kv", seq(3), b"p"], (3, b"p")),  # vLLM 0.32 / SGLang 0.5.23 / TensorRT-LLM: topic frame
        ([b"", b"", seq(3), b"p"], (3, b"p")),  # empty topic
        ([b"", seq(3), b"p"], (3, b"p")),  # older engines: no topic frame
        ([b"", b"", seq(-1), b""], (-1, b"")),  # end marker
        ([b"", seq(-1), b""], (-1, b"")),
        ([b"", b"x", b"short", b"p"], None),
        ([b""], None),
    ],
)
def test_replay_replies_with_or_without_a_topic_frame(frames: list[bytes], expected: object) -> None:
    assert parse_replay_reply(frames) == expected


def test_live_frames() -> None:
    assert parse_live([b"kv", seq(9), b"p"]) == (9, b"p")
    assert parse_live([seq(9), b"p"]) == (9, b"p")
    assert parse_live([b"kv", b"9", b"p"]) is None
