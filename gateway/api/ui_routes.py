"""``GET /admin/ui``: the gateway's admin page, and ``GET /admin/ui/state``, the JSON it polls.

The page is one self-contained HTML document assembled once from the package files in ``gateway/api/ui/``
(``page.html`` with ``style.css`` and ``app.js`` inlined): no CDN, no build step, nothing fetched but the
admin API of the gateway that served it. Its Content-Security-Policy allows exactly that: the inlined style
and script (by hash) and requests to its own origin. The page polls ``/admin/ui/state`` and drains or
undrains workers through ``/admin/workers``; like every ``/admin`` path these need an admin key when
``--admin-keys`` is set (``gateway.security.auth``), which the page asks for once and sends as
``Authorization: Bearer``.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from importlib import resources

from fastapi import APIRouter, Request, Response

from gateway.api.control import CLIENT_ERRORS, AppDeps, ControlRoute, add_get
from gateway.api.ui_state import UiState, ui_state

_STYLE_SLOT = "/*STYLE*/"
_SCRIPT_SLOT = "/*SCRIPT*/"


@dataclass(frozen=True, slots=True)
class Page:
    """The assembled document and the headers it is served with."""

    body: bytes
    headers: dict[str, str]


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def load_page() -> Page:
    """Read the page's files from the package and inline the style and the script into the document."""
    folder = resources.files("gateway.api") / "ui"
    html = (folder / "page.html").read_text(encoding="utf-8")
    style = (folder / "style.css").read_text(encoding="utf-8")
    script = (folder / "app.js").read_text(encoding="utf-8")
    if html.count(_STYLE_SLOT) != 1 or html.count(_SCRIPT_SLOT) != 1:
        raise RuntimeError("gateway/api/ui/page.html must hold one style slot and one script slot")
    body = html.replace(_STYLE_SLOT, style).replace(_SCRIPT_SLOT, script)
    policy = "; ".join((
        "default-src 'none'", f"script-src {_sha256(script)}", f"style-src {_sha256(style)}",
        "connect-src 'self'", "img-src data:", "base-uri 'none'", "form-action 'none'",
        "frame-ancestors 'none'",
    ))  # fmt: skip
    headers = {
        "content-security-policy": policy,
        "cache-control": "no-store",
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
    }
    return Page(body.encode(), headers)


def ui_router() -> APIRouter:
    """``/admin/ui`` and ``/admin/ui/state`` (guarded with the rest of ``/admin`` by the admin keys)."""
    page = load_page()

    async def admin_page() -> Response:
        """The admin page (HTML): the fleet, its figures and the last routing decisions, live."""
        return Response(page.body, media_type="text/html; charset=utf-8", headers=page.headers)

    async def admin_page_state(request: Request, deps: AppDeps) -> UiState:
        """What the admin page shows: the gateway, each worker with its recent figures, the last decisions."""
        return await ui_state(deps, request.app.version)

    router = APIRouter(tags=["admin"], route_class=ControlRoute, responses=CLIENT_ERRORS)
    add_get(
        router,
        "/admin/ui",
        admin_page,
        response_class=Response,
        operation_id="adminPage",
        responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}}},
    )
    add_get(
        router, "/admin/ui/state", admin_page_state, response_model=UiState, operation_id="adminPageState"
    )
    return router
