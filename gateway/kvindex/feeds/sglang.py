"""SGLang's KV events: the same wire format as vLLM's, decoded by ``decode.decode_batch`` (kept name).

SGLang's pages (``--page-size``, often 1) need not equal the gateway's block: ``rechunk.py`` accumulates
them into full kvgate blocks. Its ``cache_salt`` field is folded into the hash root (``namespace.py``).
"""

from __future__ import annotations

from gateway.kvindex.feeds.decode import EngineEvent, decode_batch


def decode_sglang_batch(payload: bytes) -> list[EngineEvent]:
    """Decode one SGLang msgpack ``KVEventBatch`` (positional or tagged-map)."""
    return decode_batch(payload)
