"""The endpoints of an ``InferencePool`` (``inference.networking.k8s.io/v1``) from the Kubernetes API.

The pool's ``selector`` picks pods in its namespace; each Ready pod with an IP gives one endpoint per
``targetPorts`` entry (``podIP:port``, how data-parallel ranks are modelled). A pod's
``llm-d.ai/engine-type`` label (or GIE's older key) names its engine. The API is read with plain httpx and
the pod's service-account token (re-read on every call: projected tokens rotate); the poll interval bounds
how late a new pod is seen. Listing, not watching: one GET of the pool and one of its pods per interval.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import httpx

from gateway.errors import ConfigError
from gateway.settings import WorkerSpec, parse_worker

POOL_GROUP: Final = "inference.networking.k8s.io"
_ENGINE_LABELS: Final = ("llm-d.ai/engine-type", "inference.networking.k8s.io/engine-type")
_ENGINES: Final = {"vllm": "vllm", "sglang": "sglang", "trtllm-serve": "trtllm", "kvgate": "kvgate"}


@dataclass(frozen=True, slots=True)
class PoolRef:
    """Which pool, and how to reach the API server.

    Attributes:
        name: the ``InferencePool``'s name.
        namespace: its namespace (its pods are there too).
        api_url: the API server (in a pod: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``).
        token_path: the service-account token file (None: no bearer token, e.g. ``kubectl proxy``).
        ca_path: the API server's CA bundle (None: the system's).
    """

    name: str
    namespace: str
    api_url: str
    token_path: str | None = None
    ca_path: str | None = None


def selector_query(selector: Mapping[str, Any]) -> str:
    """A label selector (``matchLabels`` or a plain map, as ``v1`` writes it) as a ``labelSelector`` query.

    Raises:
        ConfigError: it selects nothing in particular (empty), which would take every pod.
    """
    labels = selector.get("matchLabels", selector)
    if not isinstance(labels, Mapping) or not labels:
        raise ConfigError("the InferencePool's selector has no matchLabels; refusing to take every pod")
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def pod_endpoints(pods: Sequence[Mapping[str, Any]], ports: Sequence[int]) -> tuple[WorkerSpec, ...]:
    """One worker per (Ready pod with an IP, target port), with the pod's engine when its label names one."""
    specs = []
    for pod in pods:
        meta, status = pod.get("metadata", {}), pod.get("status", {})
        ip = status.get("podIP")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
        )
        if not ip or not ready or meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels", {}) or {}
        engine = next((_ENGINES[v] for k in _ENGINE_LABELS if (v := labels.get(k)) in _ENGINES), None)
        host = f"[{ip}]" if ":" in ip else ip
        for port in ports:
            fragment = f"#engine={engine}" if engine else ""
            specs.append(parse_worker(f"http://{host}:{port}{fragment}"))
    return tuple(specs)


class InferencePoolSource:
    """Reads a pool's endpoints from the API server.

    Args:
        ref: the pool and the API server.
        client: an httpx client (the caller owns it; tests give one on a mock transport).
    """

    def __init__(self, ref: PoolRef, client: httpx.AsyncClient) -> None:
        self._ref = ref
        self._client = client

    @property
    def name(self) -> str:
        return f"InferencePool {self._ref.namespace}/{self._ref.name}"

    async def read(self) -> Sequence[WorkerSpec] | None:
        """The pool's endpoints now.

        Raises:
            ConfigError: the pool is missing or malformed, or the API refused the call.
        """
        ns = quote(self._ref.namespace)
        pool = await self._get(
            f"/apis/{POOL_GROUP}/v1/namespaces/{ns}/inferencepools/{quote(self._ref.name)}"
        )
        spec = pool.get("spec", {})
        ports = [int(p["number"]) for p in spec.get("targetPorts", []) if "number" in p]
        if not ports:
            raise ConfigError(f"{self.name} has no spec.targetPorts")
        query = selector_query(spec.get("selector", {}))
        pods = await self._get(f"/api/v1/namespaces/{ns}/pods", {"labelSelector": query})
        return pod_endpoints(pods.get("items", []), ports)

    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        headers = {}
        if self._ref.token_path is not None:
            token = await asyncio.to_thread(Path(self._ref.token_path).read_text)
            headers["authorization"] = "Bearer " + token.strip()
        try:
            response = await self._client.get(self._ref.api_url + path, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise ConfigError(f"{self.name}: the Kubernetes API cannot be reached ({exc})") from None
        if response.status_code != 200:
            raise ConfigError(
                f"{self.name}: GET {path} answered {response.status_code}: {response.text[:200]}"
            )
        body: dict[str, Any] = response.json()
        return body
