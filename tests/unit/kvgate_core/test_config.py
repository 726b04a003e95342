"""Layered configuration: what ``kvgate_core.config`` reads from argparse's private action list and classes
(flags, lists, types), and the order of the sources."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvgate_core.config import ConfigSourceError, layered_defaults, parse_layered


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--config")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--worker", action="append", default=[])
    p.add_argument("--hosts", nargs="+", default=[])
    p.add_argument("--debug", action="store_true")
    p.add_argument("--no-color", dest="color", action="store_false")
    return p


def test_each_action_kind_is_coerced_as_argparse_would() -> None:
    env = {"KVGATE_PORT": "9001", "KVGATE_WORKER": "http://a:1, http://b:2", "KVGATE_DEBUG": "yes"}
    got = layered_defaults(parser(), {"hosts": ["x", "y"], "color": "off"}, env)
    assert got == {
        "port": 9001, "worker": ["http://a:1", "http://b:2"], "hosts": ["x", "y"], "debug": True, "color": False,
    }  # fmt: skip


def test_environment_beats_yaml_and_the_command_line_beats_both(tmp_path: Path) -> None:
    config = tmp_path / "kvgate.yaml"
    config.write_text("port: 7000\ndebug: true\n", encoding="utf-8")
    args = parse_layered(parser(), ["--config", str(config)], {"KVGATE_PORT": "7001"})
    assert (args.port, args.debug) == (7001, True)
    args = parse_layered(parser(), ["--config", str(config), "--port", "7002"], {"KVGATE_PORT": "7001"})
    assert args.port == 7002


def test_an_unknown_yaml_option_is_named() -> None:
    with pytest.raises(ConfigSourceError, match=r"unknown option.*prot"):
        layered_defaults(parser(), {"prot": 1}, {})
