"""Endpoint sources: the endpoints file's shapes and the InferencePool read through a fake API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.epp.endpoints import endpoint_of, parse_subset, url_of
from gateway.epp.endpoints_file import EndpointsFile, parse_endpoints
from gateway.epp.inference_pool import InferencePoolSource, PoolRef, pod_endpoints, selector_query
from gateway.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "urls"),
    [
        (
            "http://10.0.0.1:8000\n# comment\n\n10.0.0.2:8001\n",
            ["http://10.0.0.1:8000", "http://10.0.0.2:8001"],
        ),
        ("- 10.0.0.3:9000\n- http://h:1#engine=vllm\n", ["http://10.0.0.3:9000", "http://h:1"]),
        ("endpoints:\n  - {address: 10.0.0.4, port: 80}\n", ["http://10.0.0.4:80"]),
    ],
    ids=["lines", "yaml-list", "llm-d-mapping"],
)
def test_endpoints_file_shapes(text: str, urls: list[str]) -> None:
    assert [s.url for s in parse_endpoints(text)] == urls


def test_endpoints_file_rejects_a_bad_entry() -> None:
    with pytest.raises(ConfigError, match="endpoints"):
        parse_endpoints("endpoints: nope\n")
    with pytest.raises(ConfigError):
        parse_endpoints("- {name: x}\n")


async def test_endpoints_file_is_read_again_only_when_changed(tmp_path: Path) -> None:
    path = tmp_path / "endpoints"
    path.write_text("10.0.0.1:1\n")
    source = EndpointsFile(str(path))
    assert [s.id for s in await source.read() or ()] == ["10.0.0.1:1"]
    assert await source.read() is None
    path.write_text("10.0.0.1:1\n10.0.0.2:2\n")
    import os

    os.utime(path, ns=(1, 10**18))
    assert len(await source.read() or ()) == 2


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [("http://10.0.0.7:8000", "10.0.0.7:8000"), ("http://h", "h:80"), ("http://[fd00::1]:9", "[fd00::1]:9")],
)
def test_endpoint_of(url: str, endpoint: str) -> None:
    assert endpoint_of(url) == endpoint
    assert endpoint_of(url_of(endpoint)) == endpoint


@pytest.mark.parametrize(
    ("value", "subset"),
    [(None, None), ("a:1, b:2", {"a:1", "b:2"}), (["a:1"], {"a:1"}), ("", set()), (7, set())],
)
def test_parse_subset(value: object, subset: set[str] | None) -> None:
    assert parse_subset(value) == (frozenset(subset) if subset is not None else None)


def _pod(
    ip: str | None, *, ready: bool = True, engine: str | None = None, deleting: bool = False
) -> dict[str, Any]:
    labels = {"app": "vllm", **({"llm-d.ai/engine-type": engine} if engine else {})}
    meta: dict[str, Any] = {"name": f"p-{ip}", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_pod_endpoints_take_ready_pods_times_target_ports() -> None:
    pods = [
        _pod("10.1.0.1", engine="vllm"),
        _pod("10.1.0.2", ready=False),
        _pod(None),
        _pod("10.1.0.3", deleting=True),
    ]
    specs = pod_endpoints(pods, [8000, 8001])
    assert [s.url for s in specs] == ["http://10.1.0.1:8000", "http://10.1.0.1:8001"]
    assert {s.engine for s in specs} == {"vllm"}


def test_selector_query_refuses_an_empty_selector() -> None:
    assert selector_query({"matchLabels": {"b": "2", "a": "1"}}) == "a=1,b=2"
    assert selector_query({"app": "x"}) == "app=x"
    with pytest.raises(ConfigError):
        selector_query({})


async def test_inference_pool_source_reads_pool_then_pods(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    seen: list[httpx.Request] = []

    def api(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/inferencepools/pool"):
            spec = {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]}
            return httpx.Response(200, json={"spec": spec})
        if request.url.path == "/api/v1/namespaces/ns/pods":
            return httpx.Response(200, json={"items": [_pod("10.2.0.1"), _pod("10.2.0.2")]})
        return httpx.Response(404, json={"kind": "Status"})

    ref = PoolRef(name="pool", namespace="ns", api_url="https://k8s", token_path=str(token))
    async with httpx.AsyncClient(transport=httpx.MockTransport(api)) as client:
        specs = await InferencePoolSource(ref, client).read()
        assert [s.id for s in specs or ()] == ["10.2.0.1:8000", "10.2.0.2:8000"]
        assert seen[0].url.path == "/apis/inference.networking.k8s.io/v1/namespaces/ns/inferencepools/pool"
        assert seen[1].url.params["labelSelector"] == "app=vllm"
        assert all(r.headers["authorization"] == "Bearer secret" for r in seen)
        missing = InferencePoolSource(PoolRef(name="gone", namespace="ns", api_url="https://k8s"), client)
        with pytest.raises(ConfigError, match="404"):
            await missing.read()
