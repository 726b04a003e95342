"""``kvgate gateway --processes 2``: both processes serve one port, share routing state (a private Redis
under memory state), drain on SIGTERM and exit 0, and a killed process is restarted."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest

from tests.integration.gateway_fleet import Fleet, gateway_fleet
from tests.support.sigterm_stream import stream_across_sigterm
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

PROCESS_ARGS = ("--processes", "2", "--policy", "prefix_cache_aware", "--log-level", "info")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with gateway_fleet(
        tmp_path, num_workers=2, worker_args=["--decode-tps", "200"], gateway_args=PROCESS_ARGS
    ) as f:
        yield f


def children(parent: int) -> list[int]:
    """The gateway processes the parent supervises (its children started with ``--process-index``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"--process-index" in cmdline:
            found.append(int(entry))
    return sorted(found)


def fresh_client(fleet: Fleet) -> openai.OpenAI:
    """A client that opens a new connection per request, so the kernel may hand each to either process."""
    http = openai.DefaultHttpxClient(limits=httpx2.Limits(max_keepalive_connections=0), timeout=30)
    return openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="unused", http_client=http, max_retries=0)


def chat(client: openai.OpenAI, messages: list[dict[str, str]]) -> tuple[str, str, str]:
    """One turn: (answer, worker, gateway process)."""
    raw = client.chat.completions.with_raw_response.create(
        model="kvgate-sim",
        messages=messages,  # type: ignore[arg-type]  # plain dicts are what the API takes
        max_tokens=4,
    )
    answer = raw.parse().choices[0].message.content or ""
    return answer, raw.headers["x-kvgate-worker"], raw.headers["x-kvgate-process"]


def both_seen(client: openai.OpenAI, seen: set[str]) -> bool:
    """Send one request, add the process that served it to ``seen``; whether both processes are in it."""
    seen.add(chat(client, [{"role": "user", "content": "hi"}])[2])
    return seen == {"0", "1"}


def test_both_processes_serve_and_a_conversation_stays_on_its_worker(fleet: Fleet) -> None:
    client = fresh_client(fleet)
    processes: set[str] = set()
    sticky = 0
    for conv in range(4):
        messages = [{"role": "system", "content": f"conversation {conv}: " + "background words " * 40}]
        workers = []
        for turn in range(4):
            messages.append({"role": "user", "content": f"question {turn} of conversation {conv}"})
            answer, worker, process = chat(client, messages)
            messages.append({"role": "assistant", "content": answer})
            workers.append(worker)
            processes.add(process)
        sticky += len(set(workers[1:])) == 1 and workers[1] == workers[0]
    # every later turn of a conversation hits the worker of its first, whichever process took it
    assert sticky == 4
    wait_until(lambda: both_seen(client, processes), timeout_s=60)


def test_sigterm_drains_an_in_flight_stream_and_exits_zero(fleet: Fleet) -> None:
    proc = fleet.gateway_proc
    assert proc is not None
    body = {"model": "kvgate-sim", "max_tokens": 60, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "tell me a long story"}]}  # fmt: skip
    seen: set[str] = set()
    wait_until(lambda: both_seen(fresh_client(fleet), seen), timeout_s=90)  # both serve: start-up done
    # 60 tokens at the workers' 200 tokens/s leave the stream open ~0.3 s
    text = stream_across_sigterm(fleet.gateway + "/v1/chat/completions", body, proc)
    assert proc.wait(40) == 0
    assert text.rstrip().endswith(b"data: [DONE]")
    assert b'"error"' not in text
    assert children(proc.pid) == []


def test_a_killed_process_is_restarted(fleet: Fleet) -> None:
    proc = fleet.gateway_proc
    assert proc is not None
    seen: set[str] = set()
    wait_until(lambda: both_seen(fresh_client(fleet), seen), timeout_s=90)  # both serve: start-up done
    victim = children(proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(children(proc.pid)) == 2 and victim not in children(proc.pid), timeout_s=60)
    assert "restarting gateway process" in fleet.log("gateway.log")
    seen.clear()
    wait_until(lambda: both_seen(fresh_client(fleet), seen), timeout_s=90)
    assert proc.poll() is None
