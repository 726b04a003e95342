"""Layered command-line sources, shared by every ``kvgate`` subcommand and by the gateway's reload.

Lowest precedence first: built-in default < YAML file (``--config``) < ``KVGATE_<FLAG>`` environment
variable < command line.

Reading YAML and environment values needs each option's action, which ``argparse`` keeps private: the
parser's ``_actions`` list and the action classes (``_StoreTrueAction`` …). There is no public way to list
a parser's options; both have been stable since Python 3.2 and are typed in typeshed, and the tests of this
module (``tests/unit/kvgate_core/test_config.py``) pin what is read from them. This is the one place that
reads them.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any, cast

import yaml


class ConfigSourceError(ValueError):
    """A configuration source is unreadable or names an unknown option."""


def load_yaml(path: str) -> dict[str, Any]:
    """The ``option: value`` mapping of a YAML config file (dashes in keys read as underscores)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise ConfigSourceError(f"cannot read config file {path!r}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigSourceError(f"config file {path!r} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigSourceError(f"config file {path!r} must hold a mapping of option: value")
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
        raise ConfigSourceError(
            f"unknown option(s) in config file: {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    for dest, action in known.items():
        if dest in yaml_values:
            out[dest] = _coerce(action, yaml_values[dest])
        env_value = env.get(f"KVGATE_{dest.upper()}")
        if env_value is not None:
            out[dest] = _coerce(action, env_value)
    return out


def parse_layered(
    parser: argparse.ArgumentParser, argv: Sequence[str], env: Mapping[str, str]
) -> argparse.Namespace:
    """Parse ``argv`` with one subcommand's ``parser`` (which has ``--config``), defaults layered."""
    first = parser.parse_args(argv)
    yaml_values = load_yaml(first.config) if first.config else {}
    parser.set_defaults(**layered_defaults(parser, yaml_values, env))
    return parser.parse_args(argv)
