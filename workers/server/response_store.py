"""``ResponseStore``: the finished Responses API objects a worker keeps, for retrieval and continuation.

A stored entry holds the Response object as it was answered and the whole conversation behind it (every
input item of the chain, then the assistant's output), so a request naming it as ``previous_response_id``
renders that conversation before its own input. The store is bounded by count (least recently used first
out) and by age (an entry expires ``ttl_s`` after it was stored). It lives in one worker's memory: a
restart forgets it, and another worker never sees it. It is used from the server's event loop only.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

DEFAULT_MAX_RESPONSES: Final = 1024
DEFAULT_TTL_S: Final = 3600.0


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One finished response: the object answered, and the conversation a continuation renders."""

    response: Mapping[str, Any]
    conversation: tuple[Mapping[str, Any], ...]


class ResponseStore:
    """A bounded LRU of ``StoredResponse`` by response id, with a time to live.

    Args:
        max_entries: most responses kept (0: keep none; ``store: true`` is then accepted but forgotten).
        ttl_s: seconds an entry lives after it was stored.
        clock: monotonic seconds (injected by tests).
    """

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_RESPONSES,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 0 or ttl_s <= 0:
            raise ValueError("the response store needs max_entries >= 0 and a positive ttl_s")
        self._max = max_entries
        self._ttl = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        """Store (or replace) an entry, evicting the least recently used beyond ``max_entries``."""
        if self._max == 0:
            return
        self._entries[response_id] = (self._clock() + self._ttl, entry)
        self._entries.move_to_end(response_id)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        """The live entry (marking it recently used), or None when unknown or expired."""
        item = self._entries.get(response_id)
        if item is None:
            return None
        expires, entry = item
        if self._clock() >= expires:
            del self._entries[response_id]
            return None
        self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        """Forget an entry; whether a live one was there."""
        live = self.get(response_id) is not None
        self._entries.pop(response_id, None)
        return live
