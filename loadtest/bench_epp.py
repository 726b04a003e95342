"""``python -m loadtest.bench_epp``: what ``kvgate epp`` adds behind a real Envoy, next to gateway mode.

Starts two sim workers, ``kvgate epp`` (plaintext gRPC) behind Envoy (the Inference Extension's config,
``override_host``), Envoy alone (round robin, no ext_proc) and ``kvgate gateway``, all on loopback. Prints:

- latency, one sequential client over keep-alive HTTP/1.1, p50/p99 in ms per body size, for each path
  (the worker's own time is in every row: compare rows, not absolute values);
- routing quality on a multi-turn workload (interleaved conversations sharing nothing but their own
  history): the prompt tokens the workers report cached, through Envoy + picker and through the gateway.

Needs Envoy: ``$KVGATE_ENVOY`` or ``.envoy/venv/bin/envoy`` (``make envoy-lane``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import yaml

from loadtest.envoy_config import OVERRIDE_HOST, PLAIN, envoy_config

MODEL = "kvgate-sim"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited before {url} was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(url)


@contextlib.contextmanager
def _procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)


def _start(procs: list[subprocess.Popen[bytes]], args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(list(args), stdout=log.open("wb"), stderr=subprocess.STDOUT)
    procs.append(proc)
    return proc


def _kvgate(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvgate.cli", *args]


def _chat(content: str, max_tokens: int = 1) -> dict[str, object]:
    return {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}]}


def latency_ms(base: str, body: dict[str, object], n: int) -> tuple[float, float]:
    """p50 and p99 of ``n`` sequential requests (after 3 warm-ups)."""
    samples = []
    with httpx.Client(base_url=base, timeout=60) as client:
        for i in range(n + 3):
            start = time.perf_counter()
            client.post("/v1/chat/completions", json=body)
            if i >= 3:
                samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def hit_rate(base: str, conversations: int, turns: int, tag: str) -> float:
    """Cached prompt tokens / prompt tokens over interleaved multi-turn chats."""
    histories = [
        [{"role": "system", "content": f"[{tag} {c}] You are a helpful assistant. " * 20}]
        for c in range(conversations)
    ]
    cached = prompt = 0
    with httpx.Client(base_url=base, timeout=60) as client:
        for turn in range(turns):
            for history in histories:
                history.append({"role": "user", "content": f"turn {turn}: and then?"})
                r = client.post(
                    "/v1/chat/completions", json={"model": MODEL, "max_tokens": 8, "messages": history}
                )
                usage = r.json()["usage"]
                history.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
                prompt += usage["prompt_tokens"]
                cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return cached / prompt if prompt else 0.0


def _envoy(
    procs: list[subprocess.Popen[bytes]], logs: Path, mode: str, epp_port: int, workers: Sequence[str]
) -> str:
    binary = os.environ.get("KVGATE_ENVOY") or ".envoy/venv/bin/envoy"
    listen, admin = _port(), _port()
    cfg = envoy_config(
        mode,
        listen_port=listen,
        admin_port=admin,
        epp_port=epp_port,
        workers=workers,
        failure_mode_allow=False,
    )
    path = logs / f"envoy-{mode}-{listen}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = _start(
        procs,
        [binary, "-c", str(path), "--concurrency", "1", "--log-level", "error", "--use-dynamic-base-id"],
        logs / f"envoy-{listen}.log",
    )
    _wait(f"http://127.0.0.1:{admin}/ready", proc)
    return f"http://127.0.0.1:{listen}"


def _epp(procs: list[subprocess.Popen[bytes]], logs: Path, workers: Sequence[str], mode: str) -> int:
    grpc_port, metrics = _port(), _port()
    args = [
        "epp",
        "--grpc-port",
        str(grpc_port),
        "--grpc-health-port",
        "0",
        "--metrics-port",
        str(metrics),
        "--secure-serving",
        "off",
        "--response-mode",
        mode,
        *(f"--worker=http://{w}" for w in workers),
    ]
    proc = _start(procs, _kvgate(*args), logs / f"epp-{mode}.log")
    _wait(f"http://127.0.0.1:{metrics}/ready", proc)
    return grpc_port


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=200, help="requests per latency cell")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="bench_epp-"))
    with _procs() as procs:
        workers = []
        for i in range(2):
            port = _port()
            _wait(
                f"http://127.0.0.1:{port}/health",
                _start(procs, _kvgate("worker", "--sim", "--port", str(port)), logs / f"w{i}.log"),
            )
            workers.append(f"127.0.0.1:{port}")
        gw_port = _port()
        gw = _start(
            procs,
            _kvgate("gateway", "--port", str(gw_port), *(f"--worker=http://{w}" for w in workers)),
            logs / "gw.log",
        )
        _wait(f"http://127.0.0.1:{gw_port}/ready", gw)
        paths = {
            "direct to a worker": f"http://{workers[0]}",
            "Envoy alone (round robin)": _envoy(procs, logs, PLAIN, 1, workers),
            "Envoy + kvgate epp (full)": _envoy(
                procs, logs, OVERRIDE_HOST, _epp(procs, logs, workers, "full"), workers
            ),
            "Envoy + kvgate epp (none)": _envoy(
                procs, logs, OVERRIDE_HOST, _epp(procs, logs, workers, "none"), workers
            ),
            "kvgate gateway": f"http://127.0.0.1:{gw_port}",
        }
        bodies = {"small": _chat("Hello there, how are you?"), "1 MB": _chat("z " * 500_000)}
        print(f"latency, ms (p50 / p99, {args.requests} sequential requests each, 2 sim workers)")
        print(f"{'path':30s}" + "".join(f"{name:>20s}" for name in bodies))
        for name, base in paths.items():
            cells = [
                latency_ms(base, body, args.requests if size == "small" else max(20, args.requests // 10))
                for size, body in bodies.items()
            ]
            print(f"{name:30s}" + "".join(f"{p50:>11.2f} / {p99:<6.2f}" for p50, p99 in cells))
        print(f"\nrouting quality: {args.conversations} interleaved conversations x {args.turns} turns")
        for name in ("Envoy + kvgate epp (full)", "kvgate gateway"):
            rate = hit_rate(paths[name], args.conversations, args.turns, name)
            print(f"{name:30s} cached/prompt tokens = {rate:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
