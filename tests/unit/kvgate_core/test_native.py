"""The compiled request path's guard: a build is used only while it matches every source, and a module
with a compiled extension beside it loads from source whenever the build is not used."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import sys
from pathlib import Path

import pytest

from kvgate_core import native, native_build
from kvgate_core.native import MODULES, PURE_ENV, BuildState, SourceFinder, abi, fingerprint, inspect_build

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _tree(root: Path) -> Path:
    """A checkout with every compiled module's source (a line each) and a current stamp."""
    for module in MODULES:
        path = native.source_of(module, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"NAME = {module!r}\n")
    stamp = root / native.STAMP.relative_to(native.ROOT)
    stamp.write_text(json.dumps({"python": abi(), "sources": fingerprint(root)}))
    return stamp


def test_a_current_build_is_used(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert inspect_build(tmp_path, environ={}) == BuildState(True, "compiled")


def test_an_edited_source_makes_the_whole_build_unused(tmp_path: Path) -> None:
    _tree(tmp_path)
    native.source_of("gateway.routing.router", tmp_path).write_text("NAME = 'edited'\n")
    state = inspect_build(tmp_path, environ={})
    assert not state.compiled and state.reason.startswith("stale")


def test_no_stamp_another_interpreter_or_the_switch_mean_plain_python(tmp_path: Path) -> None:
    assert inspect_build(tmp_path, environ={}).reason.startswith("not built")
    stamp = _tree(tmp_path)
    assert not inspect_build(tmp_path, environ={PURE_ENV: "1"}).compiled
    assert inspect_build(tmp_path, environ={PURE_ENV: "0"}).compiled
    stamp.write_text(json.dumps({"python": "cpython-00-plan9", "sources": fingerprint(tmp_path)}))
    assert "cpython-00-plan9" in inspect_build(tmp_path, environ={}).reason
    stamp.write_text("not json")
    assert not inspect_build(tmp_path, environ={}).compiled


def test_what_loads_from_source() -> None:
    found = ["gateway.routing.router", "gateway.old_module"]
    # current build: only an extension the build did not make (left from an older module list)
    assert native.sources_to_force(BuildState(True, "compiled"), found) == ["gateway.old_module"]
    # build not used: every extension found
    assert native.sources_to_force(BuildState(False, "stale"), found) == sorted(found)


def test_compiled_modules_are_found_by_their_extension(tmp_path: Path) -> None:
    (tmp_path / "gateway" / "routing").mkdir(parents=True)
    (tmp_path / "gateway" / "routing" / f"router{SUFFIX}").write_bytes(b"")
    (tmp_path / "policies").mkdir()
    assert native.compiled_modules(tmp_path) == ["gateway.routing.router"]


def test_the_source_finder_loads_the_py_where_an_extension_sits_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "kvgate_native_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("ORIGIN = 'source'\n")
    (package / f"mod{SUFFIX}").write_bytes(b"not a shared library")  # what the import system prefers
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("kvgate_native_probe", "kvgate_native_probe.mod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError):
        importlib.import_module("kvgate_native_probe.mod")
    monkeypatch.delitem(sys.modules, "kvgate_native_probe.mod", raising=False)
    monkeypatch.setattr(sys, "meta_path", [SourceFinder(["kvgate_native_probe.mod"]), *sys.meta_path])
    module = importlib.import_module("kvgate_native_probe.mod")
    assert module.ORIGIN == "source"
    assert module.__file__ == str(package / "mod.py")


@pytest.mark.skipif(
    os.environ.get("KVGATE_EXPECT_COMPILED") != "1", reason="KVGATE_EXPECT_COMPILED=1 is unset"
)
def test_the_installed_checkout_runs_the_compiled_request_path() -> None:
    """CI sets KVGATE_EXPECT_COMPILED=1: ``make install`` must have built a current build, and it loads."""
    assert native.guard().compiled, native.guard().reason
    import gateway.routing.router  # noqa: F401

    assert native.loaded_compiled("gateway.routing.router")


def test_this_process_loads_what_the_guard_decided() -> None:
    import gateway.proxy.forward  # noqa: F401

    assert native.loaded_compiled("gateway.proxy.forward") == native.guard().compiled


def _builds(monkeypatch: pytest.MonkeyPatch, *, current: bool, fails: bool = False) -> list[bool]:
    calls: list[bool] = []

    def build(verbose: bool = False) -> None:
        calls.append(verbose)
        if fails:
            raise RuntimeError("no C compiler")

    monkeypatch.setattr(native_build, "build", build)
    state = BuildState(True, "compiled") if current else BuildState(False, "stale")
    monkeypatch.setattr(native_build, "inspect_build", lambda environ=None: state)
    return calls


def test_if_stale_builds_only_when_the_build_is_not_current(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _builds(monkeypatch, current=True)
    assert native_build.main(["--if-stale"]) == 0 and calls == []
    calls = _builds(monkeypatch, current=False)
    assert native_build.main(["--if-stale", "-v"]) == 0 and calls == [True]


def test_a_failed_build_is_an_error_unless_optional(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _builds(monkeypatch, current=False, fails=True)
    assert native_build.main(["build"]) == 1
    assert native_build.main(["build", "--optional"]) == 0
    assert "runs as plain Python (no C compiler)" in capsys.readouterr().out


def _summary(path: Path) -> str:
    """The first paragraph of a module's docstring."""
    import ast

    return (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").split("\n\n")[0]


def test_compiled_modules_say_so_and_no_other_module_does() -> None:
    """Every module in ``MODULES`` says "Compiled with mypyc" in its docstring's first paragraph, with the
    pointer to the rules (``docs/development.md``); a module that says it is compiled is in ``MODULES``."""
    listed = set(native.MODULES)
    unmarked = [m for m in native.MODULES if "Compiled with mypyc" not in _summary(native.source_of(m))]
    no_pointer = [m for m in native.MODULES if "docs/development.md" not in _summary(native.source_of(m))]
    claiming = []
    for package in native.PACKAGES:
        for path in (native.ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(native.ROOT).with_suffix("").parts)
            if module not in listed and "compiled with mypyc" in _summary(path).lower():
                claiming.append(module)
    assert (unmarked, no_pointer, claiming) == ([], [], [])
    assert (native.ROOT / "docs" / "development.md").is_file()
