"""The ``kvgate`` command: ``gateway``, ``worker``, ``demo`` and ``loadtest`` subcommands.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
this module only dispatches and layers the sources of every flag, lowest precedence first:
built-in default < YAML file (``--config``) < ``KVGATE_<FLAG>`` environment variable < command line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

import yaml

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "gateway": ("gateway.server", "run the OpenAI-compatible gateway"),
    "worker": ("workers.cli", "run a worker (real engine or --sim)"),
    "demo": ("gateway.demo", "gateway plus two local workers on 127.0.0.1"),
    "loadtest": ("loadtest.cli", "workloads, load driver, fleet launcher, reports"),
}


class Subcommand(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


class ConfigError(Exception):
    """A configuration source is unreadable or names an unknown option."""


def _load_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path!r}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of option: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _coerce(action: argparse.Action, raw: Any) -> Any:
    """Convert a YAML/env value with the option's own type, as argparse would."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if isinstance(raw, str):
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        return bool(raw)
    if isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+"):
        items = raw.split(",") if isinstance(raw, str) else list(raw)
        conv = action.type or str
        return [cast(Any, conv)(str(i).strip()) if not isinstance(i, dict) else i for i in items if i != ""]
    if action.type is not None and isinstance(raw, str):
        return cast(Any, action.type)(raw)
    return raw


def layered_defaults(
    parser: argparse.ArgumentParser, yaml_values: Mapping[str, Any], env: Mapping[str, str]
) -> dict[str, Any]:
    """Defaults for ``parser`` from YAML values and ``KVGATE_*`` variables (env wins over YAML)."""
    out: dict[str, Any] = {}
    known = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
    unknown = sorted(set(yaml_values) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown option(s) in config file: {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    for dest, action in known.items():
        if dest in yaml_values:
            out[dest] = _coerce(action, yaml_values[dest])
        env_value = env.get(f"KVGATE_{dest.upper()}")
        if env_value is not None:
            out[dest] = _coerce(action, env_value)
    return out


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="kvgate", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    subs: dict[str, argparse.ArgumentParser] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--config", help="YAML file of option: value (flags and KVGATE_* override it)")
        cast(Subcommand, importlib.import_module(module_name)).add_arguments(sub)
        subs[name] = sub
    return parser, subs


def parse(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    """Parse ``argv`` with defaults layered from ``--config`` and ``env``."""
    parser, subs = build_parser()
    first = parser.parse_args(argv)
    sub = subs[first.command]
    yaml_values = _load_yaml(first.config) if first.config else {}
    sub.set_defaults(**layered_defaults(sub, yaml_values, env))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(args_list, os.environ)
    except ConfigError as exc:
        print(f"kvgate: {exc}", file=sys.stderr)
        return 2
    module = cast(Subcommand, importlib.import_module(SUBCOMMANDS[args.command][0]))
    return module.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
