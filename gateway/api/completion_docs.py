"""The OpenAPI description of the two raw completion routes, written once, here.

``POST /v1/chat/completions`` and ``POST /v1/completions`` stay raw ASGI (``openai_routes``), so FastAPI
cannot see their bodies; ``add_completion_docs`` adds their path items, and the schemas of the models
below, to the document FastAPI generates. The models are documentation only: the gateway never parses a
request with them (``gateway.openai.schema`` checks the few fields it acts on, and every other field
passes through to the worker untouched, hence ``extra="allow"``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from gateway.api.models import ErrorResponse

_REF = "#/components/schemas/{model}"
TokenIds = list[Annotated[int, Field(ge=0)]]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChatMessage(_Open):
    role: str = Field(description="system, user, assistant, tool or developer")
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class StreamOptions(_Open):
    include_usage: bool | None = None


class _Sampling(_Open):
    model: str = Field(min_length=1, description="one of GET /v1/models")
    max_tokens: int | None = Field(default=None, ge=1, description="at most the gateway's --max-tokens-limit")
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    n: int | None = Field(default=None, ge=1, le=128)
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, description="also the session key for session affinity")


class ChatCompletionRequest(_Sampling):
    """An OpenAI chat completion request; unknown fields reach the worker untouched."""

    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(_Sampling):
    """An OpenAI (legacy) completion request; unknown fields reach the worker untouched."""

    prompt: str | list[str] | TokenIds | list[Annotated[TokenIds, Field(min_length=1)]]


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatChoice(_Open):
    index: int
    message: ChatMessage
    finish_reason: str | None = None


class ChatCompletion(_Open):
    """The worker's reply, relayed as is (``stream: true`` relays its SSE stream instead)."""

    id: str
    object: Literal["chat.completion"]
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class TextChoice(_Open):
    index: int
    text: str
    finish_reason: str | None = None


class Completion(_Open):
    """The worker's reply, relayed as is (``stream: true`` relays its SSE stream instead)."""

    id: str
    object: Literal["text_completion"]
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


COMPLETION_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "application/json": {"schema": {"oneOf": [_ref(ChatCompletionRequest), _ref(CompletionRequest)]}}
    },
}
"""``POST /admin/route``'s body: either completion request (it is checked as the route would check it)."""

_ERROR = {
    "description": "OpenAI's error shape",
    "content": {"application/json": {"schema": _ref(ErrorResponse)}},
}
_HEADERS = {
    "x-kvgate-worker": {"description": "the worker that served the request", "schema": {"type": "string"}},
    "x-kvgate-prefix-hit": {
        "description": "prompt tokens predicted to be cached on that worker",
        "schema": {"type": "integer"},
    },
}


def _operation(
    operation_id: str, summary: str, request: type[BaseModel], reply: type[BaseModel]
) -> dict[str, Any]:
    return {
        "post": {
            "tags": ["openai"],
            "operationId": operation_id,
            "summary": summary,
            "description": "Routed to the worker most likely to hold the prompt's KV cache, then proxied.",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {
                "200": {
                    "description": "the completion; an SSE stream of chunks when `stream` is true",
                    "headers": _HEADERS,
                    "content": {
                        "application/json": {"schema": _ref(reply)},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                "4XX": _ERROR,
                "5XX": _ERROR,
            },
        }
    }


def add_completion_docs(document: dict[str, Any]) -> None:
    """Add the completion routes (first) and the schemas they and ``COMPLETION_BODY`` refer to."""
    completions = {
        "/v1/chat/completions": _operation(
            "createChatCompletion", "Create a chat completion", ChatCompletionRequest, ChatCompletion
        ),
        "/v1/completions": _operation(
            "createCompletion", "Create a completion", CompletionRequest, Completion
        ),
    }
    document["paths"] = {**completions, **document["paths"]}
    models: list[type[BaseModel]] = [
        ChatCompletionRequest,
        CompletionRequest,
        ChatCompletion,
        Completion,
        ErrorResponse,
    ]
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in top.get("$defs", {}).items():
        schemas.setdefault(name, schema)
