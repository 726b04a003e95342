"""ASGI type aliases and header access shared by the gateway's and the workers' raw ASGI layers.
Compiled with mypyc (``docs/development.md``: what that rules out).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: ``watch(callback)``: call ``callback`` once when the client leaves (``None``: stop watching); False when
#: it has left already (nothing is then watched)
DisconnectWatch = Callable[[Callable[[], None] | None], bool]


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of a request header (``name`` lower-case), decoded as latin-1."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def disconnect_watch(receive: Receive) -> DisconnectWatch | None:
    """The server's own disconnect signal behind ``receive``, where it offers one, else None.

    kvgate's lean server (``kvgate_core.h1_server``) passes a request's ``receive`` as a method of an object
    with ``watch_disconnect`` (a ``DisconnectWatch``): a caller learns that the client left from a callback
    instead of a task parked on ``receive`` for ``http.disconnect``. A ``receive`` wrapped by a middleware,
    or another server's, has none: the caller watches ``receive`` itself.
    """
    watch: DisconnectWatch | None = getattr(getattr(receive, "__self__", None), "watch_disconnect", None)
    return watch
