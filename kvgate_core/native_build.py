"""Build the compiled request path: ``python -m kvgate_core.native_build [build|clean|status] [--optional]``.

``build`` compiles ``kvgate_core.native.MODULES`` with mypyc (mypy's compiler, a dev dependency) in place,
one extension per module plus their shared library, and writes the stamp the import guard checks
(``kvgate_core.native``). It takes about a minute on two cores. ``--optional``: a failed build (no C compiler,
no mypy) prints why and exits 0, leaving plain Python; ``--if-stale``: nothing to do while the build in place
is current. ``clean`` removes what a build wrote; ``status`` says which code this checkout runs.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kvgate_core.native import (
    GROUP,
    MODULES,
    PURE_ENV,
    ROOT,
    STAMP,
    abi,
    compiled_modules,
    fingerprint,
    inspect_build,
    source_of,
)


def clean(root: Path = ROOT) -> None:
    """Remove every compiled extension in kvgate's packages and the stamp: the sources load again."""
    for module in compiled_modules(root):
        base = source_of(module, root).with_suffix("")
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            base.with_name(base.name + suffix).unlink(missing_ok=True)
    (root / STAMP.relative_to(ROOT)).unlink(missing_ok=True)


def build(root: Path = ROOT, *, verbose: bool = False) -> None:
    """Compile ``MODULES`` in place and stamp the build.

    Raises:
        RuntimeError: mypyc or the C compiler failed (nothing compiled is left behind).
    """
    clean(root)
    sources = fingerprint(root)  # what is compiled: read before, so an edit during the build shows as stale
    with tempfile.TemporaryDirectory(prefix="kvgate-native-") as tmp:
        paths = [str(source_of(m, root)) for m in MODULES]
        script = (
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            f"setup(name='kvgate-native', ext_modules=mypycify({paths!r}, target_dir={tmp + '/c'!r}, "
            f"group_name={GROUP!r}, opt_level='3', debug_level='0'), script_args=['-q', 'build_ext', "
            f"'--inplace', '--build-temp', {tmp + '/o'!r}, '--build-lib', {tmp + '/lib'!r}])\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=root, capture_output=not verbose, text=True, check=False,
            env={**os.environ, PURE_ENV: "1"},
        )  # fmt: skip
    if done.returncode != 0:
        clean(root)
        tail = (done.stderr or "")[-3000:]
        raise RuntimeError(f"mypyc build failed (exit {done.returncode}){': ' + tail if tail else ''}")
    stamp = {"python": abi(), "sources": sources}
    (root / STAMP.relative_to(ROOT)).write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kvgate_core.native_build", description=__doc__.split("\n")[0]
    )
    ap.add_argument("command", nargs="?", default="build", choices=["build", "clean", "status"])
    ap.add_argument("--optional", action="store_true", help="a failed build leaves plain Python, exit 0")
    ap.add_argument("--if-stale", action="store_true", help="build only when the current build is not used")
    ap.add_argument("-v", "--verbose", action="store_true", help="show mypyc's and the compiler's output")
    args = ap.parse_args(argv)
    if args.command == "clean":
        clean()
        return 0
    if args.command == "status":
        state = inspect_build()
        sys.stdout.write(("compiled" if state.compiled else f"plain Python: {state.reason}") + "\n")
        return 0
    if args.if_stale and inspect_build(environ={}).compiled:  # current, whether or not this run uses it
        return 0
    try:
        build(verbose=args.verbose)
    except (RuntimeError, OSError) as exc:
        sys.stdout.write(
            f"kvgate: the compiled request path was not built; it runs as plain Python ({exc})\n"
        )
        return 0 if args.optional else 1
    sys.stdout.write(f"kvgate: compiled {len(MODULES)} request-path modules with mypyc\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
