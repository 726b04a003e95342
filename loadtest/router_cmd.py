"""Routers to benchmark side by side with kvgate: command templates, peer presets, process-tree CPU.

A router is a name and a command template with placeholders: ``{port}`` (where it must listen),
``{workers}`` (the worker base URLs, space-separated, each a separate argument), ``{metrics_port}`` (a
second free port, for routers that open a metrics listener of their own). The template is split like a
shell command line (``shlex``) and run without a shell, so the process measured is the router itself.
Presets cover the Rust peers installed in a venv of their own (``pip install vllm-router==0.1.17
sglang-router==0.3.2``): ``vllm-router`` and ``sglang-router``, each optionally ``:POLICY``.

Nothing here starts processes; ``loadtest.bench_proxy`` does.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: the peer routers' launch templates; ``{venv}`` is ``--peer-venv`` and ``{policy}`` the preset's policy
PEER_TEMPLATES: Final[Mapping[str, str]] = {
    "vllm-router": "{venv}/bin/vllm-router --host 127.0.0.1 --port {port} --worker-urls {workers} "
    "--policy {policy} --prometheus-host 127.0.0.1 --prometheus-port {metrics_port} --log-level warning",
    "sglang-router": "{venv}/bin/python -m sglang_router.launch_router --host 127.0.0.1 --port {port} "
    "--worker-urls {workers} --policy {policy} --prometheus-host 127.0.0.1 "
    "--prometheus-port {metrics_port} --log-level warn",
}
PEER_POLICIES: Final = ("round_robin", "cache_aware")
_PLACEHOLDERS: Final = ("port", "workers", "metrics_port")


@dataclass(frozen=True, slots=True)
class RouterCommand:
    """A router to benchmark: its name in the tables, its command template and the path that answers 200
    once it serves."""

    name: str
    template: str
    ready_path: str = "/health"

    def render(self, port: int, workers: Sequence[str], metrics_port: int) -> list[str]:
        """The argv to start it with.

        Raises:
            ValueError: the template names a placeholder other than ``{port}``, ``{workers}``,
                ``{metrics_port}``, or lacks ``{port}``.
        """
        if "{port}" not in self.template:
            raise ValueError(f"router {self.name!r}: its command must contain {{port}}")
        marker = "\x00workers\x00"
        try:
            text = self.template.format(port=port, workers=marker, metrics_port=metrics_port)
        except (KeyError, IndexError) as exc:
            known = ", ".join("{" + p + "}" for p in _PLACEHOLDERS)
            raise ValueError(f"router {self.name!r}: unknown placeholder {exc} (known: {known})") from None
        argv: list[str] = []
        for arg in shlex.split(text):
            argv.extend(workers if arg == marker else [arg.replace(marker, " ".join(workers))])
        return argv


def parse_router_cmd(spec: str) -> RouterCommand:
    """``NAME=COMMAND`` (from ``--router-cmd``).

    Raises:
        ValueError: no ``=``, an empty name or command.
    """
    name, sep, template = spec.partition("=")
    if not sep or not name.strip() or not template.strip():
        raise ValueError(f"--router-cmd {spec!r}: expected NAME=COMMAND with {{port}} and {{workers}}")
    return RouterCommand(name.strip(), template.strip())


def peer_command(spec: str, venv: Path) -> RouterCommand:
    """A preset: ``vllm-router`` or ``sglang-router``, optionally ``:round_robin`` (default) or
    ``:cache_aware``; its executables come from ``venv``.

    Raises:
        ValueError: an unknown preset or policy.
    """
    peer, _, policy = spec.partition(":")
    policy = policy or "round_robin"
    if peer not in PEER_TEMPLATES:
        raise ValueError(f"--peer {peer!r}: known peers are {', '.join(PEER_TEMPLATES)}")
    if policy not in PEER_POLICIES:
        raise ValueError(f"--peer {spec!r}: policy must be one of {', '.join(PEER_POLICIES)}")
    template = PEER_TEMPLATES[peer].replace("{venv}", str(venv)).replace("{policy}", policy)
    name = peer if policy == "round_robin" else f"{peer} {policy}"
    return RouterCommand(name, template)


def _ppid_and_cpu_ticks(pid: int) -> tuple[int, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[1]), int(fields[11]) + int(fields[12])


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and every live descendant (all their threads), from
    ``/proc/<pid>/stat``: a multi-process router (kvgate ``--processes``, its private Redis) counts whole."""
    procs: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (info := _ppid_and_cpu_ticks(int(entry))) is not None:
            procs[int(entry)] = info
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    ticks, stack = 0, [root]
    while stack:
        pid = stack.pop()
        if pid in procs:
            ticks += procs[pid][1]
        stack.extend(children.get(pid, ()))
    return ticks / os.sysconf("SC_CLK_TCK")
