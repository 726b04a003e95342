"""``POST /v1/embeddings`` on an in-process sim worker, and the route's helpers."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest

from workers.server.embeddings import shorten
from workers.sim.embedding import SIM_EMBEDDING_DIM


async def _embed(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/embeddings", json={"model": "kvgate-sim", **body})


async def test_strings_get_normalised_vectors_in_openais_shape(sim_client: httpx.AsyncClient) -> None:
    doc = (await _embed(sim_client, input=["hello world", "hello world", "other"])).json()
    assert doc["object"] == "list" and doc["model"] == "kvgate-sim"
    assert [(d["object"], d["index"]) for d in doc["data"]] == [("embedding", i) for i in range(3)]
    vectors = np.array([d["embedding"] for d in doc["data"]])
    assert vectors.shape == (3, SIM_EMBEDDING_DIM)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(vectors[0], vectors[1])
    assert doc["usage"] == {"prompt_tokens": 11 + 11 + 5, "total_tokens": 27}  # byte tokens


async def test_base64_is_little_endian_float32_of_the_same_vector(sim_client: httpx.AsyncClient) -> None:
    floats = (await _embed(sim_client, input="kv cache")).json()["data"][0]["embedding"]
    encoded = (await _embed(sim_client, input="kv cache", encoding_format="base64")).json()
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, floats, rtol=1e-6)


async def test_token_id_inputs_match_their_text(sim_client: httpx.AsyncClient) -> None:
    text = (await _embed(sim_client, input="hi")).json()["data"][0]["embedding"]
    ids = (await _embed(sim_client, input=[104, 105])).json()["data"][0]["embedding"]
    batch = (await _embed(sim_client, input=[[104, 105], [1]])).json()["data"]
    assert text == ids == batch[0]["embedding"]
    assert len(batch) == 2


async def test_dimensions_shorten_and_renormalise(sim_client: httpx.AsyncClient) -> None:
    vector = (await _embed(sim_client, input="abc", dimensions=8)).json()["data"][0]["embedding"]
    assert len(vector) == 8
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": ""}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": [["a"]]}, 400, "input"),
        ({"input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
        ({"input": "x", "dimensions": 0}, 400, "dimensions"),
        ({"input": "x", "dimensions": 65}, 400, "dimensions"),
        ({"input": "x", "model": "other"}, 404, "model"),
        ({"input": [-1]}, 400, "input"),
    ],
    ids=[
        "empty-string",
        "empty-list",
        "nested-strings",
        "format",
        "dims-0",
        "dims-too-big",
        "model",
        "neg-id",
    ],
)
async def test_bad_requests_get_openai_errors(
    sim_client: httpx.AsyncClient, body: dict[str, Any], status: int, param: str
) -> None:
    resp = await _embed(sim_client, **body)
    assert resp.status_code == status
    assert resp.json()["error"]["param"] == param


def test_shorten_keeps_the_full_vector_unchanged() -> None:
    vectors = np.eye(3, dtype=np.float32)
    assert shorten(vectors, None) is vectors
    assert shorten(vectors, 3) is vectors
    np.testing.assert_allclose(shorten(np.ones((1, 4), dtype=np.float32), 2), [[2**-0.5, 2**-0.5]], rtol=1e-6)
