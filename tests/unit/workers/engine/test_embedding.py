"""Embeddings from the tiny model (against ``transformers``' hidden states) and media refusal."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest
import torch

from tests.unit.workers.engine.tiny_engine import hf_reference, tiny_model
from workers.engine.embedding import pooled_embeddings
from workers.engine.engine import TorchEngine
from workers.engine.serve import EngineOptions, build_engine_from_options
from workers.engine_api import GenerationRequest, InvalidRequestError, SamplingParams
from workers.server.app import create_app

INPUTS = [list(range(60, 100)), [7], list(range(1, 20))]


@torch.inference_mode()
def test_pooled_embeddings_are_the_mean_of_hfs_final_hidden_states() -> None:
    model = tiny_model()
    hf = hf_reference(model)
    ours = pooled_embeddings(model, INPUTS, block_size=16)
    for row, ids in zip(ours, INPUTS, strict=True):
        hidden = hf.model(torch.tensor([ids])).last_hidden_state[0].mean(dim=0)
        expected = (hidden / hidden.norm()).numpy()
        np.testing.assert_allclose(row, expected, atol=1e-4)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.fixture
async def engine() -> AsyncIterator[TorchEngine]:
    eng = build_engine_from_options(EngineOptions(model="tiny", kv_tokens=1024, worker_id="w1"))
    await eng.start()
    try:
        yield eng
    finally:
        await eng.stop()


async def test_engine_embeds_without_touching_the_kv_cache(engine: TorchEngine) -> None:
    vectors = await engine.embed(INPUTS)
    assert vectors.shape == (3, engine.core.runner.model.config.hidden_size)
    load = engine.load()
    assert (load.kv_usage, load.num_cached_blocks) == (0.0, 0)
    np.testing.assert_array_equal(await engine.embed(INPUTS[:1]), vectors[:1])


@pytest.mark.parametrize("ids", [[], [100_000], list(range(100)) * 11], ids=["empty", "vocab", "too-long"])
async def test_engine_refuses_bad_embedding_inputs(engine: TorchEngine, ids: list[int]) -> None:
    with pytest.raises(InvalidRequestError) as info:
        await engine.embed([ids])
    assert info.value.param == "input"


async def test_engine_refuses_media_prompts(engine: TorchEngine) -> None:
    request = GenerationRequest("r", (1, 2, 3), SamplingParams(max_tokens=2), "kvgate-tiny", has_media=True)
    with pytest.raises(InvalidRequestError, match="text only") as info:
        engine.generate(request)
    assert info.value.param == "messages"
    assert engine.load().running == engine.load().waiting == 0


async def test_worker_app_answers_media_chat_and_responses_with_a_400(engine: TorchEngine) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what?"}, image]}]}
    responses = {
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/a"}]}]
    }
    transport = httpx.ASGITransport(app=create_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
        for path, body, param in [("chat/completions", chat, "messages"), ("responses", responses, "input")]:
            resp = await client.post(f"/v1/{path}", json=body)
            assert resp.status_code == 400
            error = resp.json()["error"]
            assert (error["type"], error["param"]) == ("invalid_request_error", param)
            assert "text only" in error["message"]
