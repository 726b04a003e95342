"""Builders shared by the engine tests: the tiny model, an ``EngineCore`` over it, and the HF reference."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LlamaConfig, LlamaForCausalLM as HFLlama
from transformers.initialization import no_init_weights

from kvgate_core.tokenize.tokenizer import ByteTokenizer
from workers.engine.block_manager import BlockManager
from workers.engine.config import ModelConfig
from workers.engine.core import EngineCore, EventBuffer
from workers.engine.detokenizer import Decoder
from workers.engine.kv_cache import PagedKVCache
from workers.engine.llama import LlamaForCausalLM
from workers.engine.loader import ModelSource, load_model
from workers.engine.model_runner import ModelRunner
from workers.engine.scheduler import Scheduler, SchedulerConfig
from workers.engine_api import FinishReason, GenerationChunk, GenerationRequest, SamplingParams
from workers.kernels.dispatch import reference_kernels

CPU = torch.device("cpu")
MODEL_ID = "kvgate-tiny"


def tiny_model() -> LlamaForCausalLM:
    return load_model(ModelSource("tiny"), reference_kernels(), device=CPU, dtype=torch.float32)


def hf_reference(model: LlamaForCausalLM) -> HFLlama:
    """``transformers``' Llama with the same config and weights (eager attention, fp32)."""
    c: ModelConfig = model.config
    hf_config = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_word_embeddings,
        attn_implementation="eager",
    )
    with no_init_weights():  # the weights are overwritten below; skip the random init
        hf = HFLlama(hf_config).eval()
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return hf


@torch.inference_mode()
def hf_greedy(hf: HFLlama, prompt: Sequence[int], max_tokens: int) -> list[int]:
    """Greedy tokens by full recomputation (no KV cache at all): the independent oracle."""
    ids = list(prompt)
    for _ in range(max_tokens):
        logits = hf(torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def build_core(
    model: LlamaForCausalLM,
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    max_batched_tokens: int = 512,
    max_num_seqs: int = 32,
    decoder: Decoder | None = None,
) -> EngineCore:
    device = next(model.parameters()).device
    kv = PagedKVCache.allocate(
        model.config, num_blocks=num_blocks, block_size=block_size, device=device, dtype=torch.float32
    )
    events = EventBuffer()
    blocks = BlockManager(num_blocks, block_size, on_event=events.append, worker_id="w")
    scheduler = Scheduler(blocks, SchedulerConfig(max_batched_tokens, max_num_seqs))
    return EngineCore(
        ModelRunner(model, kv, device), scheduler, decoder or ByteTokenizer(), events,
        eos_token_ids=(), max_model_len=num_blocks * block_size,
    )  # fmt: skip


def greedy_request(
    request_id: str, prompt: Sequence[int], max_tokens: int, **params: object
) -> GenerationRequest:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, **params)  # type: ignore[arg-type]
    return GenerationRequest(request_id, tuple(prompt), sampling, model=MODEL_ID)


def run_to_completion(core: EngineCore, max_steps: int = 10_000) -> dict[str, list[GenerationChunk]]:
    """Step until idle; the chunks of every request, in order."""
    out: dict[str, list[GenerationChunk]] = {}
    for _ in range(max_steps):
        if not core.has_work:
            return out
        for request_id, chunk in core.step().chunks:
            out.setdefault(request_id, []).append(chunk)
    raise AssertionError("engine did not finish")


def tokens_of(chunks: Sequence[GenerationChunk]) -> list[int]:
    assert chunks[-1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    return [t for c in chunks for t in c.token_ids]
