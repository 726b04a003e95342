"""The control plane's access modes: the decision, the start-up line, and what each mode lets through."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gateway.security.admin_access import AdminMode, admin_access, is_loopback_host, log_admin_access
from gateway.security.auth import AuthMiddleware, KeyRing
from gateway.security.errors import ErrorLayer
from gateway.security.setup import SecuritySettings, wrap_app
from kvgate_core.asgi import ASGIApp, Message, Receive, Scope, Send

USER = KeyRing.of(["sk-user"])
ADMIN = KeyRing.of(["sk-admin"])


async def ok_app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def call(
    app: ASGIApp, method: str, path: str, key: str | None = None, **scope: Any
) -> tuple[int, bytes]:
    """One request through ``app`` on a raw ASGI channel: its status and body."""
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    full = {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers, **scope}
    await app(full, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


@pytest.mark.parametrize(
    ("api_keys", "admin_keys", "host", "mode"),
    [
        (True, True, "0.0.0.0", AdminMode.ADMIN_KEYS),
        (False, True, "127.0.0.1", AdminMode.ADMIN_KEYS),
        (True, False, "127.0.0.1", AdminMode.CLOSED),  # client keys close /admin even on loopback
        (True, False, "0.0.0.0", AdminMode.CLOSED),
        (False, False, "127.0.0.1", AdminMode.LOOPBACK),
        (False, False, "::1", AdminMode.LOOPBACK),
        (False, False, "localhost", AdminMode.LOOPBACK),
        (False, False, "0.0.0.0", AdminMode.READ_ONLY),
        (False, False, "::", AdminMode.READ_ONLY),
        (False, False, "10.0.0.5", AdminMode.READ_ONLY),
        (False, False, None, AdminMode.READ_ONLY),  # not known: not loopback
    ],
)
def test_the_mode_follows_keys_then_listen_address(
    api_keys: bool, admin_keys: bool, host: str | None, mode: AdminMode
) -> None:
    access = admin_access(api_keys=api_keys, admin_keys=admin_keys, host=host)
    assert access.mode is mode
    assert access.reason


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("LocalHost", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        (None, False),
        ("10.0.0.1", False),
        ("localhost.example", False),  # never resolved
        ("127.1", False),
    ],
)
def test_loopback_is_decided_without_resolving(host: str | None, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(
    ("api", "admin", "host", "level", "words"),
    [
        (False, True, "0.0.0.0", logging.INFO, "admin-keys mode"),
        (True, False, "127.0.0.1", logging.WARNING, "set --admin-keys"),
        (False, False, "127.0.0.1", logging.INFO, "loopback mode"),
        (False, False, "0.0.0.0", logging.WARNING, "--host 0.0.0.0 is not loopback"),
    ],
)
def test_one_start_up_line_says_the_mode_and_why(
    caplog: pytest.LogCaptureFixture, api: bool, admin: bool, host: str, level: int, words: str
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.security.admin_access")
    log_admin_access(admin_access(api_keys=api, admin_keys=admin, host=host))
    assert [(r.levelno, words in r.getMessage()) for r in caplog.records] == [(level, True)]
    assert caplog.records[0].getMessage().startswith("admin API: ")


def _app(api: KeyRing | None, admin: KeyRing | None, host: str) -> ASGIApp:
    return wrap_app(ok_app, SecuritySettings(api_keys=api, admin_keys=admin), host=host)


# (keys set, host, method, path, key) → status, error code
CASES = [
    # --admin-keys: reads and writes need an admin key; a client key is not one
    ("both", "0.0.0.0", "POST", "/admin/workers", None, 401, "invalid_api_key"),
    ("both", "0.0.0.0", "POST", "/admin/workers", "sk-user", 401, "invalid_api_key"),
    ("both", "0.0.0.0", "GET", "/admin/workers", "sk-user", 401, "invalid_api_key"),
    ("both", "0.0.0.0", "GET", "/admin/ui", None, 401, "invalid_api_key"),
    ("both", "0.0.0.0", "POST", "/admin/workers", "sk-admin", 200, None),
    ("both", "0.0.0.0", "DELETE", "/admin/workers/w", "sk-admin", 200, None),
    ("admin", "127.0.0.1", "GET", "/admin/workers", None, 401, "invalid_api_key"),
    ("admin", "127.0.0.1", "GET", "/admin/workers", "sk-admin", 200, None),
    # --api-keys only: /admin is closed whatever the key or the address
    ("api", "127.0.0.1", "POST", "/admin/workers", None, 403, "admin_keys_required"),
    ("api", "127.0.0.1", "POST", "/admin/workers", "sk-user", 403, "admin_keys_required"),
    ("api", "0.0.0.0", "DELETE", "/admin/workers/w", "sk-user", 403, "admin_keys_required"),
    ("api", "0.0.0.0", "GET", "/admin/workers", "sk-user", 403, "admin_keys_required"),
    ("api", "0.0.0.0", "GET", "/admin/ui", None, 403, "admin_keys_required"),
    ("api", "0.0.0.0", "POST", "/v1/chat/completions", "sk-user", 200, None),
    ("api", "0.0.0.0", "POST", "/v1/chat/completions", None, 401, "invalid_api_key"),
    # no keys beyond loopback: reads open, writes refused, /v1 open
    ("none", "0.0.0.0", "POST", "/admin/workers", None, 403, "admin_read_only"),
    ("none", "0.0.0.0", "DELETE", "/admin/workers/w", None, 403, "admin_read_only"),
    ("none", "0.0.0.0", "PUT", "/admin/workers", None, 403, "admin_read_only"),
    ("none", "0.0.0.0", "PATCH", "/admin/workers", None, 403, "admin_read_only"),
    ("none", "0.0.0.0", "POST", "/admin/workers/w/undrain", None, 403, "admin_read_only"),
    ("none", "0.0.0.0", "POST", "/admin/route", None, 403, "admin_read_only"),
    ("none", "::", "POST", "/admin/parity", None, 403, "admin_read_only"),
    ("none", "0.0.0.0", "GET", "/admin/workers", None, 200, None),
    ("none", "0.0.0.0", "HEAD", "/admin/ui", None, 200, None),
    ("none", "0.0.0.0", "POST", "/v1/chat/completions", None, 200, None),
    # no keys on loopback: open
    ("none", "127.0.0.1", "POST", "/admin/workers", None, 200, None),
    ("none", "::1", "DELETE", "/admin/workers/w", None, 200, None),
]
RINGS = {"both": (USER, ADMIN), "admin": (None, ADMIN), "api": (USER, None), "none": (None, None)}


@pytest.mark.parametrize(("keys", "host", "method", "path", "key", "status", "code"), CASES)
async def test_each_mode_guards_admin_routes(
    keys: str, host: str, method: str, path: str, key: str | None, status: int, code: str | None
) -> None:
    status_got, body = await call(_app(*RINGS[keys], host), method, path, key)
    assert status_got == status
    if code is not None:
        assert f'"code":"{code}"'.encode() in body
        assert b"sk-" not in body


@pytest.mark.parametrize("keys", list(RINGS))
@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics"])
async def test_probes_and_scrapers_stay_open_in_every_mode(keys: str, path: str) -> None:
    for host in ("127.0.0.1", "0.0.0.0"):
        assert (await call(_app(*RINGS[keys], host), "GET", path))[0] == 200


def test_no_layer_at_all_without_keys_on_loopback() -> None:
    assert wrap_app(ok_app, SecuritySettings(), host="127.0.0.1") is ok_app
    assert wrap_app(ok_app, SecuritySettings(), host="0.0.0.0") is not ok_app
    assert wrap_app(ok_app, SecuritySettings()) is not ok_app  # address unknown: guarded


async def test_a_root_path_cannot_hide_an_admin_route() -> None:
    app = ErrorLayer(AuthMiddleware(ok_app, USER, None))
    status, _ = await call(app, "POST", "/gw/admin/workers", "sk-user", root_path="/gw")
    assert status == 403


async def test_the_middleware_alone_defaults_to_closed_without_admin_keys() -> None:
    app = ErrorLayer(AuthMiddleware(ok_app, USER, None))
    assert (await call(app, "GET", "/admin/workers", "sk-user"))[0] == 403
    assert (await call(app, "GET", "/v1/models", "sk-user"))[0] == 200
