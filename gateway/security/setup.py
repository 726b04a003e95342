"""Flags and assembly of the gateway's protective layers around the ASGI app.

Order, outermost first: tracing (a span per request) → API-key auth, the control plane's access mode and
tenant binding (``gateway.security.auth``) → per-key rate limits → the global concurrency cap → the app.
Each layer is off unless configured, so the default hot path pays nothing: the auth layer is in place when
keys are set, or when ``/admin`` must be read-only because the gateway listens beyond loopback
(``gateway.security.admin_access``). ``--worker-allow`` (``gateway.security.worker_allow``) bounds the
workers ``POST /admin/workers`` may register.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.security.admin_access import admin_access, log_admin_access
from gateway.security.admission import Admission, AdmissionLimits, AdmissionMiddleware
from gateway.security.auth import AuthMiddleware, KeyRing
from gateway.security.buckets import BucketStore, MemoryBuckets, RedisBuckets, RedisProvider
from gateway.security.errors import ErrorLayer
from gateway.security.ratelimit import RateLimitMiddleware, RateLimits
from gateway.security.worker_allow import WorkerAllowList
from kvgate_core.asgi import ASGIApp


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    """What protects the gateway; every field off by default."""

    api_keys: KeyRing | None = None
    admin_keys: KeyRing | None = None
    limits: RateLimits = field(default_factory=RateLimits)
    admission: AdmissionLimits | None = None
    otlp_endpoint: str | None = None
    trace: bool = False
    #: ``--worker-allow``; None: the default (loopback and the ``--worker`` hosts, ``worker_allow_for``)
    worker_allow: WorkerAllowList | None = None

    def worker_allow_for(self, worker_urls: Iterable[str]) -> WorkerAllowList:
        """The allow-list in force for a gateway whose configured workers are ``worker_urls``."""
        if self.worker_allow is not None:
            return self.worker_allow
        return WorkerAllowList.default(worker_urls)


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the flags (each also readable from YAML and ``KVGATE_*``, e.g. ``KVGATE_API_KEYS``)."""
    g = parser.add_argument_group("security, limits and tracing")
    g.add_argument(
        "--api-keys",
        default=None,
        help="file with one API key per line (KEY [tenant=NAME]: the key's KV-cache partition), or "
        "comma-separated keys (KVGATE_API_KEYS)",
    )
    g.add_argument(
        "--admin-keys",
        default=None,
        help="keys for /admin/*: a file or comma-separated keys (without them /admin is closed when "
        "--api-keys is set, and read-only when --host is not loopback)",
    )
    g.add_argument(
        "--worker-allow",
        action="append",
        default=[],
        help="where POST /admin/workers may point, comma-separated, repeatable: CIDR, IP, host name "
        "(never resolved), each optionally :PORT; none: nowhere (default: loopback and the --worker hosts)",
    )
    g.add_argument("--rate-limit-rpm", type=float, default=None, help="requests per minute per API key")
    g.add_argument(
        "--rate-limit-tpm",
        type=float,
        default=None,
        help="tokens per minute per API key (prompt estimate + max_tokens, charged up front)",
    )
    g.add_argument("--max-concurrent", type=int, default=None, help="global cap on in-flight completions")
    g.add_argument("--max-queue", type=int, default=256, help="completions waiting for a slot (then 503)")
    g.add_argument("--queue-timeout-s", type=float, default=30.0, help="longest wait for a slot (then 503)")
    g.add_argument(
        "--otlp-endpoint",
        default=None,
        help="OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318/v1/traces (enables tracing)",
    )
    g.add_argument("--trace", action="store_true", help="create spans even without an exporter")


def _keyring(value: str | None, flag: str) -> KeyRing | None:
    if not value:
        return None
    if Path(value).is_file():
        return KeyRing.from_file(value)
    ring = KeyRing.of(value.split(","), source=f"{flag}, item")
    if not ring.entries:
        raise ValueError(f"{flag} holds no key")
    return ring


def security_from_args(args: argparse.Namespace) -> SecuritySettings:
    """Validate the flags into settings.

    Raises:
        ValueError: a key file cannot be read, holds no key or a malformed row; a limit is not positive;
            a ``--worker-allow`` entry is malformed.
    """
    for name in ("rate_limit_rpm", "rate_limit_tpm", "max_concurrent", "queue_timeout_s"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.max_queue < 0:
        raise ValueError("--max-queue must be zero or positive")
    admission = None
    if args.max_concurrent:
        admission = AdmissionLimits(args.max_concurrent, args.max_queue, args.queue_timeout_s)
    return SecuritySettings(
        api_keys=_keyring(args.api_keys, "--api-keys"),
        admin_keys=_keyring(args.admin_keys, "--admin-keys"),
        limits=RateLimits(args.rate_limit_rpm, args.rate_limit_tpm),
        admission=admission,
        otlp_endpoint=args.otlp_endpoint,
        trace=bool(args.trace or args.otlp_endpoint),
        worker_allow=WorkerAllowList.parse(args.worker_allow) if args.worker_allow else None,
    )


def bucket_store(redis: RedisProvider | None) -> BucketStore:
    """Rate-limit buckets: shared through the gateway's Redis client when its state is in Redis (``redis``
    gives that client once the app's lifespan has opened it), else in memory."""
    if redis is not None:
        return RedisBuckets(redis, MemoryBuckets())
    return MemoryBuckets()


def wrap_app(
    app: ASGIApp,
    sec: SecuritySettings,
    *,
    host: str | None = None,
    redis: RedisProvider | None = None,
    tracer: Any = None,
) -> ASGIApp:
    """Wrap ``app`` in the configured layers (none when nothing is configured and ``host`` is loopback),
    and log the control plane's access mode.

    ``host``: the address the gateway listens on (None: not known, taken as not loopback), which decides
    whether ``/admin`` is writable without keys. ``redis``: with Redis state, the state's one Redis client,
    bound late (the layers wrap the app from outside the lifespan that opens it); the rate limits then
    share buckets between replicas.
    """
    access = admin_access(api_keys=sec.api_keys is not None, admin_keys=sec.admin_keys is not None, host=host)
    log_admin_access(access)
    wrapped = app
    if sec.admission is not None:
        wrapped = AdmissionMiddleware(wrapped, Admission(sec.admission))
    if sec.limits.requests_per_minute or sec.limits.tokens_per_minute:
        wrapped = RateLimitMiddleware(wrapped, sec.limits, bucket_store(redis))
    if sec.api_keys is not None or sec.admin_keys is not None or access.needs_guard:
        wrapped = AuthMiddleware(wrapped, sec.api_keys, sec.admin_keys, access)
    if wrapped is not app:
        wrapped = ErrorLayer(wrapped)  # renders what the layers above raise
    if tracer is not None:
        from kvgate_core.tracing import TracingMiddleware

        wrapped = TracingMiddleware(wrapped, tracer)
    return wrapped
