"""How a parsed OpenAI request travels: its ``Route`` (how it is placed, where it goes upstream, how its
stream ends). ``gateway.openai.schema`` builds the ``ParsedRequest`` that carries it.

Kept apart from the parser, interpreted: the routes are a handful of constants built at import, and an enum
and frozen dataclasses are what the rest of the gateway compares and prints them as.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

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
