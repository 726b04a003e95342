"""deploy/grafana/kvgate.json and deploy/prometheus/alerts.yaml have the shape Grafana and Prometheus load
(the metrics they name are checked against a live gateway in tests/integration/test_dashboards.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "kvgate.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
DS = {"type": "prometheus", "uid": "${datasource}"}


def _dashboard() -> dict[str, Any]:
    dash: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dash


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def test_dashboard_imports_anywhere() -> None:
    dash = _dashboard()
    assert dash["schemaVersion"] >= 39
    assert dash["uid"] and dash["title"] and dash["id"] is None
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    worker = variables["worker"]
    assert worker["datasource"] == DS
    assert worker["query"] == worker["definition"]
    assert worker["definition"].startswith("label_values(") and worker["includeAll"] and worker["multi"]
    assert "${DS_" not in DASHBOARD.read_text(), "a datasource input breaks file provisioning"


def test_every_panel_queries_the_datasource_variable() -> None:
    panels = _panels()
    assert len(panels) >= 15
    for p in panels:
        assert p["datasource"] == DS, p["title"]
        assert p["targets"], p["title"]
        assert p["title"] and p["description"]
        for t in p["targets"]:
            assert t["datasource"] == DS and t["expr"].strip() and t["refId"], p["title"]
    ids = [p["id"] for p in _dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_panels_fit_the_grid_without_overlapping() -> None:
    taken: set[tuple[int, int]] = set()
    for p in _dashboard()["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{p['title']} overlaps another panel"
        taken |= cells


def test_dashboard_covers_the_operator_questions() -> None:
    exprs = " ".join(t["expr"] for p in _panels() for t in p["targets"])
    for needle in (
        "kvgate_requests_total",
        "histogram_quantile(0.99, sum by (le, route) (rate(kvgate_ttfb_seconds_bucket",
        "kvgate_request_duration_seconds_bucket",
        "kvgate_worker_inflight_requests",
        "kvgate_worker_queue_depth",
        "kvgate_worker_kv_usage_ratio",
        "kvgate_prefix_predicted_tokens",
        "kvgate_prefix_reported_cached_tokens",
        "kvgate_prefix_drift",
        "kvgate_retries_total",
        "kvgate_worker_breaker_state",
        "kvgate_state_degraded",
        "kvgate_upstream_shed_total",
        "kvgate_event_loop_lag_seconds_bucket",
        "kvgate_replica_lag_seconds_bucket",
    ):
        assert needle in exprs, needle
    assert 'worker=~"$worker"' in exprs


def test_alert_rules_have_the_prometheus_shape() -> None:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert groups and all(g["name"] and g["rules"] for g in groups)
    rules = _rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for r in rules:
        assert r["expr"].strip() and r["for"], r["alert"]
        assert r["labels"]["severity"] in {"info", "warning", "critical"}, r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
    exprs = {r["alert"]: r["expr"] for r in rules}
    assert "kvgate_prefix_drift" in exprs["KvgatePrefixDrift"]
    assert "kvgate_worker_breaker_state" in exprs["KvgateWorkerBreakerOpen"]
    assert "kvgate_state_degraded" in exprs["KvgateRedisDegraded"]
    assert 'status=~"5.."' in exprs["KvgateHighErrorRatio"]
    assert 'reason="wait_timeout"' in exprs["KvgateUpstreamQueueTimeouts"]


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus, or `make promtool`)")
    return promtool


def test_promtool_accepts_the_rules() -> None:
    out = subprocess.run(
        [_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in out.stdout


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """The panels' PromQL, with Grafana's variables filled in, as recording rules promtool checks."""
    exprs = [t["expr"] for p in _panels() for t in p["targets"]]
    filled = [e.replace("$__rate_interval", "5m").replace("$worker", ".*") for e in exprs]
    assert not any("$" in e for e in filled), "a Grafana variable the check does not fill in"
    rules = [{"record": f"kvgate:panel_{i}", "expr": e} for i, e in enumerate(filled)]
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    out = subprocess.run(
        [_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_alerts_fire_on_the_series_that_should_fire_them() -> None:
    """alerts_test.yaml: a cycling breaker, a 10% 5xx ratio, Redis down, connection-wait timeouts, a replica
    that sees the others' load late."""
    out = subprocess.run(
        [_promtool(), "test", "rules", str(ALERTS.with_name("alerts_test.yaml"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
