"""The ``kvgate`` command: ``gateway``, ``epp``, ``worker``, ``demo`` and ``loadtest`` subcommands.

This package is the composition root: the one place that may import the gateway, the workers and the load
test together. Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; this module only dispatches. Every flag's sources are layered by
``kvgate_core.config``. A subcommand whose extra is not installed (``kvgate[worker]``,
``kvgate[loadtest]``) still shows in ``--help`` and says what to install when run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvgate_core.config import ConfigSourceError, layered_defaults, load_yaml


class Subcommand(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _gateway() -> Subcommand:
    from gateway import server

    return server


def _epp() -> Subcommand:
    from gateway.epp import cli

    return cli


def _worker() -> Subcommand:
    from workers import cli

    return cli


def _demo() -> Subcommand:
    from kvgate import demo

    return demo


def _loadtest() -> Subcommand:
    from loadtest import cli

    return cli


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand: how to load its module (deferred: each pulls in its own dependencies) and its help."""

    load: Callable[[], Subcommand]
    help: str
    extra: str | None = None  # the install extra it needs beyond the gateway's core


SUBCOMMANDS: Mapping[str, Command] = {
    "gateway": Command(_gateway, "run the OpenAI-compatible gateway"),
    "epp": Command(
        _epp, "run as the Endpoint Picker (Envoy ext_proc) of the Gateway API Inference Extension"
    ),
    "worker": Command(_worker, "run a worker (real engine or --sim)", extra="worker"),
    "demo": Command(_demo, "gateway plus two local workers on 127.0.0.1"),
    "loadtest": Command(_loadtest, "workloads, load driver, fleet launcher, reports", extra="loadtest"),
}


@dataclass(frozen=True, slots=True)
class _Missing:
    """Stands in for a subcommand whose module cannot be imported: it says what to install."""

    name: str
    extra: str | None
    error: ModuleNotFoundError

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        return None

    def run(self, args: argparse.Namespace) -> int:
        hint = f"pip install 'kvgate[{self.extra}]'" if self.extra else "reinstall kvgate"
        sys.stderr.write(f"kvgate {self.name}: {self.error.name!r} is not installed ({hint})\n")
        return 2


def load_subcommand(name: str) -> Subcommand:
    """The module of subcommand ``name``, or a stand-in that names the missing extra."""
    command = SUBCOMMANDS[name]
    try:
        return command.load()
    except ModuleNotFoundError as exc:
        return _Missing(name, command.extra, exc)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="kvgate", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    subs: dict[str, argparse.ArgumentParser] = {}
    for name, command in SUBCOMMANDS.items():
        module = load_subcommand(name)
        help_text = command.help
        if isinstance(module, _Missing):
            help_text += f" (needs kvgate[{command.extra}])"
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--config", help="YAML file of option: value (flags and KVGATE_* override it)")
        module.add_arguments(sub)
        subs[name] = sub
    return parser, subs


def parse(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    """Parse ``argv`` with defaults layered from ``--config`` and ``env``."""
    parser, subs = build_parser()
    first = parser.parse_args(argv)
    sub = subs[first.command]
    yaml_values = load_yaml(first.config) if first.config else {}
    sub.set_defaults(**layered_defaults(sub, yaml_values, env))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in SUBCOMMANDS:
        module = load_subcommand(args_list[0])
        if isinstance(module, _Missing):  # its flags are unknown here: say what to install, not "bad flag"
            return module.run(argparse.Namespace())
    try:
        args = parse(args_list, os.environ)
    except ConfigSourceError as exc:
        print(f"kvgate: {exc}", file=sys.stderr)
        return 2
    return load_subcommand(args.command).run(args)


if __name__ == "__main__":
    raise SystemExit(main())
