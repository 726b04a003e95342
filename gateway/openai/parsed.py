"""The values a parsed OpenAI request travels as: its ``Route`` (how it is placed, where it goes upstream, how
its stream ends) and the ``ParsedRequest`` ``gateway.openai.schema`` builds from its body.

Kept apart from the parser because the parser is compiled (``kvgate_core.native``) and a frozen dataclass
defined in a compiled module is built through its interpreted ``__init__``; here ``fast_constructor`` can
build a ``ParsedRequest`` per request cheaply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from kvgate_core.tokenize.request_prompt import Endpoint


class Framing(Enum):
    """How a streamed answer ends, and so how the relay tells a finished stream from a broken one."""

    DONE = "done"  # chat and completions: ``data: [DONE]``
    RESPONSES = "responses"  # the Responses API: a ``response.completed|incomplete|failed`` event, no [DONE]
    EOF = "eof"  # anything else: the upstream's clean end of the body


@dataclass(frozen=True, slots=True)
class Route:
    """One OpenAI route as the gateway serves it.

    Attributes:
        path: the path the request goes to upstream (the client's own path).
        label: the ``route`` label of the request metrics.
        endpoint: how its prompt is parsed for cache-aware routing; None: placed by load alone.
        framing: how its stream ends.
    """

    path: bytes
    label: str
    endpoint: Endpoint | None
    framing: Framing = Framing.DONE


CHAT_ROUTE: Final = Route(b"/v1/chat/completions", "chat", Endpoint.CHAT)
COMPLETIONS_ROUTE: Final = Route(b"/v1/completions", "completions", Endpoint.COMPLETIONS)
RESPONSES_ROUTE: Final = Route(b"/v1/responses", "responses", Endpoint.RESPONSES, Framing.RESPONSES)
PROMPT_ROUTES: Final = {Endpoint.CHAT: CHAT_ROUTE, Endpoint.COMPLETIONS: COMPLETIONS_ROUTE,
                        Endpoint.RESPONSES: RESPONSES_ROUTE}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """The fields of a request body the gateway acts on, with the whole parsed body.

    ``endpoint`` is None on a load-balanced route (no prompt to hash); ``model`` is then "" when the body
    named none. ``previous_response_id``: a Responses API request continuing a response stored on the
    worker that created it (the gateway sends it there).
    """

    body: Mapping[str, Any]
    endpoint: Endpoint | None
    model: str
    stream: bool
    max_tokens: int | None
    session_id: str | None
    route: Route = CHAT_ROUTE
    previous_response_id: str | None = None
