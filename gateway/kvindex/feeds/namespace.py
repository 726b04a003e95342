"""The cache namespace of an engine's stored blocks, named the way the gateway names a request's.

The gateway hashes a request from ``root_hash(model, extra_keys(lora=, cache_salt=, extra_key=, tenant=))``
(``gateway.analyze.prompt``). An engine's ``BlockStored`` says which namespace its blocks live in:

- LoRA: ``lora_name`` (vLLM, SGLang). vLLM selects an adapter through the request's ``model`` field, so the
  gateway's root for such a request is ``root_hash(adapter)``: with ``lora_in_model`` the adapter name
  replaces the model in the root; otherwise it is the labelled ``lora:`` key (kvgate's ``lora`` body field).
  A ``lora_id`` without a name cannot be named: such blocks are not indexed.
- cache salt: SGLang's ``cache_salt`` field, or vLLM's ``extra_keys`` of a chain's first block (vLLM
  publishes them untagged: the LoRA name first, then ``(mm_identifier, offset)`` pairs, the salt string,
  prompt-embeds digests). Both become the ``salt:`` key, as a request's ``cache_salt`` does.
- multimodal content (vLLM ``(mm_identifier, offset)`` extra keys or prompt-embeds digests, TensorRT-LLM
  ``mm_keys`` or string token ids): the gateway hashes token ids only, so a block holding such content, and
  every block after it, is not indexed (matching images by their hashes would need the request side to
  hash the same identifiers: left for later).

SGLang's ``extra_key`` is not in its events, so blocks stored under one are indexed in the plain namespace;
a request carrying an ``extra_key`` hashes under ``extra:`` and never matches them (no false hit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from gateway.kvindex.feeds.decode import BlockStored
from kvgate_core.kvcontract.extra_keys import extra_keys
from kvgate_core.kvcontract.hashing import root_hash

_MAX_TOKEN: Final = 0xFFFFFFFF


def chain_root(event: BlockStored, *, model: str, lora_in_model: bool) -> int | None:
    """The root hash of a parent-less ``event``'s chain; None when its namespace cannot be named."""
    lora = event.lora_name
    if lora is None and event.lora_id is not None:
        return None
    salt = event.cache_salt or _first_block_salt(event)
    if lora_in_model and lora:
        return root_hash(lora, extra_keys(cache_salt=salt))
    return root_hash(model, extra_keys(lora=lora, cache_salt=salt))


def indexable_prefix(event: BlockStored, *, is_root: bool) -> tuple[int, str | None]:
    """How many leading engine blocks of ``event`` hold plain tokens, and why the rest do not.

    Args:
        event: the stored blocks.
        is_root: the event starts a chain (its first block may carry vLLM's cache salt).
    """
    size = event.block_size
    for i in range(len(event.block_hashes)):
        if not _plain_tokens(event.token_ids[i * size : (i + 1) * size]):
            return i, "non-integer or out-of-range token ids"
        if event.mm_keys is not None and i < len(event.mm_keys) and event.mm_keys[i]:
            return i, "multimodal block (mm_keys)"
        extras = event.extra_keys[i] if event.extra_keys is not None and i < len(event.extra_keys) else None
        if not _plain_extras(extras, event.lora_name, may_salt=is_root and i == 0):
            return i, "multimodal or prompt-embeds block (extra_keys)"
    return len(event.block_hashes), None


def _plain_tokens(tokens: Sequence[int | str]) -> bool:
    return all(type(t) is int and 0 <= t <= _MAX_TOKEN for t in tokens)


def _plain_extras(entry: Any, lora: str | None, *, may_salt: bool) -> bool:
    rest = _without_lora(entry, lora)
    if not rest:
        return True
    return may_salt and len(rest) == 1 and isinstance(rest[0], str)


def _first_block_salt(event: BlockStored) -> str | None:
    if not event.extra_keys:
        return None
    rest = _without_lora(event.extra_keys[0], event.lora_name)
    return rest[0] if len(rest) == 1 and isinstance(rest[0], str) else None


def _without_lora(entry: Any, lora: str | None) -> list[Any]:
    if entry is None:
        return []
    items = list(entry) if isinstance(entry, list | tuple) else [entry]
    if lora is not None and items and items[0] == lora:
        return items[1:]
    return items
