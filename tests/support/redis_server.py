"""A real redis-server on a free loopback port, for conformance and integration tests."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.support.procs import free_port, start_process, stop_process
from tests.support.waiting import wait_until


@dataclass
class RedisServer:
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError(
                "redis-server is not installed: run `make test` (it installs it) or apt-get install redis-server"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = start_process(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            log=self.workdir / "redis.log",
        )
        wait_until(self.ping, timeout_s=10)

    def ping(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def new_redis_server(workdir: Path) -> RedisServer:
    server = RedisServer(port=free_port(), workdir=workdir)
    server.start()
    return server
