"""The Inference Extension's Envoy config (docs/engines.md) in front of ``kvgate epp``, as a dict for YAML.

Sketch A (``original_dst``): an ``ORIGINAL_DST`` cluster on the destination header, the shape of GIE's e2e
config and Envoy AI Gateway (one endpoint only). Sketch B (``override_host``): a static pool with Envoy's
Override Host policy (fallback lists, the served endpoint reported back). ``plain`` routes the pool by round
robin with no ext_proc filter: Envoy's own cost, for benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

ORIGINAL_DST: Final = "original_dst"
OVERRIDE_HOST: Final = "override_host"
PLAIN: Final = "plain"
_HCM_TYPE: Final = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)


def _ext_proc_filter(failure_mode_allow: bool) -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": "ext_proc"}, "timeout": "10s"},
            "failure_mode_allow": failure_mode_allow,
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                "request_body_mode": "FULL_DUPLEX_STREAMED",
                "response_body_mode": "FULL_DUPLEX_STREAMED",
                "request_trailer_mode": "SEND",
                "response_trailer_mode": "SEND",
            },
            "message_timeout": "1000s",
            "metadata_options": {
                "forwarding_namespaces": {"untyped": ["envoy.lb", "envoy.lb.subset_hint"]},
                "receiving_namespaces": {"untyped": ["envoy.lb"]},
            },
        },
    }


def _pool_cluster(workers: Sequence[str], *, plain: bool = False) -> dict[str, Any]:
    rr = "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"
    override = {
        "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
        "override_host_sources": [
            {"metadata": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}},
            {"header": "x-gateway-destination-endpoint"},
        ],
        "selected_host_key": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint-served"}]},
        "fallback_policy": {
            "policies": [{"typed_extension_config": {"name": "rr", "typed_config": {"@type": rr}}}]
        },
    }
    endpoints = []
    for w in workers:
        host, port = w.rsplit(":", 1)
        endpoints.append(
            {"endpoint": {"address": {"socket_address": {"address": host, "port_value": int(port)}}}}
        )
    policy = override if plain is False else {"@type": rr}
    name = "envoy.load_balancing_policies.override_host" if plain is False else "rr"
    return {
        "name": "pool",
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_balancing_policy": {
            "policies": [{"typed_extension_config": {"name": name, "typed_config": policy}}]
        },
        "load_assignment": {"cluster_name": "pool", "endpoints": [{"lb_endpoints": endpoints}]},
    }


def envoy_config(
    mode: str,
    *,
    listen_port: int,
    admin_port: int,
    epp_port: int,
    workers: Sequence[str],
    failure_mode_allow: bool,
    picker_tls: bool = False,
) -> dict[str, Any]:
    """The Inference Extension's Envoy config: sketch A (``original_dst``), B (``override_host``), ``plain``.

    ``picker_tls``: reach the picker over TLS without verifying its certificate, as the GIE gateways do
    with an EPP's self-signed one (``kvgate epp``'s default).
    """
    cluster = "original_destination_cluster" if mode == ORIGINAL_DST else "pool"
    route = {
        "cluster": cluster,
        "timeout": "120s",
        "idle_timeout": "120s",
        "retry_policy": {"retry_on": "connect-failure,refused-stream,reset", "num_retries": 2},
    }
    hcm = {
        "@type": _HCM_TYPE,
        "stat_prefix": "gw",
        "common_http_protocol_options": {"idle_timeout": "300s"},
        "route_config": {
            "virtual_hosts": [
                {"name": "all", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": route}]}
            ]
        },
        "http_filters": [
            *([] if mode == PLAIN else [_ext_proc_filter(failure_mode_allow)]),
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    original_dst = {
        "name": "original_destination_cluster",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "5s",
        "original_dst_lb_config": {
            "use_http_header": True,
            "http_header_name": "x-gateway-destination-endpoint",
        },
    }
    ext_proc = {
        "name": "ext_proc",
        "type": "STATIC",
        "connect_timeout": "1s",
        "circuit_breakers": {
            "thresholds": [{"max_connections": 40000, "max_pending_requests": 40000, "max_requests": 40000}]
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": "ext_proc",
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socket_address": {"address": "127.0.0.1", "port_value": epp_port}
                                }
                            }
                        }
                    ]
                }
            ],
        },
    }
    if picker_tls:
        ext_proc["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {"alpn_protocols": ["h2"]},
            },
        }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "gw",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": [original_dst, _pool_cluster(workers, plain=mode == PLAIN), ext_proc],
        },
    }
