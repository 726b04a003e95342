"""SIGHUP reloads the worker list from the config file without failing requests."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import http_ok, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
BODY = {"model": "kvgate-sim", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def _ids(base: str) -> dict[str, bool]:
    rows = httpx.get(base + "/admin/workers").json()["workers"]
    return {r["id"]: bool(r.get("draining")) for r in rows}


def test_sighup_swaps_workers_while_serving(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    procs = [
        start_process(kvgate_cmd("worker", "--sim", "--port", str(p)), log=tmp_path / f"w{p}.log")
        for p in ports
    ]
    config = tmp_path / "gateway.yaml"
    config.write_text(f"worker:\n  - http://127.0.0.1:{ports[0]}\npolicy: least_load\n")
    gw_port = free_port()
    base = f"http://127.0.0.1:{gw_port}"
    gw = start_process(
        kvgate_cmd("gateway", "--port", str(gw_port), "--config", str(config)), log=tmp_path / "gw.log"
    )
    procs.append(gw)
    try:
        wait_until(lambda: http_ok(base + "/ready"), timeout_s=60)
        # the reload itself waits for the new worker, but a started-late worker would make the test slow
        wait_until(lambda: http_ok(f"http://127.0.0.1:{ports[1]}/health"), timeout_s=60)
        assert list(_ids(base)) == [f"127.0.0.1:{ports[0]}"]
        config.write_text(f"worker:\n  - http://127.0.0.1:{ports[1]}\npolicy: least_load\n")
        os.kill(gw.pid, signal.SIGHUP)
        new_id = f"127.0.0.1:{ports[1]}"
        statuses = []
        with httpx.Client(base_url=base, timeout=30) as client:
            for _ in range(200):
                statuses.append(client.post("/v1/chat/completions", json=BODY).status_code)
                workers = _ids(base)
                if list(workers) == [new_id]:
                    break
        assert list(_ids(base)) == [new_id], _ids(base)  # the old worker was drained, then removed
        assert set(statuses) == {200}
        reply = httpx.post(base + "/v1/chat/completions", json=BODY, timeout=30)
        assert reply.headers["x-kvgate-worker"] == new_id
        assert gw.poll() is None
    finally:
        for proc in procs:
            stop_process(proc)


def test_reload_keeps_the_old_worker_until_a_new_one_is_up(tmp_path: Path) -> None:
    old_port, new_port, gw_port = free_port(), free_port(), free_port()
    procs = [start_process(kvgate_cmd("worker", "--sim", "--port", str(old_port)), log=tmp_path / "old.log")]
    config = tmp_path / "gateway.yaml"
    config.write_text(f"worker:\n  - http://127.0.0.1:{old_port}\npolicy: least_load\n")
    base = f"http://127.0.0.1:{gw_port}"
    procs.append(
        start_process(
            kvgate_cmd("gateway", "--port", str(gw_port), "--config", str(config)), log=tmp_path / "gw.log"
        )
    )
    try:
        wait_until(lambda: http_ok(base + "/ready"), timeout_s=60)
        config.write_text(f"worker:\n  - http://127.0.0.1:{new_port}\npolicy: least_load\n")
        os.kill(procs[1].pid, signal.SIGHUP)  # the new worker is not even started yet
        with httpx.Client(base_url=base, timeout=30) as client:
            statuses = [client.post("/v1/chat/completions", json=BODY).status_code for _ in range(20)]
            assert f"127.0.0.1:{old_port}" in _ids(base)
            procs.append(
                start_process(
                    kvgate_cmd("worker", "--sim", "--port", str(new_port)), log=tmp_path / "new.log"
                )
            )
            for _ in range(400):
                statuses.append(client.post("/v1/chat/completions", json=BODY).status_code)
                if list(_ids(base)) == [f"127.0.0.1:{new_port}"]:
                    break
        assert list(_ids(base)) == [f"127.0.0.1:{new_port}"]
        assert set(statuses) == {200}
    finally:
        for proc in procs:
            stop_process(proc)
