"""The engine's Llama model against ``transformers``' ``LlamaForCausalLM`` with the same weights."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM as HFLlama

from tests.unit.workers.engine.tiny_engine import CPU, hf_reference, tiny_model
from workers.engine.config import RopeScaling, config_from_hf
from workers.engine.forward_batch import ForwardBatch
from workers.engine.kv_cache import PagedKVCache
from workers.engine.layers import rope_inv_freq
from workers.engine.llama import LlamaForCausalLM
from workers.engine.loader import ModelSource, load_model
from workers.kernels.dispatch import reference_kernels

BLOCK = 4
ATOL = 1e-4


@pytest.fixture(scope="module")
def models() -> tuple[LlamaForCausalLM, HFLlama]:
    model = tiny_model()
    return model, hf_reference(model)


def _batch(starts: list[int], q_lens: list[int], tables: list[list[int]]) -> ForwardBatch:
    positions, slots = [], []
    for start, q_len, table in zip(starts, q_lens, tables, strict=True):
        for p in range(start, start + q_len):
            positions.append(p)
            slots.append(table[p // BLOCK] * BLOCK + p % BLOCK)
    cu = [0]
    for q_len in q_lens:
        cu.append(cu[-1] + q_len)
    width = max(len(t) for t in tables)
    return ForwardBatch(
        positions=torch.tensor(positions),
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        context_lens=torch.tensor([s + q for s, q in zip(starts, q_lens, strict=True)], dtype=torch.int32),
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
        logits_indices=torch.tensor(cu[1:]) - 1,
        is_decode=all(q == 1 for q in q_lens),
    )


@torch.inference_mode()
def _hf_last_logits(hf: HFLlama, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0, -1]


@torch.inference_mode()
def test_batched_prefill_with_cached_prefix_then_decode_matches_transformers(models) -> None:
    model, hf = models
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 259, (n,), generator=gen).tolist() for n in (13, 8, 21)]
    cache = PagedKVCache.allocate(
        model.config, num_blocks=32, block_size=BLOCK, device=CPU, dtype=torch.float32
    )
    tables = [list(range(1, 6)), list(range(6, 9)), list(range(9, 16))]
    # Step 1: a first chunk of each prompt (as a prefix cache or chunked prefill would leave it).
    firsts = [8, 4, 12]
    ids = torch.tensor([t for p, n in zip(prompts, firsts, strict=True) for t in p[:n]])
    model(ids, _batch([0, 0, 0], firsts, tables), cache.layers)
    # Step 2: the rest of each prompt attends over the cached first chunk.
    rests = [len(p) - n for p, n in zip(prompts, firsts, strict=True)]
    ids = torch.tensor([t for p, n in zip(prompts, firsts, strict=True) for t in p[n:]])
    logits = model(ids, _batch(firsts, rests, tables), cache.layers)
    for row, prompt in enumerate(prompts):
        torch.testing.assert_close(logits[row], _hf_last_logits(hf, prompt), atol=ATOL, rtol=0)
    # Step 3: one decode token per sequence through the decode kernel path.
    nxt = [int(t) for t in logits.argmax(-1)]
    batch = _batch([len(p) for p in prompts], [1, 1, 1], tables)
    assert batch.is_decode
    logits = model(torch.tensor(nxt), batch, cache.layers)
    for row, prompt in enumerate(prompts):
        torch.testing.assert_close(logits[row], _hf_last_logits(hf, [*prompt, nxt[row]]), atol=ATOL, rtol=0)


def test_llama3_rope_scaling_matches_transformers() -> None:
    raw = {
        "vocab_size": 32, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    }  # fmt: skip
    config = config_from_hf(raw)
    assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 64)
    hf_rotary = HFLlama(LlamaConfig(**raw)).model.rotary_emb
    ours = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
    torch.testing.assert_close(ours, hf_rotary.inv_freq.float())


def test_an_hf_directory_saved_by_transformers_loads_the_same_model(models, tmp_path) -> None:
    model, hf = models
    hf.save_pretrained(tmp_path)  # config.json (transformers' current format) + model.safetensors
    loaded = load_model(ModelSource("hf_dir", tmp_path), reference_kernels(), device=CPU, dtype=torch.float32)
    assert replace(loaded.config, bos_token_id=None, eos_token_ids=()) == model.config
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, atol=0, rtol=0)
