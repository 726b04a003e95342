"""Config parsing and the registry: every mistake stops start-up with a message naming what exists."""

from __future__ import annotations

import importlib.metadata as md
import json
import sys
from pathlib import Path

import pytest

from policies import (
    Kind,
    PolicyConfigError,
    PolicyContext,
    available_policies,
    build_policy,
    make_registry,
    parse_policy_spec,
)
from tests.unit.policies.fleets import EXAMPLE_ENTRY_POINT, EXAMPLE_PLUGIN_DIR

CTX = PolicyContext()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", r"unknown policy 'nope'; available policies: round_robin, random, least_load.*pipeline"),
        ("", r"empty"),
        ({"type": "least_load", "colour": 1}, r"unknown key\(s\) colour.*allowed: type, name, params"),
        ({"type": "least_load", "params": {"x": 1}}, r"unknown param\(s\) x; known: \(none\)"),
        ({"type": "session_affinity", "params": {"ttl_s": "long"}}, r"'ttl_s' must be float"),
        ({"type": "session_affinity", "params": {"max_sessions": True}}, r"'max_sessions' must be int"),
        ({"type": "session_affinity", "params": {"ttl_s": -1}}, r"ttl_s must be > 0"),
        ({"type": "least_load", "scorers": ["kv_usage"]}, r"only apply to type 'pipeline'"),
        (
            {"type": "pipeline", "filters": ["nope"]},
            r"unknown filter 'nope'; available filters: healthy, role",
        ),
        ({"type": "pipeline", "scorers": ["max_score"]}, r"'max_score' is a picker, not a scorer"),
        (
            {"type": "pipeline", "scorers": [{"type": "kv_usage", "weight": -1}]},
            r"weight must be a number >= 0",
        ),
        ({"type": "pipeline", "scorers": ["kv_usage", "kv_usage"]}, r"duplicate plugin name 'kv_usage'"),
        ({"type": "pipeline", "params": {"a": 1}}, r"takes no params"),
        ({"type": "pipeline", "filters": "healthy"}, r"filters must be a list"),
        (
            {"type": "pipeline", "picker": {"type": "max_score", "weight": 2}},
            r"unknown key\(s\) weight in picker",
        ),
        ({"type": "role"}, r"'role' is a filter, not a policy"),
        ({"type": "pipeline", "filters": [{"type": "role", "params": {"roles": ["gpu"]}}]}, r"roles must be"),
        ("{not json", r"not valid JSON"),
        (42, r"must be a name or a mapping"),
    ],
    ids=[
        "unknown_name",
        "empty_name",
        "unknown_top_key",
        "unknown_param",
        "wrong_param_type",
        "bool_is_not_int",
        "invalid_param_value",
        "pipeline_keys_on_a_plain_policy",
        "unknown_filter",
        "picker_used_as_scorer",
        "negative_weight",
        "duplicate_instance_names",
        "pipeline_params",
        "filters_not_a_list",
        "picker_has_no_weight",
        "filter_used_as_policy",
        "bad_role",
        "bad_json",
        "not_a_spec",
    ],
)
def test_bad_config_stops_startup(spec: object, message: str) -> None:
    with pytest.raises(PolicyConfigError, match=message):
        build_policy(spec, CTX, make_registry([]))  # type: ignore[arg-type]


def test_same_type_twice_with_distinct_names_is_fine() -> None:
    spec = {
        "type": "pipeline",
        "scorers": [
            {"type": "queue_depth", "name": "short", "params": {"saturation": 4}},
            {"type": "queue_depth", "name": "long", "params": {"saturation": 64}, "weight": 2},
        ],
    }
    assert build_policy(spec, CTX, make_registry([])).name == "pipeline"


def test_spec_forms_name_json_and_wrapped_mapping() -> None:
    inner = {"type": "session_affinity", "params": {"ttl_s": 5}}
    assert parse_policy_spec("least_load").type == "least_load"
    assert parse_policy_spec(json.dumps(inner)) == parse_policy_spec(inner)
    assert parse_policy_spec({"policy": inner}) == parse_policy_spec(inner)


def _fake_dist(tmp_path: Path, dist: str, entry: str) -> list[md.EntryPoint]:
    info = tmp_path / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[kvgate.policies]\n{entry}\n")
    return [ep for d in md.distributions(path=[str(tmp_path)]) for ep in d.entry_points]


def test_plugin_that_fails_to_import_names_its_distribution(tmp_path: Path) -> None:
    eps = _fake_dist(tmp_path, "acme-broken", "broken = acme_missing_module:make")
    with pytest.raises(
        PolicyConfigError, match=r"plugin 'broken'.*distribution acme-broken failed to load.*ModuleNotFound"
    ):
        build_policy("broken", CTX, make_registry(eps))


def test_only_the_configured_plugin_is_loaded(tmp_path: Path) -> None:
    eps = _fake_dist(tmp_path, "acme-broken", "broken = acme_missing_module:make")
    registry = make_registry(eps)
    assert build_policy("least_load", CTX, registry).name == "least_load"
    assert "broken" in available_policies(registry)


def test_entry_point_clashing_with_a_builtin_is_refused(tmp_path: Path) -> None:
    eps = _fake_dist(tmp_path, "acme-clash", "least_load = acme:make")
    with pytest.raises(
        PolicyConfigError, match=r"'least_load' from distribution acme-clash clashes with a built-in"
    ):
        make_registry(eps)


def test_two_distributions_with_one_name_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    eps = _fake_dist(tmp_path / "a", "acme-one", "x = one:make") + _fake_dist(
        tmp_path / "b", "acme-two", "x = two:make"
    )
    with pytest.raises(PolicyConfigError, match=r"'x' is provided by acme-one and by acme-two"):
        make_registry(eps)


@pytest.fixture
def example_plugin_importable():
    src = str(EXAMPLE_PLUGIN_DIR / "src")
    sys.path.insert(0, src)
    try:
        yield
    finally:
        sys.path.remove(src)


@pytest.mark.usefixtures("example_plugin_importable")
def test_third_party_plugin_builds_and_validates_params() -> None:
    from tests.unit.policies.fleets import worker

    registry = make_registry([EXAMPLE_ENTRY_POINT])
    policy = build_policy({"type": "lowest_id", "params": {"skip_prefix": "a"}}, CTX, registry)
    assert (
        policy.select(
            __import__("policies").RouteRequest(model="m"), [worker("b"), worker("a"), worker("c")]
        ).worker
        == "b"
    )
    with pytest.raises(PolicyConfigError, match=r"unknown param\(s\) bogus"):
        build_policy({"type": "lowest_id", "params": {"bogus": 1}}, CTX, registry)


@pytest.mark.usefixtures("example_plugin_importable")
def test_third_party_plugin_of_the_wrong_kind_is_refused() -> None:
    registry = make_registry([EXAMPLE_ENTRY_POINT])
    with pytest.raises(PolicyConfigError, match=r"built a LowestId, which is not a scorer"):
        build_policy({"type": "pipeline", "scorers": ["lowest_id"]}, CTX, registry)


def test_available_policies_lists_builtins_and_pipeline() -> None:
    names = available_policies(make_registry([]))
    assert names[:7] == [
        "round_robin",
        "random",
        "least_load",
        "power_of_two",
        "session_affinity",
        "prefix_cache_aware",
        "pd_disaggregation",
    ]
    assert "pipeline" in names
    assert make_registry([]).names(Kind.SCORER) == [
        "prefix_hit",
        "queue_depth",
        "inflight_tokens",
        "kv_usage",
    ]
