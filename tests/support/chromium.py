"""Headless Chromium for browser tests, driven over the DevTools protocol (a websocket, via aiohttp).

``chromium_binary()`` finds Debian's ``chromium`` (``make chromium`` installs it as root); tests skip without
it. ``open_page`` starts the browser on loopback with a throw-away profile, opens one tab and yields a
``Page``: navigate, evaluate JavaScript, wait for a condition, click an element with real mouse events,
intercept requests, take a screenshot. The browser is stopped by PID on exit. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.procs import start_process, stop_process

_BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_FLAGS = (
    "--headless",
    "--no-sandbox",  # root in a container: the sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",  # the port chosen is written to DevToolsActivePort in the profile
)

Handler = Callable[[dict[str, Any]], None]


def chromium_binary() -> str | None:
    """The first Chromium-family browser on PATH, or None."""
    for name in _BINARIES:
        if path := shutil.which(name):
            return path
    return None


class DevToolsError(RuntimeError):
    """A DevTools command failed, or the page's JavaScript threw."""


class Page:
    """One browser tab over its DevTools websocket; ``events`` keeps every event received, in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._handlers: dict[str, Handler] = {}
        self.events: list[dict[str, Any]] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type is not aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            if "id" in data:
                future = self._waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            self.events.append(data)
            handler = self._handlers.get(data.get("method", ""))
            if handler is not None:
                handler(data.get("params", {}))
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(DevToolsError("the DevTools connection closed"))

    def on(self, method: str, handler: Handler) -> None:
        """Call ``handler(params)`` for each ``method`` event (one handler per event name)."""
        self._handlers[method] = handler

    async def send(self, method: str, timeout_s: float = 15.0, **params: Any) -> dict[str, Any]:
        """Run one DevTools command; its ``result``."""
        msg_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = future
        await self._ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        async with asyncio.timeout(timeout_s):
            reply = await future
        if "error" in reply:
            raise DevToolsError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def fire(self, method: str, **params: Any) -> None:
        """Send a command without waiting for its answer (from an event handler)."""
        msg_id = next(self._ids)
        task = asyncio.get_running_loop().create_task(
            self._ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        )
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited, results JSON-copied)."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 15.0) -> Any:
        """Poll a JavaScript expression until it is truthy; its value. TimeoutError after ``timeout_s``."""
        async with asyncio.timeout(timeout_s):
            while True:
                value = await self.evaluate(expression)
                if value:
                    return value
                await asyncio.sleep(0.1)

    async def navigate(self, url: str, timeout_s: float = 15.0) -> None:
        """Open ``url`` and wait for its load event (the document and its inline script have run)."""
        loaded = asyncio.Event()
        self.on("Page.loadEventFired", lambda _params: loaded.set())
        result = await self.send("Page.navigate", url=url)
        if "errorText" in result:
            raise DevToolsError(f"cannot open {url}: {result['errorText']}")
        async with asyncio.timeout(timeout_s):
            await loaded.wait()

    async def click(self, selector: str) -> None:
        """Click the element's centre with real mouse events (it must be visible and not covered)."""
        box = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return {x: r.x + r.width / 2, y: r.y + r.height / 2}; })()"
        )
        if box is None:
            raise DevToolsError(f"no element matches {selector!r}")
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent", type=kind, x=box["x"], y=box["y"], button="left", clickCount=1
            )

    async def screenshot(self, path: Path) -> None:
        """A PNG of the whole page (beyond the window when it is taller)."""
        result = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await asyncio.to_thread(path.write_bytes, base64.b64decode(result["data"]))

    def problems(self) -> list[str]:
        """JavaScript exceptions and console or browser errors seen so far (CSP violations included)."""
        out = []
        for event in self.events:
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                out.append(str(params.get("exceptionDetails", {}).get("exception", {}).get("description")))
            elif event.get("method") == "Log.entryAdded" and params["entry"]["level"] == "error":
                out.append(str(params["entry"].get("text")))
        return out

    async def close(self) -> None:
        self._reader.cancel()
        with suppress(asyncio.CancelledError):
            await self._reader
        await self._ws.close()


async def _devtools_port(profile: Path, timeout_s: float = 30.0) -> int:
    active = profile / "DevToolsActivePort"
    async with asyncio.timeout(timeout_s):
        while not (active.exists() and active.read_text().strip()):  # noqa: ASYNC110 - a file to poll
            await asyncio.sleep(0.05)
    return int(active.read_text().split()[0])


async def _page_target(session: aiohttp.ClientSession, port: int, timeout_s: float = 15.0) -> str:
    async with asyncio.timeout(timeout_s):
        while True:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                targets = await resp.json()
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
            await asyncio.sleep(0.05)


@asynccontextmanager
async def open_page(folder: Path, *, width: int = 1400, height: int = 900) -> AsyncIterator[Page]:
    """Start headless Chromium (profile and log in ``folder``) and yield its one tab, with the Page,
    Runtime and Log domains enabled. Raises RuntimeError when no Chromium is installed."""
    binary = chromium_binary()
    if binary is None:
        raise RuntimeError("no Chromium on PATH")
    profile = folder / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    args = [binary, *_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]
    proc = start_process(args, log=folder / "chromium.log")
    try:
        port = await _devtools_port(profile)
        async with aiohttp.ClientSession() as session:
            url = await _page_target(session, port)
            async with session.ws_connect(url, max_msg_size=0) as ws:
                page = Page(ws)
                try:
                    for domain in ("Page", "Runtime", "Log"):
                        await page.send(f"{domain}.enable")
                    await page.send(
                        "Emulation.setDeviceMetricsOverride",
                        width=width, height=height, deviceScaleFactor=1, mobile=False,
                    )  # fmt: skip
                    yield page
                finally:
                    await page.close()
    finally:
        stop_process(proc)
