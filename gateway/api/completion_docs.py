"""The OpenAPI description of the raw OpenAI routes, written once, here.

The routes that reach workers (chat, completions, the Responses API, embeddings, the pass-through routes of
``gateway.openai.routes``) stay raw ASGI (``openai_routes``), so FastAPI cannot see their bodies;
``add_completion_docs`` adds their path items, and the schemas of the models below, to the document FastAPI
generates. The models are documentation only: the gateway never parses a
request with them (``gateway.openai.schema`` checks the few fields it acts on, and every other field
passes through to the worker untouched, hence ``extra="allow"``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from gateway.api.models import ErrorResponse
from gateway.openai.routes import PASS_THROUGH

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


class ResponsesRequest(_Open):
    """An OpenAI Responses API request; unknown fields reach the worker untouched."""

    model: str = Field(min_length=1, description="one of GET /v1/models")
    input: str | list[dict[str, Any]] = Field(description="a string, or message / function-call items")
    instructions: str | None = None
    previous_response_id: str | None = Field(
        default=None, description="continue a stored response: sent to the worker that stored it"
    )
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: bool | None = None
    store: bool | None = None
    tools: list[dict[str, Any]] | None = None
    user: str | None = None


class ResponseObject(_Open):
    """A response object, relayed as the worker answered (``stream: true`` relays its event stream)."""

    id: str
    object: Literal["response"]
    status: str | None = None
    model: str | None = None
    output: list[dict[str, Any]] = Field(default_factory=list)
    usage: dict[str, Any] | None = None


class EmbeddingsRequest(_Open):
    """An OpenAI embeddings request; load-balanced, unknown fields reach the worker untouched."""

    model: str = Field(min_length=1)
    input: str | list[str] | TokenIds | list[TokenIds]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(default=None, ge=1)


class Embeddings(_Open):
    """The worker's reply, relayed as is."""

    object: Literal["list"]
    data: list[dict[str, Any]]
    model: str
    usage: dict[str, Any] | None = None


class PassThroughBody(_Open):
    """Any JSON object; its ``model`` (when present) picks the workers."""

    model: str | None = None


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


_CACHE_AWARE = "Routed to the worker most likely to hold the prompt's KV cache, then proxied."


def _operation(
    operation_id: str,
    summary: str,
    request: type[BaseModel] | None,
    reply: type[BaseModel] | None,
    description: str = _CACHE_AWARE,
    method: str = "post",
    parameters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    content: dict[str, Any] = {"text/event-stream": {"schema": {"type": "string"}}}
    content["application/json"] = {"schema": _ref(reply) if reply is not None else {"type": "object"}}
    operation: dict[str, Any] = {
        "tags": ["openai"],
        "operationId": operation_id,
        "summary": summary,
        "description": description,
        "responses": {
            "200": {
                "description": "the worker's answer; an SSE stream when `stream` is true",
                "headers": _HEADERS,
                "content": content,
            },
            "4XX": _ERROR,
            "5XX": _ERROR,
        },
    }
    if request is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(request)}},
        }
    if parameters:
        operation["parameters"] = parameters
    return {method: operation}


_ID = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
_STICKY = "Sent to the worker that stored the response (the gateway records it; unknown ids: 404)."
_BALANCED = "Load-balanced: the least loaded worker serving the body's `model`; the answer is relayed as is."


def _stored_response_paths() -> dict[str, Any]:
    one = {
        **_operation("getResponse", "Retrieve a stored response", None, ResponseObject, _STICKY, "get", _ID),
        **_operation("deleteResponse", "Delete a stored response", None, None, _STICKY, "delete", _ID),
    }
    return {
        "/v1/responses/{response_id}": one,
        "/v1/responses/{response_id}/cancel": _operation(
            "cancelResponse", "Cancel a background response", None, ResponseObject, _STICKY, "post", _ID
        ),
        "/v1/responses/{response_id}/input_items": _operation(
            "listInputItems", "List a stored response's input items", None, None, _STICKY, "get", _ID
        ),
    }


def _balanced_paths() -> dict[str, Any]:
    paths = {
        "/v1/embeddings": _operation(
            "createEmbedding", "Create embeddings", EmbeddingsRequest, Embeddings, _BALANCED
        )
    }
    for path in PASS_THROUGH:
        name = "passThrough" + "".join(p.title() for p in path.replace("_", "/").split("/"))
        paths[path] = _operation(
            name, f"Pass-through to the engines' {path}", PassThroughBody, None, _BALANCED
        )
    return paths


def add_completion_docs(document: dict[str, Any]) -> None:
    """Add the completion routes (first) and the schemas they and ``COMPLETION_BODY`` refer to."""
    completions = {
        "/v1/chat/completions": _operation(
            "createChatCompletion", "Create a chat completion", ChatCompletionRequest, ChatCompletion
        ),
        "/v1/completions": _operation(
            "createCompletion", "Create a completion", CompletionRequest, Completion
        ),
        "/v1/responses": _operation(
            "createResponse",
            "Create a model response (the Responses API)",
            ResponsesRequest,
            ResponseObject,
            _CACHE_AWARE + " With `previous_response_id`: " + _STICKY[0].lower() + _STICKY[1:],
        ),
        **_stored_response_paths(),
        **_balanced_paths(),
    }
    document["paths"] = {**completions, **document["paths"]}
    models: list[type[BaseModel]] = [
        ChatCompletionRequest,
        CompletionRequest,
        ChatCompletion,
        Completion,
        ResponsesRequest,
        ResponseObject,
        EmbeddingsRequest,
        Embeddings,
        PassThroughBody,
        ErrorResponse,
    ]
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in top.get("$defs", {}).items():
        schemas.setdefault(name, schema)
