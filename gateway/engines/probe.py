"""The HTTP GET that detection and load scrapes use, and a per-probe memo over it.

The health loop gets its GET injected (``kvgate_core.h1.H1Getter`` in production, a fake in tests). Detection
and the load scrape of one probe often want the same path (``/v1/models``, vLLM's ``/metrics``): ``OnceGet``
asks the server once per path and hands the same answer to both. A new ``OnceGet`` is made for every probe,
so nothing is cached across rounds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson

#: ``await get(base_url, path)`` -> (status, body); raises ``OSError`` or ``TimeoutError`` when it fails
Get = Callable[[str, str], Awaitable[tuple[int, bytes]]]


class OnceGet:
    """A ``Get`` that asks each (base URL, path) once and replays the answer; failures are not remembered."""

    __slots__ = ("_answers", "_get")

    def __init__(self, get: Get) -> None:
        self._get = get
        self._answers: dict[tuple[str, str], tuple[int, bytes]] = {}

    async def __call__(self, base_url: str, path: str) -> tuple[int, bytes]:
        key = (base_url, path)
        answer = self._answers.get(key)
        if answer is None:
            answer = await self._get(base_url, path)
            self._answers[key] = answer
        return answer


def json_of(status: int, body: bytes) -> object:
    """The JSON document of a 200 answer; None for any other status or a body that is not JSON."""
    if status != 200:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
