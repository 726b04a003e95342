"""The README's configuration reference lists every flag of the gateway, worker, epp and demo commands."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvgate.cli import build_parser

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


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
    missing = [f for f in flags if f"`{f}`" not in README]
    assert not missing, f"README lacks {missing}: regenerate the configuration reference"


def test_readme_keeps_the_two_setup_commands() -> None:
    assert "make demo" in README
    assert "make test" in README
