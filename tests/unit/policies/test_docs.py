"""The generated policy docs are up to date, cover every built-in, and their example configs build."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from policies import PolicyContext, build_policy, make_registry
from policies.docs import DEFAULT_OUT, DocstringError, main, module_doc, render_all, sections
from policies.registry import builtin_modules

ALL_PAGES = sorted(DEFAULT_OUT.glob("*.md"))
PAGES = [p for p in ALL_PAGES if p.name != "README.md"]


def test_docs_on_disk_match_the_docstrings() -> None:
    assert main(["--check"]) == 0, "run `python -m policies.docs`"


def test_every_builtin_has_a_page() -> None:
    assert {p.name for p in PAGES} == set(render_all()) - {"README.md"}
    assert len(PAGES) == len(builtin_modules())


@pytest.mark.parametrize("page", ALL_PAGES, ids=[p.stem for p in ALL_PAGES])
def test_example_config_in_docs_builds(page: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S)
    assert blocks, f"{page.name} has no example config"
    for block in blocks:
        spec = yaml.safe_load(block)
        policy = build_policy(spec, PolicyContext(), make_registry([]))
        assert policy.name


@pytest.mark.parametrize("module", builtin_modules(), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_param_is_documented(module: ModuleType) -> None:
    _, parts = sections(module_doc(module))
    for plugin in module.PLUGINS:
        for field in getattr(plugin.params, "__dataclass_fields__", {}):
            assert field in parts["Parameters"], f"{plugin.name}.{field} is not documented"


def test_missing_section_is_reported() -> None:
    with pytest.raises(DocstringError, match="Limitations"):
        sections(
            "Title.\n\nWhat it does:\n  x\nInputs (needs):\n  x\nParameters:\n  x\nExample config:\n  x\n"
        )


def test_check_reports_stale_pages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--check", "--out", str(tmp_path)]) == 0


def test_a_compiled_modules_docstring_is_read_from_its_source(tmp_path: Path) -> None:
    """mypyc-compiled modules (``kvgate_core.native``) have no ``__doc__``: the page comes from the source."""
    (tmp_path / "mod.py").write_text('"""Summary line.\n\nWhat it does:\n    Things.\n"""\n\nX = 1\n')
    module = ModuleType("mod")
    module.__file__ = str(tmp_path / "mod.cpython-311-x86_64-linux-gnu.so")
    assert module_doc(module).startswith("Summary line.")
    module.__doc__ = "Given."
    assert module_doc(module) == "Given."
    module.__doc__, module.__file__ = None, str(tmp_path / "gone.so")
    assert module_doc(module) == ""
