"""Writes ``kvgate_core/kvcontract/golden.json`` from an independent reference of the hash scheme.

Run ``python -m tests.unit.kvgate_core.kvcontract.golden_cases`` after a deliberate contract change only: the
golden file is the contract that gateway and worker tests both check.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path
from typing import Any

import xxhash

GOLDEN = Path(__file__).resolve().parents[4] / "kvgate_core" / "kvcontract" / "golden.json"


def reference_root(model: str, extra_keys: list[str]) -> int:
    return xxhash.xxh3_64_intdigest("\x00".join([model, *extra_keys]).encode("utf-8"))


def reference_hashes(tokens: list[int], root: int, block_size: int) -> list[int]:
    out, seed = [], root
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start : start + block_size]
        seed = xxhash.xxh3_64_intdigest(struct.pack(f"<{block_size}I", *block), seed=seed)
        out.append(seed)
    return out


def _case(
    name: str, model: str, extra_keys: list[str], block_size: int, tokens: list[int], **more: Any
) -> dict[str, Any]:
    root = reference_root(model, extra_keys)
    return {
        "name": name,
        "model": model,
        "extra_keys": extra_keys,
        "block_size": block_size,
        **more,
        "tokens": tokens,
        "root": root,
        "hashes": reference_hashes(tokens, root, block_size),
    }


def build() -> dict[str, Any]:
    rng = random.Random(20260101)
    seq = list(range(40))
    chat = "<|im_start|>user\nHello, kvgate!<|im_end|>\n<|im_start|>assistant\n"
    chat_tokens = [257, *b"user\nHello, kvgate!", 258, 10, 257, *b"assistant\n"]
    return {
        "scheme": "h[-1] = xxh3_64(utf8(model + ('\\0' + key)*)); h[i] = xxh3_64(uint32-LE tokens of block i, seed=h[i-1])",
        "extra_keys_labels": "lora:NAME, salt:CACHE_SALT, tenant:TENANT in that order (kvgate_core.kvcontract.extra_keys)",
        "cases": [
            _case("empty", "tiny", [], 16, []),
            _case("shorter_than_a_block", "tiny", [], 16, seq[:15]),
            _case("one_full_block", "tiny", [], 16, seq[:16]),
            _case("partial_last_block_16", "tiny", [], 16, seq),
            _case("partial_last_block_4", "tiny", [], 4, seq[:35]),
            _case("other_model", "SmolLM2-135M-Instruct", [], 16, seq[:32]),
            _case("lora", "tiny", ["lora:sql-adapter"], 16, seq[:32]),
            _case("all_extra_keys", "tiny", ["lora:sql", "salt:s3cret", "tenant:acme"], 4, seq[:20]),
            _case("unicode_model_large_ids", "modèle/ünï", [], 4, [0, 1, 2**32 - 1, 2**31] + [rng.randrange(2**32) for _ in range(12)]),
            _case("random_long", "tiny", ["tenant:t1"], 16, [rng.randrange(49152) for _ in range(200)]),
            _case("bytes_chat", "sim", [], 4, chat_tokens, tokenizer="bytes", text=chat,
                  messages=[{"role": "user", "content": "Hello, kvgate!"}]),
        ],
    }  # fmt: skip


def render(doc: dict[str, Any]) -> str:
    """JSON with one line per case (diffs stay readable)."""
    head = {k: v for k, v in doc.items() if k != "cases"}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [']
    lines += [
        "  " + json.dumps(c, ensure_ascii=False) + ("," if i < len(doc["cases"]) - 1 else "")
        for i, c in enumerate(doc["cases"])
    ]
    return "\n".join([*lines, "]}"]) + "\n"


if __name__ == "__main__":
    GOLDEN.write_text(render(build()), encoding="utf-8")
    print(f"wrote {GOLDEN}")
