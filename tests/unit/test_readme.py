"""The user's guides hold: ``docs/configuration.md`` lists every flag of the gateway, worker, epp and demo
commands; the README keeps its two set-up commands and stays a guide, not a notebook; every repository path
the README and the guides name exists."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from kvgate.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
GUIDES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a backticked repository path: under one of the repository's top folders, a file with a known suffix or a
#: folder (ending in ``/``); globs, placeholders and options are not paths
_PATH = re.compile(
    r"`((?:gateway|kvgate_core|kvgate|policies|workers|loadtest|tests|deploy|docs|examples)/"
    r"[\w./-]*?(?:\.(?:py|md|yaml|yml|json|jsonl\.gz|sh|png)|/))`"
)


@pytest.mark.parametrize("command", ["gateway", "worker", "epp", "demo"])
def test_every_flag_is_documented(command: str) -> None:
    _, subs = build_parser()
    flags = [
        a.option_strings[-1]
        for a in subs[command]._actions
        if a.option_strings
        and a.dest != "help"
        and a.help != argparse.SUPPRESS  # internal: not a user's flag
    ]
    missing = [f for f in flags if f"`{f}`" not in CONFIGURATION]
    assert not missing, f"docs/configuration.md lacks {missing}: regenerate the configuration reference"


def test_readme_keeps_the_two_setup_commands_and_stays_short() -> None:
    assert "make demo" in README
    assert "make test" in README
    assert README.count("\n") <= 400


def test_every_path_a_guide_names_exists() -> None:
    missing = [
        f"{guide.relative_to(ROOT)}: {path}"
        for guide in GUIDES
        for path in _PATH.findall(guide.read_text())
        if not (ROOT / path).exists()
    ]
    assert not missing, missing
