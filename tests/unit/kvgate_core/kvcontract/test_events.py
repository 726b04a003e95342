from __future__ import annotations

import pytest

from kvgate_core.kvcontract.events import (
    EventDecodeError,
    EventType,
    KVEvent,
    Tier,
    decode_event,
    encode_event,
    encode_events,
    event_from_dict,
)

EVENT = KVEvent("w1", EventType.STORED, Tier.DRAM, (0, 2**64 - 1), 12.5)


def test_round_trip() -> None:
    assert decode_event(encode_event(EVENT)) == EVENT
    assert decode_event(encode_event(EVENT).decode()) == EVENT


def test_wire_shape() -> None:
    assert EVENT.to_dict() == {
        "worker": "w1",
        "type": "stored",
        "tier": "dram",
        "hashes": [0, 2**64 - 1],
        "ts": 12.5,
    }


def test_defaults_for_optional_fields() -> None:
    assert event_from_dict({"worker": "w", "type": "cleared"}) == KVEvent(
        "w", EventType.CLEARED, Tier.GPU, (), 0.0
    )


def test_batch_encoding() -> None:
    import orjson

    assert [event_from_dict(o) for o in orjson.loads(encode_events([EVENT, EVENT]))] == [EVENT, EVENT]


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[]",
        b'{"type": "stored"}',
        b'{"worker": "w", "type": "eaten"}',
        b'{"worker": "w", "type": "stored", "tier": "tape"}',
        b'{"worker": 1, "type": "stored"}',
        b'{"worker": "w", "type": "stored", "hashes": [-1]}',
        b'{"worker": "w", "type": "stored", "hashes": [18446744073709551616]}',
        b'{"worker": "w", "type": "stored", "hashes": "12"}',
        b'{"worker": "w", "type": "stored", "hashes": [1, true]}',
        b'{"worker": "w", "type": "stored", "hashes": [1, 2.0]}',
        b'{"worker": "w", "type": "stored", "hashes": [1, null]}',
        b'{"worker": "w", "type": ["stored"]}',
        b'{"worker": "w", "type": "stored", "tier": {"gpu": 1}}',
        b'{"worker": "w", "type": "stored", "ts": "soon"}',
    ],
    ids=[
        "json",
        "array",
        "no-worker",
        "type",
        "tier",
        "worker-type",
        "negative",
        "too-big",
        "hashes-type",
        "bool-hash",
        "float-hash",
        "null-hash",
        "unhashable-type",
        "unhashable-tier",
        "ts",
    ],
)
def test_bad_payloads_are_rejected(payload: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode_event(payload)


def test_decoded_events_equal_their_constructed_form() -> None:
    hashes = [0, 1, 2**64 - 1, 12345678901234567890]
    for etype in EventType:
        for tier in Tier:
            obj = {"worker": "w", "type": etype.value, "tier": tier.value, "hashes": hashes, "ts": 2}
            event = event_from_dict(obj)
            assert event == KVEvent("w", etype, tier, tuple(hashes), 2.0)
            assert type(event) is KVEvent and type(event.type) is EventType and type(event.ts) is float
    assert event_from_dict({"worker": "w", "type": "cleared"}) == KVEvent("w", EventType.CLEARED)
