"""``EppSettings``: everything ``kvgate epp`` needs to start (the gateway's own settings inside)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.epp.inference_pool import PoolRef
from gateway.epp.picker import PickerConfig
from gateway.epp.stream import StreamConfig
from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class EppSettings:
    """The picker's settings.

    Attributes:
        gateway: the request path's settings (workers, policy, tokenizer, state, block size, limits).
        grpc_port: ext_proc (9002 in GIE's charts); health is served there too.
        health_port: gRPC health alone (9003).
        metrics_port: ``GET /metrics`` over HTTP (9090); 0: none.
        secure_serving: TLS on the gRPC ports (a self-signed certificate unless ``cert_path``).
        cert_path: a directory with ``tls.crt`` and ``tls.key``.
        picker: fallbacks and shedding.
        stream: body limit and the response mode.
        endpoints_file: a watched file of endpoints (``gateway.epp.endpoints_file``).
        pool: an ``InferencePool`` to take endpoints from.
        resync_s: how often the endpoint sources are read.
        drain_timeout_s: on SIGTERM, readiness goes NOT_SERVING this long before the server stops.
    """

    gateway: Settings
    grpc_port: int = 9002
    health_port: int = 9003
    metrics_port: int = 9090
    secure_serving: bool = True
    cert_path: str | None = None
    picker: PickerConfig = field(default_factory=PickerConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    endpoints_file: str | None = None
    pool: PoolRef | None = None
    resync_s: float = 1.0
    drain_timeout_s: float = 0.0
