"""Policy configuration: the spec shapes, their parsing, and params validation into dataclasses.

A policy is configured by name (``--policy least_load``) or by a mapping (YAML ``policy:`` block, or a JSON
object string in ``KVGATE_POLICY``)::

    policy:
      type: pipeline
      filters: [healthy, {type: max_queue, params: {max_queue_depth: 32}}]
      scorers:
        - {type: prefix_hit, weight: 3}
        - {type: queue_depth, name: short_queues, weight: 1, params: {saturation: 16}}
      picker: max_score

Every mistake (an unknown key, a wrong type, a bad value, a duplicate instance name) raises
``PolicyConfigError`` at start-up with a message that says what is allowed. Nothing falls back silently.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

_POLICY_KEYS = ("type", "name", "params", "filters", "scorers", "picker")
_PIPELINE_ONLY = ("filters", "scorers", "picker")
_PLUGIN_KEYS = ("type", "name", "params", "weight")


class PolicyConfigError(ValueError):
    """A policy configuration cannot be used; the message says what is wrong and what is available."""


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """One configured plugin instance: its registered ``type``, its instance ``name``, params, weight."""

    type: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A configured policy. ``filters``/``scorers``/``picker`` are only used when ``type`` is ``pipeline``."""

    type: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    filters: tuple[PluginSpec, ...] = ()
    scorers: tuple[PluginSpec, ...] = ()
    picker: PluginSpec | None = None


def parse_policy_spec(raw: str | Mapping[str, Any]) -> PolicySpec:
    """Parse ``raw`` (a registered name, a JSON object string, or a mapping) into a ``PolicySpec``.

    A mapping of the single key ``policy`` is unwrapped, so a whole YAML config block can be passed.

    Raises:
        PolicyConfigError: the spec is malformed.
    """
    if isinstance(raw, str):
        text = raw.strip()
        if not text.startswith("{"):
            if not text:
                raise PolicyConfigError("policy name is empty")
            return PolicySpec(type=text, name=text)
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PolicyConfigError(f"policy spec is not valid JSON: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise PolicyConfigError(f"policy spec must be a name or a mapping, got {type(raw).__name__}")
    if set(raw) == {"policy"}:
        return parse_policy_spec(raw["policy"])
    _check_keys(raw, _POLICY_KEYS, "policy")
    ptype = _require_str(raw, "type", "policy")
    if ptype != "pipeline":
        extra = [k for k in _PIPELINE_ONLY if k in raw]
        if extra:
            raise PolicyConfigError(f"policy {ptype!r}: {', '.join(extra)} only apply to type 'pipeline'")
    spec = PolicySpec(
        type=ptype,
        name=_optional_str(raw, "name", "policy") or ptype,
        params=_params(raw, f"policy {ptype!r}"),
        filters=tuple(_plugin(item, "filter") for item in _list(raw.get("filters", ()), "filters")),
        scorers=tuple(_plugin(item, "scorer") for item in _list(raw.get("scorers", ()), "scorers")),
        picker=_plugin(raw["picker"], "picker") if raw.get("picker") is not None else None,
    )
    _check_unique_names(spec)
    return spec


def _plugin(raw: Any, kind: str) -> PluginSpec:
    if isinstance(raw, str):
        return PluginSpec(type=raw, name=raw)
    if not isinstance(raw, Mapping):
        raise PolicyConfigError(f"a {kind} must be a name or a mapping, got {raw!r}")
    _check_keys(raw, _PLUGIN_KEYS if kind == "scorer" else _PLUGIN_KEYS[:3], kind)
    ptype = _require_str(raw, "type", kind)
    weight = raw.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0:
        raise PolicyConfigError(f"scorer {ptype!r}: weight must be a number >= 0, got {weight!r}")
    return PluginSpec(
        type=ptype,
        name=_optional_str(raw, "name", kind) or ptype,
        params=_params(raw, f"{kind} {ptype!r}"),
        weight=float(weight),
    )


def _check_unique_names(spec: PolicySpec) -> None:
    seen: set[str] = set()
    parts = [*spec.filters, *spec.scorers, *([spec.picker] if spec.picker else [])]
    for part in parts:
        if part.name in seen:
            raise PolicyConfigError(
                f"duplicate plugin name {part.name!r} in policy {spec.name!r}; "
                "give each instance of the same type a distinct `name`"
            )
        seen.add(part.name)


def _check_keys(raw: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise PolicyConfigError(
            f"unknown key(s) {', '.join(unknown)} in {where}; allowed: {', '.join(allowed)}"
        )


def _require_str(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise PolicyConfigError(f"{where} needs a non-empty string `{key}`, got {value!r}")
    return value


def _optional_str(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    return _require_str(raw, key, where) if key in raw else None


def _params(raw: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    params = raw.get("params") or {}
    if not isinstance(params, Mapping):
        raise PolicyConfigError(f"{where}: params must be a mapping, got {params!r}")
    return dict(params)


def _list(raw: Any, where: str) -> list[Any]:
    if isinstance(raw, list | tuple):
        return list(raw)
    raise PolicyConfigError(f"{where} must be a list, got {raw!r}")


def parse_params(cls: type[T], raw: Mapping[str, Any], where: str) -> T:
    """Validate ``raw`` into the frozen params dataclass ``cls`` and run its ``validate()`` if it has one.

    Values are checked against the field types (``int``, ``float`` (ints accepted), ``bool``, ``str``,
    ``tuple[str, ...]`` (lists accepted), mappings, and ``X | None``).

    Raises:
        PolicyConfigError: unknown keys, a wrong type, or a value ``validate()`` rejects.
    """
    if not isinstance(raw, Mapping):
        raise PolicyConfigError(f"{where}: params must be a mapping, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(str(k) for k in raw if k not in fields)
    if unknown:
        known = ", ".join(fields) or "(none)"
        raise PolicyConfigError(f"{where}: unknown param(s) {', '.join(unknown)}; known: {known}")
    hints = typing.get_type_hints(cls)
    values = {key: _coerce(value, hints[key], f"{where}: param {key!r}") for key, value in raw.items()}
    try:
        params = cls(**values)
        validate = getattr(params, "validate", None)
        if validate is not None:
            validate()
    except (TypeError, ValueError) as exc:
        raise PolicyConfigError(f"{where}: {exc}") from exc
    return params


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    ok = True
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    elif origin is tuple:
        ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    elif origin is not None and issubclass(origin, Mapping):
        ok = isinstance(value, Mapping)
    if not ok:
        raise PolicyConfigError(f"{where} must be {getattr(hint, '__name__', hint)}, got {value!r}")
    return value
