"""The byte fallback's block size learned at start: real ``kvgate worker --sim --foreign`` processes (whitespace
words as tokens) behind a gateway on default flags hash one 16-word engine block in bytes; ``--block-size``
skips the probe."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.engines.block_probe import probe_prompts
from tests.support.foreign import foreign_workers
from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "kvgate-sim"


def _chat(text: str) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2}


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with foreign_workers(tmp_path_factory.mktemp("foreign")) as urls:
        yield urls


def _sixteen_words_in_bytes() -> int:
    """One 16-word block of the probe's text in bytes, as the difference of its two prompts tells it,
    rounded to a multiple of 8."""
    short, long = probe_prompts()
    per_word = (len(long.encode()) - len(short.encode())) / (len(long.split()) - len(short.split()))
    return int(per_word * 16 / 8 + 0.5) * 8


@pytest.fixture
def gateway(workers: list[str]) -> Iterator[Callable[..., str]]:
    """Starts a gateway in front of the workers (each ``#kv_tokens=4096``) with extra flags; its base URL."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(log: Path, *extra: str) -> str:
        port = free_port()
        flags = [a for url in workers for a in ("--worker", url + "#kv_tokens=4096")]
        procs.append(start_process(kvgate_cmd("gateway", "--port", str(port), *flags, *extra), log=log))
        base = f"http://127.0.0.1:{port}"
        wait_ready(procs[-1], base + "/ready", logs=log, timeout_s=60)
        return base

    try:
        yield start
    finally:
        for proc in procs:
            stop_process(proc)


def _fallback_line(log: Path) -> str:
    lines = [line for line in log.read_text().splitlines() if "no exact tokenizer" in line]
    assert len(lines) == 1, log.read_text()
    return lines[0]


def test_default_flags_hash_one_engine_block_of_words_in_bytes(
    gateway: Callable[..., str], tmp_path: Path
) -> None:
    log = tmp_path / "gateway.log"
    base = gateway(log)
    expected = _sixteen_words_in_bytes()
    assert expected == 96  # 5.76 bytes per word (its space included) x 16 words = 92.2
    line = _fallback_line(log)
    assert f"({expected}-byte blocks)" in line, line
    learned = re.search(r"learned ([0-9.]+) bytes per engine token \((\S+) usage of 2 of 2 workers\)", line)
    assert learned is not None, line
    assert float(learned.group(1)) == pytest.approx(5.76, abs=0.01)
    assert learned.group(2) == "/v1/completions"
    assert "x 16-token engine blocks" in line

    def units() -> list[dict[str, object]]:
        rows = httpx.get(base + "/admin/workers", timeout=5).json()["workers"]
        return [w["engine"]["units"] for w in rows if w["engine"]["units"]]

    # before any request, the assumed caches are the workers' 4,096 words in the probe's bytes per word
    wait_until(lambda: len(units()) == 2, timeout_s=20)
    for seen in units():
        assert seen["usage_samples"] == 0, seen
        assert seen["gateway_tokens_per_engine_token"] == pytest.approx(5.76, abs=0.01), seen
        assert seen["assumed_capacity_blocks"] == pytest.approx(4096 * 5.76 / expected, rel=0.01), seen
    shown = httpx.get(base + "/admin/ui/state", timeout=5).json()["gateway"]
    assert (shown["block_size"], shown["block_unit"]) == (expected, "bytes"), shown
    reply = httpx.post(base + "/v1/chat/completions", json=_chat("hello"), timeout=30)
    assert reply.status_code == 200, reply.text


def test_block_size_flag_skips_the_probe(gateway: Callable[..., str], tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    gateway(log, "--block-size", "40")
    line = _fallback_line(log)
    assert "(40-byte blocks)" in line and "byte block: --block-size" in line, line


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="--processes shares state via redis-server")
def test_processes_hash_in_the_block_the_parent_learned(gateway: Callable[..., str], tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    gateway(log, "--processes", "2")
    expected = _sixteen_words_in_bytes()
    wait_until(lambda: log.read_text().count("no exact tokenizer") == 3, timeout_s=30)
    lines = [line for line in log.read_text().splitlines() if "no exact tokenizer" in line]
    probed = [line for line in lines if "learned" in line]
    assert len(probed) == 1, lines  # the parent probes; the children are given its block
    assert all(f"({expected}-byte blocks)" in line for line in lines), lines
