"""Sidecar mode: a gateway follows a vLLM-style engine's ZMQ KV events (re-hashed into kvgate's scheme).

The OpenAI backend here is a sim worker; its KV events come from a ZMQ publisher speaking vLLM's msgpack
``KVEventBatch`` format, as a vLLM server started with ``--kv-events-config`` publishes them.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import msgpack
import pytest
import zmq

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import http_ok, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
TOKENS = list(range(10, 10 + 4 * 16))  # four full blocks of 16


def _vllm_batch(token_ids: list[int]) -> bytes:
    stored = ["BlockStored", [111, 222, 333, 444], None, token_ids, 16, None, "GPU"]
    return bytes(msgpack.packb([time.time(), [stored], 0]))


def test_gateway_routes_on_a_foreign_engines_zmq_events(tmp_path: Path) -> None:
    zport, gw_port = free_port(), free_port()
    ports = [free_port(), free_port()]
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{zport}")
    procs = [
        start_process(kvgate_cmd("worker", "--sim", "--port", str(p)), log=tmp_path / f"w{p}.log")
        for p in ports
    ]
    try:
        for p in ports:
            wait_until(lambda p=p: http_ok(f"http://127.0.0.1:{p}/health"), timeout_s=60)
        engine = f"http://127.0.0.1:{ports[0]}#id=vllm-0&events=tcp://127.0.0.1:{zport}&engine=vllm&model=kvgate-sim"
        procs.append(start_process(
            kvgate_cmd("gateway", "--port", str(gw_port), "--tokenizer", "bytes",
                       f"--worker={engine}", f"--worker=http://127.0.0.1:{ports[1]}"),
            log=tmp_path / "gw.log",
        ))  # fmt: skip
        base = f"http://127.0.0.1:{gw_port}"
        wait_until(lambda: http_ok(base + "/ready"), timeout_s=60)
        body = {"model": "kvgate-sim", "prompt": [*TOKENS, 1, 2, 3], "max_tokens": 2}

        def hit() -> int:
            pub.send_multipart([b"", (0).to_bytes(8, "big"), _vllm_batch(TOKENS)])
            rows = httpx.post(base + "/admin/route", json=body, timeout=10).json()["workers"]
            return int(next(w["prefix_hit_tokens"] for w in rows if w["id"] == "vllm-0"))

        wait_until(lambda: hit() == 64, timeout_s=20, interval_s=0.1)
        reply = httpx.post(base + "/v1/completions", json=body, timeout=30)
        assert reply.status_code == 200
        assert reply.headers["x-kvgate-worker"] == "vllm-0"
        assert reply.headers["x-kvgate-prefix-hit"] == "64"
    finally:
        for proc in procs:
            stop_process(proc)
        pub.close(linger=0)
        ctx.term()
