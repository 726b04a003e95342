"""``build_engine(args)``: the real worker engine from ``kvgate worker`` flags (see ``workers.cli``).

Picks the device and dtype, loads the model and its tokenizer bundle, sizes the paged KV cache from
``--kv-tokens`` (or a memory budget), and wires block manager, scheduler, runner and engine together.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch

from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle, load_bundle, load_gguf_bundle
from workers.engine.block_manager import BlockManager
from workers.engine.config import ModelConfig
from workers.engine.core import EngineCore, EventBuffer
from workers.engine.engine import EngineIdentity, TorchEngine
from workers.engine.kv_cache import PagedKVCache, bytes_per_token
from workers.engine.kv_connector import KVConnector
from workers.engine.llama import LlamaForCausalLM
from workers.engine.loader import ModelSource, load_model, resolve_source
from workers.engine.model_runner import ModelRunner
from workers.engine.scheduler import Scheduler, SchedulerConfig
from workers.engine_api import Engine
from workers.kernels.dispatch import select_kernels
from workers.kvtier.factory import TierSettings

logger = logging.getLogger(__name__)

CPU_KV_BUDGET_BYTES: Final = 512 * 1024 * 1024
CUDA_KV_SHARE_OF_FREE: Final = 0.6
MAX_DEFAULT_KV_TOKENS: Final = 262_144
DEFAULT_CHUNK_TOKENS: Final = 512


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Everything ``build_engine`` reads from the CLI, validated."""

    model: str = "tiny"
    model_name: str | None = None
    worker_id: str = "worker"
    device: str = "auto"
    block_size: int = 16
    kv_tokens: int | None = None
    max_model_len: int | None = None
    max_running: int = 32
    max_batched_tokens: int = DEFAULT_CHUNK_TOKENS
    seed: int = 0
    cpu_threads: int | None = None  # torch intra-op threads on CPU; default: half the cores
    kv_tier: str | None = None  # shared DRAM tier, redis://… (workers.engine.kv_connector)
    ssd_dir: str | None = None  # shared SSD tier directory

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineOptions:
        host, port = getattr(args, "host", "127.0.0.1"), getattr(args, "port", 0)
        return cls(
            model=args.model,
            model_name=getattr(args, "model_name", None),
            worker_id=getattr(args, "worker_id", None) or f"{host}:{port}",
            device=getattr(args, "device", "auto"),
            block_size=getattr(args, "block_size", 16),
            kv_tokens=getattr(args, "kv_tokens", None),
            max_model_len=getattr(args, "max_model_len", None),
            max_running=getattr(args, "max_running", 32),
            seed=getattr(args, "seed", 0),
            kv_tier=getattr(args, "kv_tier", None),
            ssd_dir=getattr(args, "ssd_dir", None),
        )


def build_engine(args: argparse.Namespace) -> Engine:
    """The real engine (a ``TorchEngine``) for ``kvgate worker`` flags.

    Raises:
        ValueError: a bad flag or model (``ModelConfigError`` is a ``ValueError``), with what to fix.
    """
    return build_engine_from_options(EngineOptions.from_args(args))


def build_engine_from_options(options: EngineOptions) -> TorchEngine:
    """The real engine for validated options (tests and benchmarks call this directly)."""
    if options.block_size < 1:
        raise ValueError("--block-size must be positive")
    device = pick_device(options.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    if device.type == "cpu":
        # Measured on the 2-core dev VM under load: one thread per engine ran a SmolLM2 step ~6x faster
        # than two oversubscribed ones, and it leaves a core for the HTTP loop and a second worker.
        torch.set_num_threads(options.cpu_threads or max(1, (os.cpu_count() or 2) // 2))
    source = resolve_source(options.model)
    model_id = options.model_name or _default_model_name(options.model, source)
    model = load_model(source, select_kernels(device), device=device, dtype=dtype)
    config = model.config
    bundle = _load_bundle(source, model_id)
    num_blocks = _num_blocks(options, config, device, dtype)
    kv_cache = PagedKVCache.allocate(
        config, num_blocks=num_blocks, block_size=options.block_size, device=device, dtype=dtype
    )
    max_len = min(config.max_position_embeddings, num_blocks * options.block_size)
    if options.max_model_len is not None:
        max_len = min(max_len, options.max_model_len)
    eos = set(config.eos_token_ids)
    if bundle.tokenizer.eos_token_id is not None:
        eos.add(bundle.tokenizer.eos_token_id)
    core = _build_core(options, model, kv_cache, bundle, eos, max_len)
    logger.info(
        "engine: model %s on %s (%s), %d KV blocks of %d tokens, max_model_len %d",
        model_id, device, dtype, num_blocks, options.block_size, max_len,
    )  # fmt: skip
    identity = EngineIdentity(model_id, options.worker_id, config.vocab_size)
    return TorchEngine(core, bundle, identity, _connector(options, core, model_id))


def _connector(options: EngineOptions, core: EngineCore, model_id: str) -> KVConnector | None:
    """The shared KV tier's connector when ``--kv-tier`` or ``--ssd-dir`` is given."""
    if options.kv_tier is None and options.ssd_dir is None:
        return None
    ssd = Path(options.ssd_dir) if options.ssd_dir is not None else None
    settings = TierSettings(model_id, redis_url=options.kv_tier, ssd_dir=ssd)
    return KVConnector(core, settings, worker_id=options.worker_id)


def _build_core(
    options: EngineOptions,
    model: LlamaForCausalLM,
    kv_cache: PagedKVCache,
    bundle: TokenizerBundle,
    eos: set[int],
    max_len: int,
) -> EngineCore:
    device = next(model.parameters()).device
    runner = ModelRunner(model, kv_cache, device)
    events = EventBuffer()
    blocks = BlockManager(
        kv_cache.num_blocks, options.block_size, on_event=events.append, worker_id=options.worker_id
    )
    sched_config = SchedulerConfig(options.max_batched_tokens, options.max_running)
    return EngineCore(
        runner, Scheduler(blocks, sched_config), bundle.tokenizer, events,
        eos_token_ids=sorted(eos), max_model_len=max_len, seed=options.seed,
    )  # fmt: skip


def pick_device(spec: str) -> torch.device:
    """``auto`` is CUDA when available, else CPU; ``cuda`` without a device is an error."""
    if spec not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device {spec!r}: expected auto, cpu or cuda")
    has_cuda = torch.cuda.is_available()
    if spec == "cuda" and not has_cuda:
        raise ValueError("--device cuda: no CUDA device is available (use --device cpu)")
    return torch.device("cuda" if spec == "cuda" or (spec == "auto" and has_cuda) else "cpu")


def _default_model_name(model: str, source: ModelSource) -> str:
    if source.kind == "tiny":
        return "kvgate-tiny"
    if model == "smollm2":
        return "SmolLM2-135M-Instruct"
    assert source.path is not None, "non-tiny sources carry a path"
    return source.path.stem if source.kind == "gguf" else source.path.name


def _load_bundle(source: ModelSource, model_id: str) -> TokenizerBundle:
    if source.kind == "tiny":
        return byte_bundle(model_id)
    assert source.path is not None, "non-tiny sources carry a path"
    if source.kind == "gguf":
        return load_gguf_bundle(source.path, model=model_id)
    return load_bundle(source.path, model=model_id)


def _num_blocks(options: EngineOptions, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> int:
    per_token = bytes_per_token(config, dtype)
    if options.kv_tokens is not None:
        tokens = options.kv_tokens
    elif device.type == "cuda":  # pragma: no cover - CUDA only
        free_bytes, _ = torch.cuda.mem_get_info(device)
        tokens = int(free_bytes * CUDA_KV_SHARE_OF_FREE) // per_token
    else:
        tokens = min(CPU_KV_BUDGET_BYTES // per_token, MAX_DEFAULT_KV_TOKENS)
    num_blocks = tokens // options.block_size
    if num_blocks < 1:
        raise ValueError(f"--kv-tokens {tokens} is less than one block of {options.block_size} tokens")
    return num_blocks
