"""A burst through a real gateway with tiny upstream caps: every stream completes or is shed with 503 +
Retry-After before anything was forwarded; none fails with 502 and none hangs."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.integration.gateway_fleet import gateway_fleet

pytestmark = pytest.mark.integration

MODEL = "kvgate-sim"
BURST = 20
GATEWAY_ARGS = ("--policy", "round_robin", "--tokenizer", "none", "--health-interval-s", "0.5",
                "--upstream-max-connections", "2", "--upstream-max-waiting", "2")  # fmt: skip
# 24 tokens at 100/s: a stream lasts about a quarter second, so the burst overlaps itself
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Count slowly."}], "max_tokens": 24,
        "ignore_eos": True, "stream": True}  # fmt: skip


async def _one(client: httpx.AsyncClient, url: str) -> str:
    async with client.stream("POST", url, json=BODY) as resp:
        raw = b"".join([chunk async for chunk in resp.aiter_bytes()])
    if resp.status_code == 200:
        assert raw.endswith(b"data: [DONE]\n\n"), raw[-200:]
        assert b'"error"' not in raw
        return "ok"
    assert resp.status_code == 503, (resp.status_code, raw)
    assert resp.headers["retry-after"] == "1"
    assert resp.headers["content-type"] == "application/json"
    assert b'"code":"upstream_saturated"' in raw and b'"type":"server_error"' in raw
    return "shed"


async def _burst(gateway: str) -> Counter[str]:
    limits = httpx.Limits(max_connections=BURST)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client, asyncio.timeout(60):
        url = f"{gateway}/v1/chat/completions"
        return Counter(await asyncio.gather(*(_one(client, url) for _ in range(BURST))))


def test_a_burst_over_tiny_caps_completes_or_is_shed_cleanly(tmp_path: Path) -> None:
    worker_args = ("--prefill-tps", "1000000", "--decode-tps", "100")
    with gateway_fleet(tmp_path, num_workers=2, worker_args=worker_args, gateway_args=GATEWAY_ARGS) as fleet:
        outcomes = asyncio.run(_burst(fleet.gateway))
        metrics = httpx.get(f"{fleet.gateway}/metrics", timeout=10).text
        log = fleet.log("gateway.log")
    assert sum(outcomes.values()) == BURST and set(outcomes) <= {"ok", "shed"}
    # 2 workers x (2 connections + 2 waiting) take 8 at once; the rest are shed
    assert outcomes["ok"] >= 4 and outcomes["shed"] >= 1, outcomes
    assert "kvgate_upstream_shed_total{" in metrics
    assert 'status="502"' not in metrics
    assert 1 <= log.count("upstream saturated:") <= 3  # logged once per interval, not per request
