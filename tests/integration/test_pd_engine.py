"""PD end to end with real ``--model tiny`` workers: the decode worker pulls the prefill worker's KV blocks.

Greedy output through the gateway (prefill on one worker, decode from pulled KV on another) must equal a
standalone worker's, and usage must count the pulled blocks as cached.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.pd_fleet import start as _start
from tests.support.procs import stop_process
from tests.support.waiting import wait_ready

pytestmark = pytest.mark.integration

PROMPT = "kvgate moves KV blocks between workers through a shared tier. " * 3


def test_pd_with_real_engines_matches_a_standalone_worker(redis_url: str, tmp_path: Path) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text("policy:\n  type: pd_disaggregation\n  params: {min_uncached_tokens: 32}\n")
    engine = ["worker", "--model", "tiny", "--device", "cpu", "--kv-tokens", "4096"]
    tier = ["--kv-tier", redis_url, "--ssd-dir", str(tmp_path / "ssd")]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        prefill = _start([*engine, "--role", "prefill", *tier], tmp_path / "prefill.log", procs)
        decode = _start([*engine, "--role", "decode", *tier], tmp_path / "decode.log", procs)
        reference = _start(engine, tmp_path / "reference.log", procs)
        for wid in (prefill, decode, reference):
            wait_ready(procs, f"http://{wid}/health", logs=tmp_path)
        gateway = _start(
            [
                "gateway", f"--worker=http://{prefill}#role=prefill", f"--worker=http://{decode}#role=decode",
                "--policy-config", str(config), "--tokenizer", "bytes", "--health-interval-s", "0.2",
            ],
            tmp_path / "gateway.log",
            procs,
        )  # fmt: skip
        wait_ready(procs, f"http://{gateway}/ready", logs=tmp_path)
        body = {"model": "kvgate-tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
        expected = httpx.post(f"http://{reference}/v1/completions", json=body, timeout=60).json()
        client = openai.OpenAI(base_url=f"http://{gateway}/v1", api_key="unused", max_retries=0)
        raw = client.completions.with_raw_response.create(
            model="kvgate-tiny", prompt=PROMPT, max_tokens=6, temperature=0
        )
        assert raw.headers["x-kvgate-worker"] == decode
        assert raw.headers["x-kvgate-prefill-worker"] == prefill
        got = raw.parse()
        assert got.choices[0].text == expected["choices"][0]["text"]
        assert got.usage is not None and got.usage.prompt_tokens_details is not None
        prompt_tokens = expected["usage"]["prompt_tokens"]
        assert got.usage.prompt_tokens == prompt_tokens
        assert got.usage.completion_tokens == expected["usage"]["completion_tokens"]
        assert got.usage.prompt_tokens_details.cached_tokens == (prompt_tokens - 1) // 16 * 16
    finally:
        for proc in reversed(procs):
            stop_process(proc)
