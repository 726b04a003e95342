"""How a plugin is described to the registry: its name, its kind, its factory and its params dataclass."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from policies.api import PolicyContext
from policies.config import parse_params

P = TypeVar("P")
X = TypeVar("X")

Factory = Callable[[PolicyContext, Mapping[str, Any]], object]
"""``(ctx, params) -> Policy | Filter | Scorer | Picker``; also the shape of an entry point's value."""


class Kind(StrEnum):
    """What a plugin builds."""

    POLICY = "policy"
    FILTER = "filter"
    SCORER = "scorer"
    PICKER = "picker"


@dataclass(frozen=True, slots=True)
class PluginDef:
    """A registered plugin type.

    Attributes:
        name: the type name used in config.
        kind: what the factory builds.
        factory: ``(ctx, params) -> instance``; validates ``params`` itself.
        params: the params dataclass (None when the plugin takes none or is third-party).
        source: ``builtin`` or the distribution that provides it.
    """

    name: str
    kind: Kind
    factory: Factory
    params: type | None = None
    source: str = "builtin"


def define(name: str, kind: Kind, params: type[P], build: Callable[[PolicyContext, P], X]) -> PluginDef:
    """A built-in ``PluginDef`` whose factory validates params into ``params`` and calls ``build``."""

    def factory(ctx: PolicyContext, raw: Mapping[str, Any]) -> X:
        return build(ctx, parse_params(params, raw, f"{kind} {name!r}"))

    return PluginDef(name=name, kind=kind, factory=factory, params=params)


@dataclass(frozen=True, slots=True)
class NoParams:
    """For plugins that take no params."""
