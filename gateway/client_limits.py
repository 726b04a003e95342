"""The client-facing connection limits (``--client-*`` flags), the same for ``--http-server kvgate`` and
``uvicorn``: head size counted as bytes arrive, a deadline for the head, a minimum body rate, keep-alive."""

from __future__ import annotations

import argparse

from kvgate_core.h1_server.context import ServerLimits

#: seconds an idle client keep-alive connection stays open (both servers)
KEEP_ALIVE_S = 30.0


def add_client_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the flags (each also readable from YAML and ``KVGATE_*``)."""
    d = ServerLimits()
    g = parser.add_argument_group("client connections")
    g.add_argument(
        "--client-head-timeout-s", type=float, default=d.head_timeout_s,
        help="a request's line and headers must arrive within this long of their first byte, else 408 and "
        f"the connection closes (default {d.head_timeout_s:g})",
    )  # fmt: skip
    g.add_argument(
        "--client-body-timeout-s", type=float, default=d.body_timeout_s,
        help="a request body must arrive within this long plus one second per --client-min-body-rate bytes, "
        f"else 408 and the connection closes (default {d.body_timeout_s:g})",
    )  # fmt: skip
    g.add_argument(
        "--client-min-body-rate", type=float, default=d.min_body_rate,
        help=f"bytes per second a request body must average past --client-body-timeout-s (default "
        f"{d.min_body_rate:g})",
    )  # fmt: skip
    g.add_argument(
        "--client-max-head-bytes", type=int, default=d.max_head_bytes,
        help=f"request line plus headers, counted as they arrive; more: 431 (default {d.max_head_bytes})",
    )  # fmt: skip
    g.add_argument(
        "--client-keep-alive-s", type=float, default=KEEP_ALIVE_S,
        help=f"an idle client keep-alive connection closes after this long (default {KEEP_ALIVE_S:g})",
    )  # fmt: skip


def client_limits_from_args(args: argparse.Namespace) -> ServerLimits:
    """The limits the flags give.

    Raises:
        ValueError: a timeout, the rate or the head size is not positive.
    """
    if args.client_max_head_bytes < 1024:
        raise ValueError("--client-max-head-bytes must be at least 1024")
    return ServerLimits(
        keep_alive_s=args.client_keep_alive_s,
        max_head_bytes=args.client_max_head_bytes,
        head_timeout_s=args.client_head_timeout_s,
        body_timeout_s=args.client_body_timeout_s,
        min_body_rate=args.client_min_body_rate,
    )
