"""The KV feed's SSE splitter: payloads whole however the bytes arrive."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from gateway.kvindex.feeds.kvgate import parse_event_payload, sse_data
from kvgate_core.kvcontract.events import EventType

STREAM = (
    b": keep-alive\n\n"
    b'event: kv\ndata: [{"type": "removed", "worker": "w", "hashes": [1]}]\n\n'
    b'data: {"type": "cleared",\r\ndata:  "worker": "w"}\r\n\r\n'
    b"id: 7\n\n"
    b'data: {"type": "cleared", "worker": "w2"}'  # the stream ends without a blank line
)
PAYLOADS = [
    b'[{"type": "removed", "worker": "w", "hashes": [1]}]',
    b'{"type": "cleared",\n "worker": "w"}',
    b'{"type": "cleared", "worker": "w2"}',
]


async def _chunks(parts: Sequence[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.mark.parametrize("size", [1, 2, 7, 64, len(STREAM)])
async def test_payloads_come_out_whole_whatever_the_chunking(size: int) -> None:
    parts = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    got = [p async for p in sse_data(_chunks(parts))]
    assert got == PAYLOADS
    events = [e for p in got for e in parse_event_payload(p)]
    assert [(e.worker, e.type, e.hashes) for e in events] == [
        ("w", EventType.REMOVED, (1,)),
        ("w", EventType.CLEARED, ()),
        ("w2", EventType.CLEARED, ()),
    ]
