"""Every metric the Grafana dashboard and the Prometheus alert rules name is one a real gateway exports (read
from a live ``/metrics``, suffixes included: a counter is queried as ``name_total``, a histogram's buckets as
``name_bucket``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.gateway_fleet import gateway_fleet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_NAME = re.compile(r"\bkvgate_[a-zA-Z0-9_:]+")
# The series names Prometheus stores for one family of each type (text exposition format).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
}


def _dashboard_exprs() -> list[str]:
    dash: dict[str, Any] = json.loads((DEPLOY / "grafana" / "kvgate.json").read_text())
    exprs = [str(t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [str(v.get("definition", "")) for v in dash["templating"]["list"]]
    return exprs


def _alert_exprs() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text())
    return [str(r["expr"]) for g in rules["groups"] for r in g["rules"]]


def referenced_metrics(exprs: list[str]) -> set[str]:
    """The ``kvgate_*`` series names the PromQL ``exprs`` query."""
    return {m for e in exprs for m in _NAME.findall(e)}


def exported_series(exposition: str) -> set[str]:
    """Every series name a scrape of ``exposition`` can store, including families with no sample yet (a
    labelled counter before its first increment exposes only its ``# TYPE`` line)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def test_series_names_follow_the_exposition_suffixes() -> None:
    text = (
        "# TYPE kvgate_a_total counter\n"
        "# TYPE kvgate_h histogram\n"
        'kvgate_h_bucket{le="+Inf"} 1.0\nkvgate_h_sum 1.0\nkvgate_h_count 1.0\n'
        "# TYPE kvgate_g gauge\nkvgate_g 1.0\n"
    )
    names = exported_series(text)
    assert {"kvgate_a_total", "kvgate_h_bucket", "kvgate_h_sum", "kvgate_h_count", "kvgate_g"} <= names
    assert not {"kvgate_a", "kvgate_g_total", "kvgate_h", "kvgate_g_bucket"} & names


def test_dashboard_and_alerts_name_only_exported_metrics(tmp_path: Path) -> None:
    with gateway_fleet(tmp_path, num_workers=1, gateway_args=["--state", "memory"]) as fleet:
        model = httpx.get(f"{fleet.gateway}/v1/models", timeout=10).json()["data"][0]["id"]
        prompt = {"model": model, "prompt": "the dashboard reads these metrics", "max_tokens": 4}
        assert httpx.post(f"{fleet.gateway}/v1/completions", json=prompt, timeout=30).status_code == 200
        chat = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
        }
        assert httpx.post(f"{fleet.gateway}/v1/chat/completions", json=chat, timeout=30).status_code == 200
        scrape = httpx.get(f"{fleet.gateway}/metrics", timeout=10)
    assert scrape.status_code == 200
    exported = exported_series(scrape.text)
    for source, exprs in (("dashboard", _dashboard_exprs()), ("alerts", _alert_exprs())):
        named = referenced_metrics(exprs)
        assert named, f"the {source} names no kvgate metric"
        assert named <= exported, (
            f"the {source} names metrics the gateway does not export: {named - exported}"
        )
