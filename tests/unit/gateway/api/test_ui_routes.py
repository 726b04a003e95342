"""The admin page: a self-contained document, the state it polls (matching its documented schema), undrain,
and the admin keys in front of both."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

import httpx
import jsonschema_rs

from gateway.api.application import build_gateway_app
from gateway.security.auth import KeyRing
from gateway.security.setup import SecuritySettings, wrap_app
from tests.unit.gateway.fake_worker import FakeWorker, running
from tests.unit.gateway.gateway_harness import serving, settings_for, until

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "a question about the admin page " * 4}]}


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _schema(document: dict[str, Any], path: str, method: str = "get") -> dict[str, Any]:
    schema = document["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
    return {**schema, "components": document["components"]}


async def test_the_page_inlines_everything_and_its_policy_allows_only_that() -> None:
    app = build_gateway_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        page = await client.get("/admin/ui")
        head = await client.head("/admin/ui")
    assert page.status_code == 200 and head.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert "/*STYLE*/" not in html and "/*SCRIPT*/" not in html
    assert re.findall(r"\b(?:src|href)=\"([^\"]*)\"", html) == ["data:,"]  # the empty favicon, nothing else
    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    script = re.search(r"<script>(.*)</script>", html, re.S)
    style = re.search(r"<style>(.*)</style>", html, re.S)
    assert script is not None and style is not None
    csp = page.headers["content-security-policy"]
    assert f"script-src {_csp_hash(script.group(1))}" in csp
    assert f"style-src {_csp_hash(style.group(1))}" in csp
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "/admin/ui/state" in script.group(1)


async def test_state_shows_each_worker_its_window_and_the_last_decisions() -> None:
    a, b = FakeWorker("a", model="m1"), FakeWorker("b", model="m1")
    settings = settings_for(
        a.url, b.url, policy="prefix_cache_aware", tokenizer="bytes", kv_index="approximate"
    )
    async with running(a, b), serving(settings) as base, httpx.AsyncClient(base_url=base) as client:
        for _ in range(4):
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        resp = await client.get("/admin/ui/state")
        document = (await client.get("/openapi.json")).json()
    assert resp.status_code == 200
    jsonschema_rs.validate(_schema(document, "/admin/ui/state"), resp.json())
    state = resp.json()
    gw = state["gateway"]
    assert (gw["policy"], gw["state"], gw["redis_degraded"], gw["kv_index"]) == (
        "prefix_cache_aware", "memory", None, "approximate",
    )  # fmt: skip
    assert gw["replicas"] == 1 and gw["index_blocks"] > 0 and gw["drift"] is False
    assert gw["block_size"] > 0 and gw["block_unit"] in ("tokens", "bytes")
    workers = {w["id"]: w for w in state["workers"]}
    assert set(workers) == {f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"}
    served = [w for w in workers.values() if w["window"]["requests"]]
    assert sum(w["window"]["requests"] for w in served) == 4
    busy = max(served, key=lambda w: w["window"]["requests"])
    assert busy["index"]["mode"] == "approximate" and busy["index"]["blocks"] > 0
    assert busy["window"]["ttft_p50_s"] > 0 and busy["window"]["errors"] == 0
    assert busy["window"]["reported_hit"] is not None and busy["drift"] is False
    assert (busy["running"], busy["queue"], busy["engine"]["kind"]) == (1, 2, "kvgate")  # the fake's /load
    decisions = state["decisions"]
    assert len(decisions) == 4 and decisions[0]["age_s"] <= decisions[-1]["age_s"]
    assert decisions[0]["worker"] in workers and decisions[0]["reason"]
    assert {c["id"] for c in decisions[0]["candidates"]} == set(workers)


async def test_state_without_a_prefix_index() -> None:
    a = FakeWorker("a", model="m1")
    async with running(a), serving(settings_for(a.url)) as base, httpx.AsyncClient(base_url=base) as client:
        await client.post("/v1/chat/completions", json=CHAT)
        state = (await client.get("/admin/ui/state")).json()
    assert (state["gateway"]["kv_index"], state["gateway"]["drift"], state["gateway"]["index_blocks"]) == (
        "off", None, None,
    )  # fmt: skip
    assert (state["gateway"]["block_size"], state["gateway"]["block_unit"]) == (None, None)
    worker = state["workers"][0]
    assert worker["index"]["mode"] == "off" and worker["window"]["predicted_hit"] is None
    assert state["decisions"][0]["blocks"] == 0


async def test_undrain_cancels_a_drain_while_requests_are_in_flight() -> None:
    a = FakeWorker("a", model="m1", mode="slow_stream", chunks=20)
    wid = f"127.0.0.1:{a.port}"
    async with running(a), serving(settings_for(a.url)) as base, httpx.AsyncClient(base_url=base) as client:
        async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as s:
            chunks = s.aiter_bytes()
            await anext(chunks)
            drained = await client.delete(f"/admin/workers/{wid}")
            undrained = await client.post(f"/admin/workers/{wid}/undrain")
            state = (await client.get("/admin/ui/state")).json()
            rest = b"".join([c async for c in chunks])
        again = await client.post("/v1/chat/completions", json=CHAT)
        missing = await client.post("/admin/workers/nope/undrain")
        document = (await client.get("/openapi.json")).json()
    assert drained.json()["draining"] is True
    assert undrained.status_code == 200 and undrained.json()["draining"] is False
    jsonschema_rs.validate(_schema(document, "/admin/workers/{worker_id}/undrain", "post"), undrained.json())
    assert state["workers"][0]["draining"] is False and state["workers"][0]["inflight"] == 1
    assert rest.endswith(b"data: [DONE]\n\n")
    assert again.status_code == 200  # still in the fleet: the drain was cancelled before it finished
    assert missing.status_code == 404 and "register it again" in missing.json()["error"]["message"]


async def test_a_drained_idle_worker_leaves_the_page_state() -> None:
    a, b = FakeWorker("a", model="m1"), FakeWorker("b", model="m1")
    async with (
        running(a, b),
        serving(settings_for(a.url, b.url)) as base,
        httpx.AsyncClient(base_url=base) as c,
    ):
        await c.delete(f"/admin/workers/127.0.0.1:{a.port}")

        async def one_left() -> bool:
            return len((await c.get("/admin/ui/state")).json()["workers"]) == 1

        await until(one_left)


async def test_admin_keys_guard_the_page_its_state_and_undrain() -> None:
    sec = SecuritySettings(admin_keys=KeyRing.of(["adm-1"]))
    app = wrap_app(build_gateway_app(), sec)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        page = await client.get("/admin/ui")
        state = await client.get("/admin/ui/state")
        undrain = await client.post("/admin/workers/w0/undrain")
        wrong = await client.get("/admin/ui", headers={"authorization": "Bearer nope"})
        keyed = await client.get("/admin/ui", headers={"authorization": "Bearer adm-1"})
    assert [r.status_code for r in (page, state, undrain, wrong)] == [401, 401, 401, 401]
    assert page.json()["error"]["code"] == "invalid_api_key"
    assert keyed.status_code == 200 and '<table id="workers">' in keyed.text
