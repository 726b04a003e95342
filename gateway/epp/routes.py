"""Which gateway route a request path is: the prompt routes are routed cache-aware, the rest by load."""

from __future__ import annotations

from typing import Final

from gateway.openai.schema import PROMPT_ROUTES, Framing, Route
from kvgate_core.tokenize.request_prompt import Endpoint

_PROMPT_PATHS: Final = {route.path.decode(): endpoint for endpoint, route in PROMPT_ROUTES.items()}


def prompt_endpoint(path: str) -> Endpoint | None:
    """The OpenAI endpoint whose prompt a ``POST path`` carries (query string ignored), else None."""
    return _PROMPT_PATHS.get(path.partition("?")[0].rstrip("/"))


def other_route(path: str) -> Route:
    """The route of a path the picker places by load alone (embeddings, ``GET /v1/models``, anything)."""
    clean = path.partition("?")[0]
    return Route(clean.encode("latin-1"), "other", None, Framing.EOF)


__all__ = ["Endpoint", "other_route", "prompt_endpoint"]
