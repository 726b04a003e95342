"""The request path compiled to C with mypyc, and the guard that never lets a stale build run.

``python -m kvgate_core.native_build`` compiles ``MODULES`` (the gateway's per-request code: HTTP server and
client, router, proxy, request parsing, load board, metrics) with mypyc into one extension per module next
to its source, which Python's import system then prefers over the ``.py``; the compiled modules share one
library, ``kvgate_core/native_lib__mypyc…so``. The code stays the same typed Python; compiled, the gateway
executes ~0.56x the instructions per proxied request of plain Python (``loadtest.bench_instructions``).
``make install`` builds it where a C compiler is found; without one everything runs as plain Python.

A build records the SHA-256 of every source it compiled (``STAMP``). On the first import of ``kvgate_core``
(``gateway`` and ``policies`` import it before anything else) ``guard`` compares the record with the sources
on disk; when any differs (a source edited after the build, another checkout) or ``KVGATE_PURE_PYTHON=1``
is set, every listed module is loaded from its source instead: all or none, since compiled modules call each
other directly, not through their module objects. ``guard()`` returns which one runs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: compiled with mypyc, in dependency order; a module here must not be monkeypatched at run time (compiled
#: callers bind each other directly) and must avoid what mypyc does not compile (async generators, classes
#: inheriting builtin types other than ``Exception``)
MODULES: Final = (
    "kvgate_core.tasks",
    "kvgate_core.deadline",
    "kvgate_core.asgi",
    "kvgate_core.spans",
    "kvgate_core.h1_connection",
    "kvgate_core.h1",
    "gateway.proxy.upstream_queue",
    "kvgate_core.h1_server.wire",
    "kvgate_core.h1_server.scope",
    "kvgate_core.h1_server.cycle",
    "kvgate_core.h1_server.protocol",
    "gateway.state.load",
    "gateway.state.recent",
    "gateway.state.memory",
    "gateway.fleet.breaker",
    "gateway.fleet.registry",
    "gateway.observability.series",
    "gateway.observability.metrics",
    "gateway.openai.schema",
    "gateway.openai.sse",
    "gateway.routing.decision_log",
    "gateway.routing.hold",
    "gateway.routing.prefill_watch",
    "gateway.routing.routed",
    "gateway.routing.router",
    "gateway.proxy.disconnect",
    "gateway.proxy.passthrough",
    "gateway.proxy.result",
    "gateway.observability.worker_stats",
    "gateway.engines.affinity",
    "gateway.proxy.responses",
    "gateway.proxy.shaping",
    "gateway.proxy.stream",
    "gateway.proxy.forward",
    "gateway.api.openai_routes",
    "policies.candidates",
    "policies.builtin.round_robin",
)
GROUP: Final = "kvgate_core.native_lib"  # the shared library's module (mypyc appends ``__mypyc``)
PURE_ENV: Final = "KVGATE_PURE_PYTHON"
PACKAGES: Final = ("kvgate_core", "gateway", "policies")  # where compiled extensions may sit
ROOT: Final = Path(__file__).resolve().parent.parent
STAMP: Final = ROOT / "kvgate_core" / "native_stamp.json"


def source_of(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def fingerprint(root: Path = ROOT) -> dict[str, str]:
    """SHA-256 of each listed module's source (missing sources are left out)."""
    out = {}
    for module in MODULES:
        path = source_of(module, root)
        if path.is_file():
            out[module] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@dataclass(frozen=True, slots=True)
class BuildState:
    """What the guard found: ``compiled`` is True when the compiled modules are the ones that load."""

    compiled: bool
    reason: str


def inspect_build(root: Path = ROOT, environ: Mapping[str, str] = os.environ) -> BuildState:
    """Whether the compiled modules may load: built, matching every source, and not turned off."""
    if environ.get(PURE_ENV, "") not in ("", "0"):
        return BuildState(False, f"{PURE_ENV} is set")
    stamp = root / STAMP.relative_to(ROOT)
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return BuildState(False, "not built (python -m kvgate_core.native_build)")
    if not isinstance(recorded, dict) or recorded.get("sources") != fingerprint(root):
        return BuildState(
            False, "stale: a source changed since the build (python -m kvgate_core.native_build)"
        )
    if recorded.get("python") != abi():
        return BuildState(False, f"built for {recorded.get('python')}, this is {abi()}")
    return BuildState(True, "compiled")


class SourceFinder(importlib.abc.MetaPathFinder):
    """Loads ``modules`` from their ``.py`` files even where a compiled extension sits beside them."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = frozenset(modules)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules or path is None:
            return None
        leaf = fullname.rpartition(".")[2] + ".py"
        for entry in path:
            source = os.path.join(entry, leaf)
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None


@functools.cache
def guard() -> BuildState:
    """Decide once per process which code loads: where the build is not current, every compiled module is
    loaded from its source instead (a ``SourceFinder`` first on ``sys.meta_path``), and so is any extension
    the build did not make (one left from an older list of modules)."""
    state = inspect_build()
    from_source = sources_to_force(state, compiled_modules())
    if from_source:
        sys.meta_path.insert(0, SourceFinder(from_source))
    return state


def sources_to_force(state: BuildState, found: Iterable[str]) -> list[str]:
    """Of the modules with a compiled extension on disk, those that must load from source."""
    built = {*MODULES, GROUP + "__mypyc"}
    return sorted(m for m in found if not (state.compiled and m in built))


def compiled_modules(root: Path = ROOT) -> list[str]:
    """The modules of kvgate's packages that have a compiled extension on disk."""
    suffixes = sorted(importlib.machinery.EXTENSION_SUFFIXES, key=len, reverse=True)
    found = set()
    for package in PACKAGES:
        for suffix in suffixes:
            for path in (root / package).rglob("*" + suffix):
                ext = next(s for s in suffixes if path.name.endswith(s))  # the longest that fits
                found.add(".".join(path.relative_to(root).with_name(path.name[: -len(ext)]).parts))
    return sorted(found)


def loaded_compiled(module: str) -> bool:
    """Whether ``module`` (imported) runs from a compiled extension."""
    origin = getattr(sys.modules.get(module), "__file__", None) or ""
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def abi() -> str:
    """What a build is bound to: the interpreter's cache tag and the platform."""
    return f"{sys.implementation.cache_tag}-{sys.platform}"
