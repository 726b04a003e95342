"""deploy/ validated offline: kustomize renders, every container has probes and resources, configs parse."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.cli import build_parser
from kvgate_core.config import layered_defaults

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
KUBECTL = shutil.which("kubectl")


def _render(overlay: str) -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("kubectl (with kustomize) is not installed")
    out = subprocess.run(
        [KUBECTL, "kustomize", str(DEPLOY / "k8s" / overlay)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", []))


@pytest.mark.parametrize("overlay", ["base", "overlays/sim"])
def test_every_container_has_probes_and_resources(overlay: str) -> None:
    docs = _render(overlay)
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert {d["metadata"]["name"] for d in workloads} == {
        "redis",
        "gateway",
        "worker-prefill",
        "worker-decode",
    }
    for doc in workloads:
        for c in _containers(doc):
            name = f"{doc['metadata']['name']}/{c['name']}"
            assert "readinessProbe" in c and "livenessProbe" in c, name
            assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"], name
        assert doc["metadata"]["namespace"] == "kvgate"


def test_gateway_runs_replicas_with_a_disruption_budget() -> None:
    docs = _render("base")
    gw = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gateway")
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert gw["spec"]["replicas"] >= 2
    assert pdb["spec"]["minAvailable"] < gw["spec"]["replicas"]
    assert pdb["spec"]["selector"]["matchLabels"] == gw["spec"]["selector"]["matchLabels"]
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "Service"} >= {"gateway", "redis"}


def test_sim_overlay_runs_simulated_workers() -> None:
    for doc in _render("overlays/sim"):
        if doc["kind"] == "StatefulSet":
            assert _containers(doc)[0]["args"][0] == "--sim"


def _gateway_subparser() -> Any:
    _, subs = build_parser()
    return subs["gateway"]


def test_gateway_configmap_holds_only_known_gateway_options() -> None:
    cm = next(d for d in _render("base") if d["kind"] == "ConfigMap")
    values = {k.replace("-", "_"): v for k, v in yaml.safe_load(cm["data"]["gateway.yaml"]).items()}
    defaults = layered_defaults(_gateway_subparser(), values, {})
    assert defaults["state"].startswith("redis://")
    assert len(defaults["worker"]) == 4


def test_compose_runs_two_gateways_on_one_redis() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    gateways = [n for n in services if n.startswith("gateway")]
    assert len(gateways) == 2
    for n in gateways:
        env = {**services["gateway-0"].get("environment", {}), **services[n].get("environment", {})}
        assert env["KVGATE_STATE"].startswith("redis://redis")
        defaults = layered_defaults(_gateway_subparser(), {}, env)
        assert len(defaults["worker"]) == 3
    assert all(p.startswith("127.0.0.1:") for n in gateways for p in services[n]["ports"])


def test_gateway_configmap_policy_can_serve_its_worker_roles() -> None:
    from policies import build_policy
    from policies.api import PolicyContext, Role, RouteRequest, WorkerId, WorkerView

    cm = next(d for d in _render("base") if d["kind"] == "ConfigMap")
    cfg = yaml.safe_load(cm["data"]["gateway.yaml"])
    policy = build_policy(cfg["policy"], PolicyContext())
    views = [
        WorkerView(id=WorkerId(url), role=Role(url.split("#role=")[1] if "#role=" in url else "both"))
        for url in cfg["worker"]
    ]
    decision = policy.select(RouteRequest(model="m", num_prompt_tokens=4096), views)
    assert decision.worker is not None
