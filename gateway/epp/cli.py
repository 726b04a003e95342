"""``kvgate epp``: kvgate as the Endpoint Picker of the Gateway API Inference Extension.

Envoy (or any GIE gateway) carries the bytes; this process answers its ext_proc stream with the endpoint
kvgate's request path picks. Flags shared with ``kvgate gateway`` mean the same thing here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Mapping

from gateway.epp.inference_pool import PoolRef
from gateway.epp.picker import PickerConfig
from gateway.epp.settings import EppSettings
from gateway.epp.stream import ResponseMode, StreamConfig
from gateway.errors import ConfigError
from gateway.observability.logging import configure as configure_logging
from gateway.settings import DEFAULT_POLICY, Timeouts, from_args

_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _request_path_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the request path, as ``kvgate gateway`` spells them."""
    t = Timeouts()
    parser.add_argument("--host", default="127.0.0.1", help="address to bind the gRPC and metrics ports")
    parser.add_argument(
        "--worker", action="append", default=[],
        help="endpoint URL, repeatable (kvgate gateway --worker syntax: URL[#engine=…&role=…&id=…])",
    )  # fmt: skip
    parser.add_argument("--policy", default=DEFAULT_POLICY, help=f"routing policy (default {DEFAULT_POLICY})")
    parser.add_argument("--policy-config", default=None, help="YAML file with the policy spec")
    parser.add_argument("--state", default="memory", help="state backend: memory | redis://HOST:PORT/DB")
    parser.add_argument(
        "--tokenizer", default="auto", help="auto | none | bytes | PATH to tokenizer.json/dir"
    )
    parser.add_argument("--block-size", type=int, default=None, help="tokens per KV block")
    parser.add_argument(
        "--max-body-bytes", type=int, default=8 * 1024 * 1024, help="request body limit (413)"
    )
    parser.add_argument("--connect-timeout-s", type=float, default=t.connect_s, help="probe connect deadline")
    parser.add_argument("--health-interval-s", type=float, default=1.0, help="seconds between health probes")
    parser.add_argument(
        "--kv-index", default="auto", choices=["auto", "precise", "approximate"], help="as kvgate gateway"
    )
    parser.add_argument("--engine-load", default="on", choices=["on", "off"], help="as kvgate gateway")
    parser.add_argument("--log-level", default="warning", help="debug | info | warning | error")
    parser.add_argument(
        "--log-format", default="text", choices=["text", "json"], help="log lines as text or JSON"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the picker's flags (each also readable from YAML and ``KVGATE_*``)."""
    _request_path_arguments(parser)
    parser.add_argument("--grpc-port", type=int, default=9002, help="ext_proc gRPC port (default 9002)")
    parser.add_argument("--grpc-health-port", type=int, default=9003, help="gRPC health port (0: none)")
    parser.add_argument("--metrics-port", type=int, default=9090, help="HTTP /metrics port (0: none)")
    parser.add_argument(
        "--secure-serving", default="on", choices=["on", "off"],
        help="TLS on the gRPC ports (on: --cert-path's certificate, else a self-signed one made at start)",
    )  # fmt: skip
    parser.add_argument("--cert-path", default=None, help="directory holding tls.crt and tls.key")
    parser.add_argument(
        "--response-mode", default="full", choices=[m.value for m in ResponseMode],
        help="full: see the whole response (usage → cached-token accounting); headers: status and served "
        "endpoint only; none: close the stream after the request phase (least overhead)",
    )  # fmt: skip
    parser.add_argument(
        "--fallbacks", type=int, default=0,
        help="fallback endpoints named after the pick (a list needs Envoy's override_host policy; "
        "ORIGINAL_DST clusters answer 503 to a list)",
    )  # fmt: skip
    parser.add_argument(
        "--max-inflight", type=int, default=0, help="per endpoint; all eligible ones at it: 429 (0: never)"
    )
    parser.add_argument(
        "--endpoints-file", default=None, help="watched file of endpoints (URLs or host:port)"
    )
    parser.add_argument("--pool-name", default=None, help="InferencePool to take endpoints from (Kubernetes)")
    parser.add_argument(
        "--pool-namespace", default=None, help="its namespace (default: $NAMESPACE, then default)"
    )
    parser.add_argument(
        "--resync-s", type=float, default=1.0, help="seconds between reads of endpoint sources"
    )
    parser.add_argument(
        "--drain-timeout-s", type=float, default=0.0, help="on SIGTERM: NOT_SERVING this long first"
    )


def _pool(args: argparse.Namespace, env: Mapping[str, str]) -> PoolRef | None:
    if not args.pool_name:
        return None
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ConfigError(
            "--pool-name needs the Kubernetes API: run in a pod (KUBERNETES_SERVICE_HOST unset)"
        )
    host = f"[{host}]" if ":" in host else host
    return PoolRef(
        name=args.pool_name, namespace=args.pool_namespace or env.get("NAMESPACE") or "default",
        api_url=f"https://{host}:{port}", token_path=f"{_SA_DIR}/token", ca_path=f"{_SA_DIR}/ca.crt",
    )  # fmt: skip


def settings_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> EppSettings:
    """Validated ``EppSettings`` from the ``kvgate epp`` namespace.

    Raises:
        ConfigError: a value is out of range, or no endpoint source is given.
    """
    if not (args.worker or args.endpoints_file or args.pool_name):
        raise ConfigError("give endpoints: --worker URL, --endpoints-file PATH or --pool-name NAME")
    if args.fallbacks < 0 or args.max_inflight < 0:
        raise ConfigError("--fallbacks and --max-inflight must be >= 0")
    shared = argparse.Namespace(
        **vars(args), port=args.grpc_port, retries=0, ttfb_timeout_s=Timeouts().ttfb_s,
        idle_timeout_s=Timeouts().idle_s,
    )  # fmt: skip
    gateway = from_args(shared)
    return EppSettings(
        gateway=gateway, grpc_port=args.grpc_port, health_port=args.grpc_health_port,
        metrics_port=args.metrics_port, secure_serving=args.secure_serving == "on", cert_path=args.cert_path,
        picker=PickerConfig(gateway.max_tokens_limit, args.fallbacks, args.max_inflight),
        stream=StreamConfig(gateway.max_body_bytes, response_mode=ResponseMode(args.response_mode)),
        endpoints_file=args.endpoints_file, pool=_pool(args, env), resync_s=args.resync_s,
        drain_timeout_s=args.drain_timeout_s,
    )  # fmt: skip


async def _main(settings: EppSettings) -> None:
    from gateway.epp.runtime import serve_picker  # grpc's servers: only when serving

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve_picker(settings, stop)


def run(args: argparse.Namespace) -> int:
    """Run the picker until SIGTERM / SIGINT."""
    configure_logging(args.log_level, json=args.log_format == "json")
    try:
        settings = settings_from_args(args, os.environ)
        asyncio.run(_main(settings))
    except ConfigError as exc:
        sys.stderr.write(f"kvgate epp: {exc.message}\n")
        return 2
    return 0
