"""A stream in flight while its gateway gets SIGTERM: what the client received."""

from __future__ import annotations

import signal
import subprocess
import threading
from typing import Any

import httpx

from tests.support.waiting import wait_until


def stream_across_sigterm(url: str, body: dict[str, Any], proc: subprocess.Popen[bytes]) -> bytes:
    """POST ``body`` (a streaming request) to ``url``, send ``proc`` SIGTERM once the first bytes arrived,
    and return everything the client got before the stream ended (the caller checks how ``proc`` exits)."""
    chunks: list[bytes] = []

    def consume() -> None:
        with httpx.stream("POST", url, json=body, timeout=30) as r:
            chunks.extend(r.iter_bytes())

    reader = threading.Thread(target=consume)
    reader.start()
    wait_until(lambda: len(chunks) > 0, timeout_s=20)
    proc.send_signal(signal.SIGTERM)
    reader.join(30)
    return b"".join(chunks)
