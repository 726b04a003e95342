"""The routed-prediction entries replicas share: their wire shape, old and new."""

from __future__ import annotations

import orjson
import pytest

from gateway.kvindex.backplane.shared_predictions import decode_routed, encode_routed
from kvgate_core.kvcontract.events import EventDecodeError


def test_an_entry_carries_when_its_oldest_item_was_queued() -> None:
    data = encode_routed("r1", [("w1", (1, 2)), ("w2", (3,))], queued_at=1733.5)
    assert decode_routed(data) == ("r1", [("w1", (1, 2)), ("w2", (3,))], 1733.5)


def test_an_entry_of_an_older_replica_has_no_time() -> None:
    assert decode_routed(encode_routed("r1", [("w1", (1,))])) == ("r1", [("w1", (1,))], None)
    assert b'"t"' not in encode_routed("r1", [])


@pytest.mark.parametrize(
    "body",
    [
        {"r": "r1", "p": [], "t": "soon"},
        {"r": "r1", "p": [], "t": True},
        {"r": "r1", "p": [], "t": [1]},
        {"r": 1, "p": []},
        {"p": []},
        {"r": "r1", "p": [["w1", ["x"]]]},
        ["r1"],
    ],
)
def test_a_malformed_entry_is_refused(body: object) -> None:
    with pytest.raises(EventDecodeError):
        decode_routed(orjson.dumps(body))
