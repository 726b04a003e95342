"""SIGTERM: the gateway stops accepting, lets in-flight streams finish within the grace period, then exits."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.integration.gateway_fleet import gateway_fleet
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_sigterm_lets_an_in_flight_stream_finish(tmp_path: Path) -> None:
    body = {"model": "kvgate-sim", "max_tokens": 40, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "tell me a long story"}]}  # fmt: skip
    chunks: list[bytes] = []
    with gateway_fleet(tmp_path, num_workers=1, worker_args=["--decode-tps", "20"]) as fleet:
        gw_proc = fleet.gateway_proc
        assert gw_proc is not None

        def consume() -> None:
            with httpx.stream("POST", fleet.gateway + "/v1/chat/completions", json=body, timeout=30) as r:
                chunks.extend(r.iter_bytes())

        reader = threading.Thread(target=consume)
        reader.start()
        wait_until(lambda: len(chunks) > 0, timeout_s=20)
        gw_proc.send_signal(signal.SIGTERM)
        reader.join(30)
        gw_proc.wait(30)
    text = b"".join(chunks)
    assert text.rstrip().endswith(b"data: [DONE]")
    assert b'"error"' not in text
    assert text.count(b"data: {") >= 40  # every token arrived after SIGTERM was sent
