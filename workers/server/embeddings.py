"""``POST /v1/embeddings``: OpenAI's embeddings endpoint over ``Engine.embed``.

``input`` is a string, an array of strings, an array of token ids, or an array of token-id arrays (at
most ``MAX_INPUTS``, each at most the model's context). Strings are tokenized as plain text (no chat
template, no special tokens). ``dimensions`` keeps the leading components and re-normalises them (as
OpenAI's shortened embeddings do). ``encoding_format: "base64"`` sends each vector as the base64 of its
little-endian float32 bytes, as OpenAI does.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response

from kvgate_core.tokenize.bundle import TokenizerBundle
from workers.engine_api import Embeddings, EngineError
from workers.server.errors import ApiError, bad_request, from_engine_error
from workers.server.generation import WorkerContext
from workers.server.openai_io import check_model, parse_body

MAX_INPUTS: Final = 256
_FORMATS: Final = ("float", "base64")


def parse_inputs(value: object, bundle: TokenizerBundle) -> list[list[int]]:
    """The token ids of each input of an embeddings ``input``.

    Raises:
        ApiError: 400 for a shape OpenAI does not accept, an empty input or too many inputs.
    """
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a non-empty string or array", "input")
    if all(type(v) is int for v in value):
        value = [value]
    if len(value) > MAX_INPUTS:
        raise bad_request(f"'input' may hold at most {MAX_INPUTS} items", "input")
    out: list[list[int]] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            ids = bundle.tokenizer.encode(item)
        elif isinstance(item, list) and all(type(t) is int for t in item):
            ids = item
        else:
            raise bad_request("'input' must be a string, an array of strings, or token-id arrays", "input")
        if not ids:
            raise bad_request(f"input[{i}] must not be empty", "input")
        out.append(ids)
    return out


def _dimensions(body: Mapping[str, Any]) -> int | None:
    value = body.get("dimensions")
    if value is not None and (type(value) is not int or value < 1):
        raise bad_request("'dimensions' must be a positive integer", "dimensions")
    return value


def shorten(vectors: Embeddings, dimensions: int | None) -> Embeddings:
    """The leading ``dimensions`` components of each row, re-normalised (``None``: unchanged)."""
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    if dimensions > vectors.shape[1]:
        raise bad_request(f"'dimensions' must be at most {vectors.shape[1]} for this model", "dimensions")
    head = vectors[:, :dimensions]
    norms = np.maximum(np.linalg.norm(head, axis=1, keepdims=True), 1e-12)
    out: Embeddings = (head / norms).astype(np.float32)
    return out


def embeddings_body(
    vectors: Embeddings, model: str, num_tokens: int, encoding_format: str
) -> bytes:  # fmt: skip
    """The JSON of an embeddings answer (float arrays, or base64 of little-endian float32)."""
    rows: Sequence[object]
    if encoding_format == "base64":
        rows = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors]
    else:
        rows = list(vectors)
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    doc = {"object": "list", "data": data, "model": model,
           "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}  # fmt: skip
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


async def create_embeddings(request: Request) -> Response:
    """``POST /v1/embeddings``."""
    ctx: WorkerContext = request.app.state.worker
    try:
        body = parse_body(await request.body())
        model = check_model(body, ctx.engine.model_id)
        encoding_format = body.get("encoding_format") or "float"
        if encoding_format not in _FORMATS:
            raise bad_request("'encoding_format' must be 'float' or 'base64'", "encoding_format")
        dimensions = _dimensions(body)
        inputs = parse_inputs(body.get("input"), ctx.bundle)
        vectors = shorten(await ctx.engine.embed(inputs), dimensions)
    except ApiError as exc:
        return exc.response()
    except EngineError as exc:
        return from_engine_error(exc).response()
    content = embeddings_body(vectors, model, sum(map(len, inputs)), encoding_format)
    return Response(content, media_type="application/json")
