"""Flags and assembly of the gateway's protective layers around the ASGI app.

Order, outermost first: tracing (a span per request) → API-key auth → per-key rate limits → the global
concurrency cap → the app. Each layer is off unless configured, so the default hot path pays nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.security.admission import Admission, AdmissionLimits, AdmissionMiddleware
from gateway.security.auth import AuthMiddleware, KeyRing
from gateway.security.buckets import BucketStore, MemoryBuckets, RedisBuckets, RedisProvider
from gateway.security.errors import ErrorLayer
from gateway.security.ratelimit import RateLimitMiddleware, RateLimits
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


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the flags (each also readable from YAML and ``KVGATE_*``, e.g. ``KVGATE_API_KEYS``)."""
    g = parser.add_argument_group("security, limits and tracing")
    g.add_argument(
        "--api-keys",
        default=None,
        help="file with one API key per line, or comma-separated keys (KVGATE_API_KEYS)",
    )
    g.add_argument("--admin-keys", default=None, help="keys for /admin/*: a file or comma-separated keys")
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


def _keyring(value: str | None) -> KeyRing | None:
    if not value:
        return None
    if Path(value).is_file():
        return KeyRing.from_file(value)
    ring = KeyRing.of(value.split(","))
    if not ring.digests:
        raise ValueError("--api-keys/--admin-keys holds no key")
    return ring


def security_from_args(args: argparse.Namespace) -> SecuritySettings:
    """Validate the flags into settings.

    Raises:
        ValueError: a key file cannot be read or holds no key, or a limit is not positive.
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
        api_keys=_keyring(args.api_keys),
        admin_keys=_keyring(args.admin_keys),
        limits=RateLimits(args.rate_limit_rpm, args.rate_limit_tpm),
        admission=admission,
        otlp_endpoint=args.otlp_endpoint,
        trace=bool(args.trace or args.otlp_endpoint),
    )


def bucket_store(redis: RedisProvider | None) -> BucketStore:
    """Rate-limit buckets: shared through the gateway's Redis client when its state is in Redis (``redis``
    gives that client once the app's lifespan has opened it), else in memory."""
    if redis is not None:
        return RedisBuckets(redis, MemoryBuckets())
    return MemoryBuckets()


def wrap_app(
    app: ASGIApp, sec: SecuritySettings, *, redis: RedisProvider | None = None, tracer: Any = None
) -> ASGIApp:
    """Wrap ``app`` in the configured layers (none when nothing is configured).

    ``redis``: with Redis state, the state's one Redis client, bound late (the layers wrap the app from
    outside the lifespan that opens it); the rate limits then share buckets between replicas.
    """
    wrapped = app
    if sec.admission is not None:
        wrapped = AdmissionMiddleware(wrapped, Admission(sec.admission))
    if sec.limits.requests_per_minute or sec.limits.tokens_per_minute:
        wrapped = RateLimitMiddleware(wrapped, sec.limits, bucket_store(redis))
    if sec.api_keys is not None or sec.admin_keys is not None:
        wrapped = AuthMiddleware(wrapped, sec.api_keys, sec.admin_keys)
    if wrapped is not app:
        wrapped = ErrorLayer(wrapped)  # renders what the layers above raise
    if tracer is not None:
        from kvgate_core.tracing import TracingMiddleware

        wrapped = TracingMiddleware(wrapped, tracer)
    return wrapped
