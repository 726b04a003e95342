"""The identity of a non-text content part (image, audio, video, file) in a prompt's hashed text.

A chat message's content may be a list of parts. Text parts are joined as they are; every other part is
replaced, where it stands, by a marker naming its identity: ``<|media:{kind}:{16 hex digits}|>``, the hex
being xxh3_64 of what identifies the part (its URL, its inline data, or its file id). The marker is then
tokenized and hashed with the text around it, so the identity is folded into every block hash from the
part's position on: two prompts with the same text and different images share their blocks up to the
image and none after it, and the same image in the same place hashes the same everywhere.

The gateway and kvgate's simulated worker both render parts this way (through ``normalize_messages``), so
the worker's KV events name the same blocks the gateway predicts. A foreign engine expands an image into its
own placeholder tokens instead; its text blocks before the image still match, and the adapters leave its
multimodal blocks out of the index (``gateway.kvindex.feeds.namespace``), so no false hit is claimed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import xxhash

#: content-part types that carry text (chat and Responses API spellings)
TEXT_PART_TYPES: Final = frozenset({"text", "input_text", "output_text"})
#: content-part types that carry media, and the kind each is hashed as
MEDIA_PART_TYPES: Final = {
    "image_url": "image",
    "input_image": "image",
    "image": "image",
    "input_audio": "audio",
    "audio_url": "audio",
    "video_url": "video",
    "file": "file",
    "input_file": "file",
}
#: where each media part keeps what identifies it (the first present one is used)
_IDENTITY_FIELDS: Final = ("image_url", "audio_url", "video_url", "input_audio", "file", "url", "file_id",
                           "file_data", "data", "file_url", "uuid")  # fmt: skip


def media_kind(part: Mapping[str, Any]) -> str | None:
    """``image``, ``audio``, ``video`` or ``file`` for a media part; None for any other part."""
    kind = part.get("type")
    return MEDIA_PART_TYPES.get(kind) if isinstance(kind, str) else None


def _identity_value(value: Any) -> Any:
    """The identifying value of one field: a URL string stays a string; an object yields its url/data."""
    if isinstance(value, Mapping):
        for key in ("url", "data", "file_id", "file_data"):
            inner = value.get(key)
            if isinstance(inner, str) and inner:
                return inner
    return value


def media_identity(part: Mapping[str, Any]) -> str:
    """16 hex digits naming a media part by what it points at (URL, inline bytes, or file id).

    Raises:
        ValueError: the part names nothing to identify it by (client-facing message).
    """
    for key in _IDENTITY_FIELDS:
        value = _identity_value(part.get(key))
        if isinstance(value, str) and value:
            return f"{xxhash.xxh3_64_intdigest(value.encode('utf-8')):016x}"
    raise ValueError(f"a '{part.get('type')}' content part must carry a URL, data or a file id")


def media_marker(part: Mapping[str, Any]) -> str:
    """The text that stands for a media part in the rendered prompt (see the module docstring).

    Raises:
        ValueError: as ``media_identity``; or the part is not a media part.
    """
    kind = media_kind(part)
    if kind is None:
        raise ValueError(f"unsupported content part type {part.get('type')!r}")
    return f"<|media:{kind}:{media_identity(part)}|>"


def contains_media(messages: object) -> bool:
    """Whether any message of a chat ``messages`` list has a media content part."""
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(isinstance(p, Mapping) and media_kind(p) for p in content):
            return True
    return False
