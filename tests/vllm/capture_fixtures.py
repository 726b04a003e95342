"""Capture real answers of a running vLLM into ``tests/fixtures/engines/vllm-<version>/``.

Usage (with kvgate's own venv, against a vLLM started as ``tests/vllm/conftest.py`` starts it)::

    .venv/bin/python -m tests.vllm.capture_fixtures http://127.0.0.1:PORT tcp://127.0.0.1:EVENTS_PORT \
        tcp://127.0.0.1:REPLAY_PORT [OUT_DIR]

It writes what vLLM answers, byte for byte where bytes matter (SSE streams, ZMQ frames), so that parsers
can be tested against the real thing: ``v1_models.json``, ``version.json``, ``metrics_idle.txt``,
``metrics_running.txt``, ``kv_event_sources.json``, ``tokenize_*``, ``chat_*``, and the ZMQ KV event
frames seen while those requests ran (``zmq/NNN.topic``, ``NNN.seq``, ``NNN.msgpack``) plus one replay
exchange (``zmq/replay_*``). Start it on a fresh server: the first events show blocks being stored.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import zmq

from tests.support.procs import REPO

CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0}
LONG = " ".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog." for i in range(12))


class Recorder:
    """Collect ZMQ frames published while requests run."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.frames: list[list[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sub, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):
                self.frames.append(self.sub.recv_multipart())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sub.close(linger=0)
        self.ctx.term()


def _dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _capture_http(client: httpx.Client, model: str, out: Path) -> None:
    _dump(out / "v1_models.json", client.get("/v1/models").json())
    _dump(out / "version.json", client.get("/version").json())
    (out / "metrics_idle.txt").write_text(client.get("/metrics").text)
    _dump(out / "kv_event_sources.json", client.get("/kv_event_sources").json())
    health = client.get("/health")
    _dump(out / "health.json", {"status": health.status_code, "body": health.text})
    load = client.get("/load")
    _dump(out / "load.json", {"status": load.status_code, "body": load.text})
    tok_chat = {"model": model, "messages": CHAT["messages"], "add_generation_prompt": True}
    _dump(out / "tokenize_chat_request.json", tok_chat)
    _dump(out / "tokenize_chat_response.json", client.post("/tokenize", json=tok_chat).json())
    tok_prompt = {"model": model, "prompt": "The capital of France is"}
    _dump(out / "tokenize_prompt_request.json", tok_prompt)
    _dump(out / "tokenize_prompt_response.json", client.post("/tokenize", json=tok_prompt).json())
    chat = {"model": model, **CHAT, "max_tokens": 32}
    _dump(out / "chat_request.json", chat)
    _dump(out / "chat_response.json", client.post("/v1/chat/completions", json=chat).json())
    # the same again: now its full blocks are cached (cached_tokens > 0 only past one 32-token block)
    long_chat = {
        "model": model,
        "messages": [{"role": "user", "content": LONG}],
        "temperature": 0,
        "max_tokens": 8,
    }
    _dump(out / "chat_long_request.json", long_chat)
    _dump(out / "chat_long_response_first.json", client.post("/v1/chat/completions", json=long_chat).json())
    _dump(out / "chat_long_response_repeat.json", client.post("/v1/chat/completions", json=long_chat).json())
    for name, extra in (
        ("chat_stream_include_usage", {"stream_options": {"include_usage": True}}),
        ("chat_stream_no_usage", {}),
    ):
        body = {**chat, "stream": True, **extra}
        _dump(out / f"{name}_request.json", body)
        with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            (out / f"{name}.sse").write_bytes(b"".join(reply.iter_raw()))
    stream_long = {**long_chat, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=stream_long) as reply:
        (out / "chat_stream_long_repeat_include_usage.sse").write_bytes(b"".join(reply.iter_raw()))
    comp = {"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    _dump(out / "completion_request.json", comp)
    _dump(out / "completion_response.json", client.post("/v1/completions", json=comp).json())


def _capture_running_metrics(client: httpx.Client, model: str, out: Path) -> None:
    body = {
        "model": model,
        "prompt": "Count from one to one thousand:",
        "max_tokens": 400,
        "ignore_eos": True,
    }
    threads = [
        threading.Thread(
            target=lambda: httpx.post(f"{client.base_url}/v1/completions", json=body, timeout=300)
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    text = ""
    while time.monotonic() < deadline:
        text = client.get("/metrics").text
        if any(
            line.startswith("vllm:num_requests_running{") and not line.endswith(" 0.0")
            for line in text.splitlines()
        ):
            break
        time.sleep(0.2)
    (out / "metrics_running.txt").write_text(text)
    for t in threads:
        t.join()


def _capture_replay(endpoint: str, out: Path) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    request = [b"", (0).to_bytes(8, "big")]
    sock.send_multipart(request)
    replies: list[list[bytes]] = []
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while poller.poll(5000):
        frames = sock.recv_multipart()
        replies.append(frames)
        if len(frames) >= 3 and frames[2] == (-1).to_bytes(8, "big", signed=True):
            break
    sock.close(linger=0)
    ctx.term()
    zdir = out / "zmq"
    (zdir / "replay_request.bin").write_bytes(b"".join(request))
    kept = [*enumerate(replies[:5]), (len(replies) - 1, replies[-1])] if replies else []
    for i, frames in kept:  # the first batches and the end marker (seq -1, empty payload)
        for j, frame in enumerate(frames):
            (zdir / f"replay_{i:03d}_frame{j}.bin").write_bytes(frame)
    _dump(
        zdir / "replay_summary.json", {"replies": len(replies), "frames_per_reply": [len(f) for f in replies]}
    )


def main() -> None:
    base, events, replay = sys.argv[1:4]
    client = httpx.Client(base_url=base, timeout=120)
    model = str(client.get("/v1/models").json()["data"][0]["id"])
    version = str(client.get("/version").json()["version"])
    out = Path(sys.argv[4]) if len(sys.argv) > 4 else REPO / "tests/fixtures/engines" / f"vllm-{version}"
    (out / "zmq").mkdir(parents=True, exist_ok=True)
    recorder = Recorder(events)
    time.sleep(1.0)  # let the SUB socket join before anything is published
    _capture_http(client, model, out)
    _capture_running_metrics(client, model, out)
    time.sleep(1.0)
    recorder.close()
    for i, frames in enumerate(recorder.frames[:40]):
        topic, seq, payload = frames
        (out / "zmq" / f"{i:03d}.topic").write_bytes(topic)
        (out / "zmq" / f"{i:03d}.seq").write_bytes(seq)
        (out / "zmq" / f"{i:03d}.msgpack").write_bytes(payload)
    _capture_replay(replay, out)
    print(f"wrote {out} ({len(recorder.frames)} event frames)")


if __name__ == "__main__":
    main()
