"""The admin page in a real browser: headless Chromium loads ``/admin/ui`` from a real gateway in front of sim
workers, the test reads the rendered DOM over the DevTools protocol, drains, undrains and re-adds workers
with the page's own buttons (real mouse events), and checks each through ``/admin/workers``.

A screenshot is written to the test's ``tmp_path`` (``admin-ui.png``); with ``KVGATE_UPDATE_SCREENSHOT=1``
it also replaces ``docs/admin-ui.png``, the picture in docs/operations.md. Without Chromium the tests skip
(``make chromium`` installs Debian's package when run as root; ``make test`` does it first).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.gateway_fleet import gateway_fleet
from tests.support.chromium import Page, chromium_binary, open_page
from tests.support.procs import REPO

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        chromium_binary() is None,
        reason="Chromium is not installed: the admin page's browser tests need it "
        "(Debian/Ubuntu: apt-get install chromium; `make chromium` does it as root)",
    ),
]

MODEL = "kvgate-sim"
TOPICS = ("KV caches", "prefix routing", "speculative decoding", "paged attention")
# what each worker row shows, read from the DOM (data-col cells) as the page rendered it
ROWS_JS = """[...document.querySelectorAll('#workers tbody tr[data-worker]')].map(tr => {
  const col = name => { const td = tr.querySelector(`[data-col=${name}]`); return td ? td.innerText : null; };
  return {id: tr.dataset.worker, gone: tr.hasAttribute('data-gone'), cls: tr.className,
          engine: col('engine'), health: col('health'), index: col('index'), blocks: col('blocks'),
          rps: col('rps'), ttft: col('ttft'), hit: col('hit'), inflight: col('inflight'),
          buttons: [...tr.querySelectorAll('button')].map(b => b.dataset.action)};
})"""


def _chat(topic: str, turn: int) -> dict[str, Any]:
    system = f"You are a patient teacher of {topic}. Answer with care, in plain words, for engineers. " * 3
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"question {turn}"}],
        "max_tokens": 8,
    }


def _traffic(base: str, rounds: int = 5) -> None:
    with httpx.Client(base_url=base, timeout=30) as client:
        for turn in range(rounds):
            for topic in TOPICS:
                assert client.post("/v1/chat/completions", json=_chat(topic, turn)).status_code == 200


def _workers(base: str, headers: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    listed = httpx.get(f"{base}/admin/workers", headers=headers, timeout=10).json()["workers"]
    return {w["id"]: w for w in listed}


async def _rows(page: Page) -> dict[str, dict[str, Any]]:
    return {row["id"]: row for row in await page.evaluate(ROWS_JS)}


async def _next_poll(page: Page) -> None:
    """Until the page has rendered a state fetched after now."""
    seen = int(await page.evaluate("Number(document.body.dataset.polls || 0)"))
    await page.wait_for(f"Number(document.body.dataset.polls || 0) > {seen}")


def _save_screenshot(shot: Path) -> None:
    if os.environ.get("KVGATE_UPDATE_SCREENSHOT") == "1":
        (REPO / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shot, REPO / "docs" / "admin-ui.png")


async def test_the_page_shows_the_fleet_and_drains_undrains_and_re_adds_workers(tmp_path: Path) -> None:
    with gateway_fleet(tmp_path, num_workers=3) as fleet:
        base = fleet.gateway
        _traffic(base)
        long_stream = {**_chat(TOPICS[0], 99), "max_tokens": 1500, "ignore_eos": True, "stream": True}  # 30 s
        async with (
            httpx.AsyncClient(base_url=base, timeout=60) as client,
            client.stream("POST", "/v1/chat/completions", json=long_stream) as stream,
            open_page(tmp_path) as page,
        ):
            busy = stream.headers["x-kvgate-worker"]  # the worker serving the stream stays busy
            chunks = stream.aiter_bytes()  # held: a dropped iterator would close the stream
            await anext(chunks)
            await page.navigate(f"{base}/admin/ui")
            await page.wait_for("document.querySelectorAll('#workers tbody tr[data-worker]').length === 3")
            await _next_poll(page)
            rows = await _rows(page)
            assert set(rows) == set(fleet.workers)
            for row in rows.values():
                assert (row["engine"], row["health"], row["index"]) == ("kvgate", "healthy", "precise"), row
                assert row["buttons"] == ["drain"]
            served = [r for r in rows.values() if r["rps"] != "0"]
            assert served and all(r["ttft"].endswith("ms") for r in served)
            assert any(int(r["blocks"].replace(",", "")) > 0 for r in rows.values())
            assert any(r["hit"].split(" / ")[1] not in ("0%", "–") for r in served), rows  # reported hits
            assert rows[busy]["inflight"] == "1"
            header = await page.evaluate("document.getElementById('gateway').innerText")
            assert "policy prefix_cache_aware" in header and "state memory" in header, header
            assert "(3 precise)" in header and "predictions" in header, header
            decisions = await page.evaluate(
                "[...document.querySelectorAll('#decisions tbody tr')].map(tr => tr.innerText)"
            )
            assert len(decisions) >= 20 and all(any(w in d for w in rows) for d in decisions), decisions

            # drain the busy worker through the page: two clicks (arm, confirm); its stream keeps it listed
            await page.click(f'button[data-action="drain"][data-id="{busy}"]')
            await page.wait_for(f"!!document.querySelector('button.armed[data-id=\"{busy}\"]')")
            await page.click(f'button[data-action="drain"][data-id="{busy}"]')
            await page.wait_for(
                f"!!document.querySelector('button[data-action=undrain][data-id=\"{busy}\"]')"
            )
            assert _workers(base)[busy]["draining"] is True
            message = await page.evaluate("document.getElementById('message').innerText")
            assert f"{busy} is draining" in message, message
            await page.send(
                "Input.dispatchMouseEvent", type="mouseMoved", x=1, y=1
            )  # no hover in the picture
            await _next_poll(page)
            shot = tmp_path / "admin-ui.png"
            await page.screenshot(shot)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
            _save_screenshot(shot)

            # undrain it through the page
            await page.click(f'button[data-action="undrain"][data-id="{busy}"]')
            await page.wait_for(
                f"document.querySelector('tr[data-worker=\"{busy}\"] [data-col=health]').innerText === 'healthy'"
            )
            assert _workers(base)[busy]["draining"] is False

            # drain an idle worker: it is removed at once; the page offers to register it again
            idle = sorted(w for w in rows if w != busy)[0]
            await page.click(f'button[data-action="drain"][data-id="{idle}"]')
            await page.click(f'button[data-action="drain"][data-id="{idle}"]')
            await page.wait_for(f"!!document.querySelector('tr[data-gone][data-worker=\"{idle}\"]')")
            assert idle not in _workers(base)
            await page.click(f'button[data-action="readd"][data-id="{idle}"]')
            await page.wait_for(
                f"(document.querySelector('tr[data-worker=\"{idle}\"]:not([data-gone]) [data-col=health]')"
                " || {}).innerText === 'healthy'"
            )
            assert _workers(base)[idle]["healthy"] is True
            assert page.problems() == []  # no JavaScript error, no Content-Security-Policy violation


async def test_with_admin_keys_the_page_asks_for_the_key_once(tmp_path: Path) -> None:
    key = "adm-ui-test"
    with gateway_fleet(tmp_path, num_workers=2, gateway_args=["--admin-keys", key]) as fleet:
        base = fleet.gateway
        bearer = {"authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            for path in ("/admin/ui", "/admin/ui/state"):
                assert (await client.get(path)).status_code == 401
                assert (await client.get(path, headers=bearer)).status_code == 200
            assert (await client.post("/admin/workers/x/undrain")).status_code == 401
        async with open_page(tmp_path) as page:
            # The document itself is fetched with the key (as a reverse proxy that authenticates operators
            # would); the page's own calls carry no key until one is typed into it.
            def authorize_document(params: dict[str, Any]) -> None:
                headers = [{"name": k, "value": v} for k, v in params["request"]["headers"].items()]
                page.fire("Fetch.continueRequest", requestId=params["requestId"],
                          headers=[*headers, {"name": "Authorization", "value": f"Bearer {key}"}])  # fmt: skip

            page.on("Fetch.requestPaused", authorize_document)
            await page.send(
                "Fetch.enable", patterns=[{"urlPattern": "*/admin/ui", "requestStage": "Request"}]
            )
            await page.navigate(f"{base}/admin/ui")
            await page.wait_for("!document.getElementById('keybar').hidden")
            assert await page.evaluate("document.querySelectorAll('#workers tbody tr').length") == 0
            await page.evaluate(f"document.getElementById('key').value = {json.dumps(key)}")
            await page.click("#keybar button")
            await page.wait_for("document.querySelectorAll('#workers tbody tr[data-worker]').length === 2")
            assert await page.evaluate("document.getElementById('keybar').hidden") is True
            assert await page.evaluate("sessionStorage.getItem('kvgate-admin-key')") == key
        # the 401s of the page's first calls are the only errors the browser saw
        assert all("401" in p for p in page.problems()), page.problems()
