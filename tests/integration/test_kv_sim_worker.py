"""The KV service following a real sim worker process: its /kv/blocks and /kv/events SSE."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.kvindex.service import KVServiceConfig, open_kv_service
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import eventually, http_ok, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def sim_worker(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = start_process(
        kvgate_cmd("worker", "--sim", "--port", str(port), "--worker-id", "sim-1", "--block-size", "16"),
        log=tmp_path / "worker.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/health"), timeout_s=30)
        yield url
    finally:
        stop_process(proc)


async def test_blocks_a_sim_worker_caches_appear_under_the_registry_id(sim_worker: str) -> None:
    prompt = list(range(1000, 1000 + 16 * 6))
    async with httpx.AsyncClient(timeout=30) as client:
        model = (await client.get(f"{sim_worker}/v1/models")).json()["data"][0]["id"]
        hashes = chain_hashes(prompt, root_hash(model), 16)
        config = KVServiceConfig(backoff_initial_s=0.05, backoff_max_s=0.5)
        async with open_kv_service(state_url="memory", block_size=16, client=client, config=config) as kv:
            kv.add_worker("reg-1", sim_worker)
            await eventually(lambda: kv.aliases.resolve("sim-1") == "reg-1", timeout_s=15.0)
            resp = await client.post(
                f"{sim_worker}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 2}
            )
            assert resp.status_code == 200, resp.text
            await eventually(
                lambda: kv.index.longest_prefix(hashes, ["reg-1"])["reg-1"].gpu_blocks == 6, timeout_s=15.0
            )
