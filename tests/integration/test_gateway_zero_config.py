"""Zero-configuration start: ``kvgate gateway --worker URL`` in front of a server that is not a kvgate worker,
and start-up errors as one line on stderr with exit code 2."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.procs import REPO, free_port, kvgate_cmd, start_process, stop_process
from tests.support.tokenizer import train_tiny_tokenizer
from tests.support.waiting import http_ok, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _plain_server(port: int, log: Path, root: Path | None = None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tests.support.plain_openai", "--port", str(port)]
    if root is not None:
        cmd += ["--root", str(root)]
    proc = start_process(cmd, log=log)
    wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health"), timeout_s=30)
    return proc


def _start_gateway(worker: str, log: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = start_process(kvgate_cmd("gateway", "--port", str(port), "--worker", worker, *extra), log=log)
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(base + "/ready") or proc.poll() is not None, timeout_s=60)
    assert proc.poll() is None, log.read_text()
    return proc, base


def test_starts_with_no_flag_but_worker_and_warns_once(tmp_path: Path) -> None:
    wport = free_port()
    procs = [_plain_server(wport, tmp_path / "w.log")]
    try:
        gw, base = _start_gateway(f"http://127.0.0.1:{wport}", tmp_path / "gw.log")
        procs.append(gw)
        reply = httpx.post(
            base + "/v1/chat/completions",
            json={"model": "plain-model", "messages": [{"role": "user", "content": "hello there"}]},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == "hello there"
        log = (tmp_path / "gw.log").read_text()
        warnings = [line for line in log.splitlines() if "WARNING" in line and "tokenizer" in line]
        assert len(warnings) == 1, log
        assert "--tokenizer PATH" in warnings[0]
        assert "(64-byte blocks)" in warnings[0]  # about one 16-token engine block, not 16 bytes
        assert "Traceback" not in log
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def test_loads_the_tokenizer_of_the_model_directory_the_engine_names(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    train_tiny_tokenizer(model_dir)
    wport = free_port()
    procs = [_plain_server(wport, tmp_path / "w.log", root=model_dir)]
    try:
        gw, base = _start_gateway(f"http://127.0.0.1:{wport}", tmp_path / "gw.log", "--log-level", "info")
        procs.append(gw)
        log = (tmp_path / "gw.log").read_text()
        assert "no exact tokenizer" not in log, log
        assert f"model directory {model_dir}" in log, log
        reply = httpx.post(
            base + "/v1/chat/completions",
            json={"model": "plain-model", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def test_a_taken_port_is_one_line_and_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            kvgate_cmd("gateway", "--port", str(port), "--worker", "http://127.0.0.1:9", "--tokenizer", "bytes"),
            cwd=REPO, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert [line for line in err.splitlines() if line.strip()] == [
        f"kvgate gateway: --host 127.0.0.1 --port {port}: cannot listen there (Address already in use)"
    ]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--tokenizer", "/nonexistent/tokenizer.json"], "--tokenizer"),
        (["--state", "postgres://x"], "--state"),
        (["--policy", "no_such_policy"], "--policy"),
        (["--role-pools", "bogus=1"], "--role-pools"),
        (["--worker", "ftp://127.0.0.1:1"], "worker URL"),
        (["--worker", "http://127.0.0.1:1#engine=nope"], "engine must be one of"),
    ],
)
def test_configuration_errors_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    worker = [] if "--worker" in args else ["--worker", "http://127.0.0.1:9"]
    done = subprocess.run(
        kvgate_cmd("gateway", "--port", str(free_port()), *worker, *args),
        cwd=REPO, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert says in lines[0]
