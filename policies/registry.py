"""Finding plugins by name and building configured policies.

Built-ins are listed in an explicit table (``builtin_plugins``); third-party plugins are entry points of
the group ``kvgate.policies`` whose value is a factory ``(ctx, params) -> Policy | Filter | Scorer |
Picker``. Only the entry point a config names is imported. A registry is an object built by
``make_registry``; nothing here is module-level state.
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any, cast

from policies.api import Filter, Picker, Policy, PolicyContext, Scorer
from policies.builtin import (
    filters,
    least_load,
    pd_disaggregation,
    pickers,
    power_of_two,
    prefix_cache_aware,
    random_choice,
    round_robin,
    scorers,
    session_affinity,
)
from policies.config import PluginSpec, PolicyConfigError, PolicySpec, parse_policy_spec
from policies.pipeline import Pipeline
from policies.plugins import Kind, PluginDef

GROUP = "kvgate.policies"
PIPELINE = "pipeline"
_PROTOCOLS: dict[Kind, type] = {
    Kind.POLICY: Policy,
    Kind.FILTER: Filter,
    Kind.SCORER: Scorer,
    Kind.PICKER: Picker,
}


def builtin_modules() -> tuple[ModuleType, ...]:
    """The built-in modules, in documentation order; each exposes ``PLUGINS: tuple[PluginDef, ...]``."""
    policies = (round_robin, random_choice, least_load, power_of_two, session_affinity, prefix_cache_aware)
    return (*policies, pd_disaggregation, filters, scorers, pickers)


def builtin_plugins() -> tuple[PluginDef, ...]:
    """Every built-in plugin, in documentation order."""
    return tuple(p for m in builtin_modules() for p in m.PLUGINS)


def _dist_name(ep: md.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else f"(unknown distribution providing {ep.value})"


class PolicyRegistry:
    """Built-in and third-party plugins by name; builds policies from specs.

    Raises:
        PolicyConfigError: on construction, when a name is both built in and an entry point, is provided
            by two distributions, or shadows ``pipeline``.
    """

    def __init__(self, builtins: Sequence[PluginDef], entry_points: Iterable[md.EntryPoint]) -> None:
        self._builtins = {p.name: p for p in builtins}
        self._eps: dict[str, md.EntryPoint] = {}
        for ep in entry_points:
            if ep.name in self._builtins or ep.name == PIPELINE:
                raise PolicyConfigError(
                    f"plugin name {ep.name!r} from distribution {_dist_name(ep)} clashes with a built-in; "
                    "rename the entry point"
                )
            seen = self._eps.get(ep.name)
            if seen is not None and seen.value != ep.value:
                raise PolicyConfigError(
                    f"plugin name {ep.name!r} is provided by {_dist_name(seen)} and by {_dist_name(ep)}; "
                    "uninstall one of them"
                )
            self._eps[ep.name] = ep
        self._loaded: dict[str, PluginDef] = {}

    def names(self, kind: Kind) -> list[str]:
        """Built-in names of ``kind`` (plus ``pipeline`` for policies)."""
        names = [n for n, p in self._builtins.items() if p.kind is kind]
        return [*names, PIPELINE] if kind is Kind.POLICY else names

    def third_party(self) -> list[str]:
        """Names of installed entry points (their kind is known only once loaded)."""
        return sorted(self._eps)

    def build(self, raw: str | Mapping[str, Any] | PolicySpec, ctx: PolicyContext) -> Policy:
        """Build the policy ``raw`` describes.

        Raises:
            PolicyConfigError: the spec is malformed, names an unknown plugin, has bad params, or a
                configured third-party plugin fails to import or build.
        """
        spec = raw if isinstance(raw, PolicySpec) else parse_policy_spec(raw)
        if spec.type != PIPELINE:
            return cast(
                Policy, self.build_plugin(PluginSpec(spec.type, spec.name, spec.params), Kind.POLICY, ctx)
            )
        if spec.params:
            raise PolicyConfigError("policy 'pipeline' takes no params; configure filters, scorers, picker")
        picker = spec.picker or PluginSpec("max_score", "max_score")
        return Pipeline(
            spec.name,
            filters=[cast(Filter, self.build_plugin(f, Kind.FILTER, ctx)) for f in spec.filters],
            scorers=[(cast(Scorer, self.build_plugin(s, Kind.SCORER, ctx)), s.weight) for s in spec.scorers],
            picker=cast(Picker, self.build_plugin(picker, Kind.PICKER, ctx)),
        )

    def build_plugin(self, spec: PluginSpec, kind: Kind, ctx: PolicyContext) -> object:
        """Build one plugin instance of ``kind`` (a policy, filter, scorer or picker).

        Raises:
            PolicyConfigError: unknown name, wrong kind, bad params, or a plugin that fails to load.
        """
        plugin = self.plugin(spec.type, kind)
        if plugin.kind is not kind and plugin.source == "builtin":
            raise PolicyConfigError(
                f"{spec.type!r} is a {plugin.kind}, not a {kind}; {self._available(kind)}"
            )
        try:
            obj = plugin.factory(ctx, spec.params)
        except PolicyConfigError:
            raise
        except (TypeError, ValueError, KeyError) as exc:
            raise PolicyConfigError(f"{kind} {spec.type!r} from {plugin.source}: bad params: {exc}") from exc
        if not isinstance(obj, _PROTOCOLS[kind]):
            raise PolicyConfigError(
                f"{spec.type!r} from {plugin.source} built a {type(obj).__name__}, which is not a {kind}"
            )
        return obj

    def plugin(self, name: str, kind: Kind = Kind.POLICY) -> PluginDef:
        """The plugin registered as ``name``, importing it if it is an entry point.

        ``kind`` is what the caller expects; it only shapes error messages (a third-party plugin's kind is
        known once its factory has built something).

        Raises:
            PolicyConfigError: unknown name, or an entry point that fails to import.
        """
        if name in self._builtins:
            return self._builtins[name]
        if name in self._loaded:
            return self._loaded[name]
        ep = self._eps.get(name)
        if ep is None:
            raise PolicyConfigError(f"unknown {kind} {name!r}; {self._available(kind)}")
        try:
            factory = ep.load()
        except Exception as exc:  # any import failure of a configured plugin stops start-up
            raise PolicyConfigError(
                f"plugin {name!r} ({ep.value}) from distribution {_dist_name(ep)} failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not callable(factory):
            raise PolicyConfigError(f"plugin {name!r} from {_dist_name(ep)}: {ep.value} is not callable")
        plugin = PluginDef(name=name, kind=kind, factory=factory, source=_dist_name(ep))
        self._loaded[name] = plugin
        return plugin

    def _available(self, kind: Kind) -> str:
        third = ", ".join(self.third_party()) or "none installed"
        plural = "policies" if kind is Kind.POLICY else f"{kind}s"
        return f"available {plural}: {', '.join(self.names(kind))}; third-party ({GROUP}): {third}"


def make_registry(entry_points: Iterable[md.EntryPoint] | None = None) -> PolicyRegistry:
    """The built-ins plus ``entry_points`` (default: the installed ``kvgate.policies`` group)."""
    eps = md.entry_points(group=GROUP) if entry_points is None else entry_points
    return PolicyRegistry(builtin_plugins(), eps)


def build_policy(
    spec: str | Mapping[str, Any], ctx: PolicyContext, registry: PolicyRegistry | None = None
) -> Policy:
    """Build the configured policy; the gateway calls this once at start-up.

    Args:
        spec: a registered name (``"least_load"``), a JSON object string, or a mapping as in YAML.
        ctx: clock, seeded RNG, logger and block size.
        registry: defaults to ``make_registry()`` (built-ins plus installed entry points).

    Raises:
        PolicyConfigError: the configuration cannot be used; the message lists what is available.
    """
    return (registry or make_registry()).build(spec, ctx)


def available_policies(registry: PolicyRegistry | None = None) -> list[str]:
    """Names usable as ``--policy``: built-in policies, ``pipeline``, and installed third-party plugins.

    Third-party names are listed without importing them, so a filter or scorer plugin appears here too.
    """
    reg = registry or make_registry()
    return [*reg.names(Kind.POLICY), *reg.third_party()]
