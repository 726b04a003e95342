"""What the fakes read from an OpenAI request body: the prompt's token ids and the generation knobs.

Prompts are parsed and tokenized the way kvgate does it (``kvgate_core.tokenize.request_prompt`` and the
byte ``TokenizerBundle``), so the fakes and a gateway agree token for token. An engine that accepts token
ids on the chat route names its field (``token_field``: SGLang and LMDeploy ``input_ids``, TensorRT-LLM
``prompt_token_ids``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate_core.tokenize.bundle import TokenizerBundle
from kvgate_core.tokenize.request_prompt import Endpoint, parse_prompt
from tests.support.engines.core import GenRequest


class BadRequestError(ValueError):
    """The body cannot be served; the message is client-facing."""


@dataclass(frozen=True, slots=True)
class Job:
    """One parsed request: its endpoint, body, prompt token ids and what the client asked for."""

    endpoint: Endpoint
    body: Mapping[str, Any]
    prompt_ids: list[int]
    stream: bool
    include_usage: bool
    max_tokens: int

    @property
    def model(self) -> str:
        return str(self.body.get("model") or "")

    def gen_request(self, *, lora: str | None = None) -> GenRequest:
        seed = self.body.get("seed")
        salt = self.body.get("cache_salt")
        return GenRequest(
            self.prompt_ids,
            self.max_tokens,
            seed=seed if isinstance(seed, int) else None,
            salt=salt if isinstance(salt, str) and salt else None,
            lora=lora,
        )


def _token_ids(value: object, field: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(i, int) for i in value):
        raise BadRequestError(f"'{field}' must be a non-empty list of token ids")
    return list(value)


def prompt_ids(
    body: Mapping[str, Any], endpoint: Endpoint, bundle: TokenizerBundle, token_field: str | None = None
) -> list[int]:
    """The token ids the engine runs for ``body``. Raises ``BadRequestError``."""
    if token_field is not None and body.get(token_field) is not None:
        return _token_ids(body[token_field], token_field)
    try:
        return bundle.encode(parse_prompt(body, endpoint))
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None


def parse_job(
    body: object,
    endpoint: Endpoint,
    bundle: TokenizerBundle,
    *,
    default_max_tokens: int = 16,
    token_field: str | None = None,
) -> Job:
    """Parse a request body. Raises ``BadRequestError``."""
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise BadRequestError("'max_tokens' must be a non-negative integer")
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return Job(
        endpoint=endpoint,
        body=body,
        prompt_ids=prompt_ids(body, endpoint, bundle, token_field),
        stream=bool(body.get("stream")),
        include_usage=include_usage,
        max_tokens=max_tokens,
    )
