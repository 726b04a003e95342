"""A real three-node Redis Cluster (no replicas) on free loopback ports, for the tier conformance suite."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.support.procs import free_port, start_process, stop_process
from tests.support.waiting import wait_until


@dataclass
class RedisCluster:
    workdir: Path
    ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self, nodes: int = 3) -> None:
        exe, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if exe is None or cli is None:
            raise RuntimeError("redis-server/redis-cli are not installed: apt-get install redis-server")
        for _ in range(nodes):
            port = free_port()
            node_dir = self.workdir / str(port)
            node_dir.mkdir(parents=True, exist_ok=True)
            # The bus port defaults to port + 10000, which may not exist or be taken: pick it too.
            args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                    "--cluster-port", str(free_port()),
                    "--cluster-config-file", str(node_dir / "nodes.conf"), "--save", "", "--appendonly", "no",
                    "--dir", str(node_dir)]  # fmt: skip
            self.procs.append(start_process(args, log=node_dir / "redis.log"))
            self.ports.append(port)
        wait_until(lambda: all(_ping(p) for p in self.ports), timeout_s=10)
        addrs = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run([cli, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
                       check=True, capture_output=True, timeout=30)  # fmt: skip
        wait_until(self._ok, timeout_s=20)

    def _ok(self) -> bool:
        return all(_state_ok(p) for p in self.ports)

    def flushall(self) -> None:
        for port in self.ports:
            redis.Redis(port=port).flushall()

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)
        self.procs.clear()


def _ping(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=0.5).ping())
    except redis.RedisError:
        return False


def _state_ok(port: int) -> bool:
    try:
        info = redis.Redis(port=port, socket_timeout=0.5, decode_responses=True).cluster("INFO")
    except redis.RedisError:
        return False
    # redis-py parses CLUSTER INFO into a dict; older versions return the raw text.
    return info.get("cluster_state") == "ok" if isinstance(info, dict) else "cluster_state:ok" in str(info)


def new_redis_cluster(workdir: Path) -> RedisCluster:
    cluster = RedisCluster(workdir)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster
