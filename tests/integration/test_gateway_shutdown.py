"""SIGTERM: the gateway stops accepting, lets in-flight streams finish within the grace period, then exits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.gateway_fleet import gateway_fleet
from tests.support.sigterm_stream import stream_across_sigterm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_sigterm_lets_an_in_flight_stream_finish(tmp_path: Path) -> None:
    body = {"model": "kvgate-sim", "max_tokens": 40, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "tell me a long story"}]}  # fmt: skip
    with gateway_fleet(tmp_path, num_workers=1, worker_args=["--decode-tps", "20"]) as fleet:
        gw_proc = fleet.gateway_proc
        assert gw_proc is not None
        text = stream_across_sigterm(fleet.gateway + "/v1/chat/completions", body, gw_proc)
        gw_proc.wait(30)
    assert text.rstrip().endswith(b"data: [DONE]")
    assert b'"error"' not in text
    assert text.count(b"data: {") >= 40  # every token arrived after SIGTERM was sent
