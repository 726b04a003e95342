"""The gateway's CPU work per proxied request as instructions counted by callgrind: a figure the machine's
noise does not move, for comparing two versions of the code side by side.

Wall-clock CPU figures (``loadtest.bench_proxy``) swing by ±15% between runs on a shared VM, more than most
single changes save. Callgrind counts the instructions the gateway process executes in user space; the
same code, request and fleet give the same count to within ~1% whatever else the machine runs. It does not
see the kernel's share (socket writes and reads, ~20% of the gateway's CPU on loopback), and an instruction
is not a fixed time, so report the count next to a ``bench_proxy`` figure, not instead of it.

For each checkout (the working tree as ``current``, and ``--baseline REF`` checked out with ``git worktree``
into a temporary folder, its request path compiled first where this tree runs compiled, unless
``--plain-baseline``) and each mode and fleet size: N instant mock workers (``bench_proxy``'s), one
gateway (``round_robin``, no tokenizer, unless ``--gateway-arg`` says otherwise) under
``valgrind --tool=callgrind`` with counting off; a warm-up; counting on for ``--requests`` requests at
``--connections`` connections; then counting on again for an idle stretch as long as the loaded one, whose
instructions (health probes, timers) are subtracted. Needs valgrind (Debian's ``valgrind`` package).

Usage: ``python -m loadtest.bench_instructions [--baseline HEAD] [--workers 4,16] [--modes
non-stream,stream] [--requests 1000]``. A cell takes ~20 s (the gateway starts ~20x slower under valgrind).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate_core.native import guard
from loadtest.bench_proxy import MODES, client_cell, start_workers, stop_procs, wait_http
from loadtest.fleet import free_port

_TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)
_TRIGGER = re.compile(rb"^desc: Trigger: (?:dump|Client Request:) (\S+)", re.MULTILINE)
_WARM_UP = 200


@dataclass(frozen=True, slots=True)
class Cell:
    """One checkout, mode and fleet size: instructions per request net of idle, and the idle share."""

    tree: str
    mode: str
    workers: int
    requests: int
    per_request: float
    idle_per_request: float


@contextlib.contextmanager
def checkout(ref: str, *, compiled: bool = False) -> Iterator[Path]:
    """``ref`` checked out (detached) in a temporary worktree, removed afterwards; ``compiled``: with its
    request path compiled as ``make native`` builds it (where ``ref`` has one), to compare like with like."""
    root = Path(subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip())
    path = Path(tempfile.mkdtemp(prefix="kvgate-baseline-"))
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "--force", str(path), ref],
                   check=True, capture_output=True)  # fmt: skip
    try:
        if compiled and (path / "kvgate_core" / "native_build.py").is_file():
            build = [sys.executable, "-m", "kvgate_core.native_build", "build", "--optional"]
            subprocess.run(build, cwd=path, check=True, timeout=900)
        yield path
    finally:
        remove = ["git", "-C", str(root), "worktree", "remove", "--force", str(path)]
        subprocess.run(remove, capture_output=True)
        shutil.rmtree(path, ignore_errors=True)


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=60)


def _dumped(out: Path, name: str) -> int:
    """The instruction total of the dump triggered as ``name`` (``callgrind_control -d name``)."""
    for _ in range(100):
        for path in out.parent.glob(out.name + ".*"):
            data = path.read_bytes()
            trigger, totals = _TRIGGER.search(data), _TOTALS.search(data)
            if trigger and trigger.group(1).decode() == name and totals:
                return int(totals.group(1))
        time.sleep(0.1)  # the dump is written by the gateway's process, asynchronously
    raise RuntimeError(f"no callgrind dump named {name!r} next to {out}")


def measure(tree: str, src: Path, mode: str, workers: int, args: argparse.Namespace, logs: Path) -> Cell:
    """One cell (see the module docstring)."""
    procs, ports = start_workers("mock", workers, logs)
    port = free_port()
    out = logs / f"callgrind-{tree}-{mode}-{workers}.out"
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
            sys.executable, "-m", "kvgate.cli", "gateway", "--port", str(port), "--policy", args.policy,
            "--tokenizer", "none", *[f"--worker=http://127.0.0.1:{p}" for p in ports],
            *args.gateway_arg]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(src)}
    log = logs / f"gateway-{tree}-{mode}-{workers}.log"
    with open(log, "wb") as fh:
        gateway = subprocess.Popen(argv, cwd=src, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", timeout_s=300)
        client_cell(port, 8, 120.0, mode, _WARM_UP, (64, 1.0))
        _control(gateway.pid, "-z")
        _control(gateway.pid, "-i", "on")
        start = time.monotonic()
        cell = client_cell(port, args.connections, 600.0, mode, args.requests, (64, 1.0))
        loaded_s = time.monotonic() - start
        _control(gateway.pid, "-i", "off")
        _control(gateway.pid, "-d", "load")
        loaded = _dumped(out, "load")
        _control(gateway.pid, "-z")
        _control(gateway.pid, "-i", "on")
        time.sleep(loaded_s)
        _control(gateway.pid, "-i", "off")
        _control(gateway.pid, "-d", "idle")
        idle = _dumped(out, "idle")
    finally:
        stop_procs([gateway, *procs])
    if cell["errors"]:
        raise RuntimeError(f"{tree} {mode}: {cell['errors']:.0f} requests failed (see {log})")
    requests = int(cell["requests"] + cell.get("warm", 0.0))
    return Cell(tree, mode, workers, requests, (loaded - idle) / requests, idle / requests)


def table(cells: Sequence[Cell]) -> str:
    """The cells, with each one's ratio to the baseline's same mode and fleet size."""
    base = {(c.mode, c.workers): c.per_request for c in cells if c.tree == "baseline"}
    rows = [
        "| checkout | mode | workers | requests | instructions/request | idle/request | vs baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        ref = base.get((c.mode, c.workers))
        ratio = f"{c.per_request / ref:.2f}x" if ref and c.tree != "baseline" else ""
        rows.append(f"| {c.tree} | {c.mode} | {c.workers} | {c.requests} | {c.per_request:,.0f} | "
                    f"{c.idle_per_request:,.0f} | {ratio} |")  # fmt: skip
    return "\n".join(rows)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--baseline", default=None, help="a git ref measured beside the working tree (e.g. HEAD)")
    ap.add_argument("--workers", default="4", help="fleet sizes, comma-separated (default 4)")
    ap.add_argument("--modes", default="non-stream,stream", help=f"of {', '.join(MODES[:2])}")
    ap.add_argument("--requests", type=int, default=1000, help="counted requests per cell (default 1000)")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--policy", default="round_robin")
    ap.add_argument("--gateway-arg", action="append", default=[], help="an extra gateway flag (repeatable)")
    ap.add_argument("--plain-baseline", action="store_true",
                    help="the baseline as plain Python even where this tree runs compiled")  # fmt: skip
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is missing (Debian/Ubuntu: apt-get install valgrind)", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES[:2]):
        print(f"unknown modes: {sorted(unknown)}", file=sys.stderr)
        return 2
    sizes = [int(n) for n in args.workers.split(",") if n]
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp, contextlib.ExitStack() as stack:
        trees = [("current", Path(__file__).resolve().parents[1])]  # this checkout's root
        if args.baseline:
            compiled = not args.plain_baseline and guard().compiled  # as the working tree runs
            trees.append(("baseline", stack.enter_context(checkout(args.baseline, compiled=compiled))))
        for mode in modes:
            for size in sizes:
                for tree, src in trees:
                    cell = measure(tree, src, mode, size, args, Path(tmp))
                    print(f"{tree} {mode} {size} workers: {cell.per_request:,.0f} instructions/request",
                          file=sys.stderr, flush=True)  # fmt: skip
                    cells.append(cell)
    print(f"gateway instructions per request (callgrind, user space; policy {args.policy}, "
          f"{args.connections} connections)")  # fmt: skip
    print(table(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
