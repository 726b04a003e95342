"""deploy/k8s/epp: the InferencePool points at the picker's Service, whose flags `kvgate epp` accepts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.cli import build_parser

EPP = Path(__file__).resolve().parents[3] / "deploy" / "k8s" / "epp"


def _render() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with kustomize) is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(EPP)], check=True, capture_output=True, text=True, timeout=60
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_pool_points_at_the_picker_service() -> None:
    docs = _render()
    pool = next(d for d in docs if d["kind"] == "InferencePool")
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "kvgate-epp")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == service["metadata"]["name"]
    assert ref["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert all(d["metadata"]["namespace"] == "kvgate" for d in docs)


def test_picker_args_are_known_flags() -> None:
    deployment = next(d for d in _render() if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["grpc"]["port"] == 9003
    parser, _ = build_parser()
    args = parser.parse_args(["epp", *container["args"]])
    assert args.pool_name == "kvgate-pool" and args.secure_serving == "on"
