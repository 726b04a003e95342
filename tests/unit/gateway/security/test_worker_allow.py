"""The worker allow-list of ``POST /admin/workers``: parsing, matching (pure), and the route refusing early."""

from __future__ import annotations

import httpx
import pytest

from gateway.security.worker_allow import WorkerAllowList, parse_entry, target_of
from tests.unit.gateway.fake_worker import FakeWorker, running
from tests.unit.gateway.gateway_harness import serving, settings_for

DEFAULT = WorkerAllowList.default(["http://10.0.0.5:9000", "http://Worker-0.svc:8000/v1", "not a url"])


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        # loopback, and the configured workers' hosts on any port
        ("http://127.0.0.1:8001", True),
        ("http://127.9.9.9:1", True),
        ("http://[::1]:8001", True),
        ("http://localhost:8001", True),
        ("http://LOCALHOST:8001/v1", True),
        ("https://127.0.0.1", True),
        ("http://[::ffff:127.0.0.1]:80", True),  # IPv4-mapped loopback is loopback
        ("http://10.0.0.5:1234", True),
        ("http://worker-0.svc:9999", True),
        # other addresses
        ("http://10.0.0.6:9000", False),
        ("http://10.1.2.3:80", False),
        ("http://169.254.169.254/latest/meta-data", False),
        ("http://[::ffff:10.1.2.3]:80", False),
        ("http://[::2]:80", False),
        ("http://evil.example", False),
        ("http://sub.worker-0.svc:8000", False),
        ("http://worker-0.svc.evil.example:8000", False),
        # schemes
        ("ftp://127.0.0.1/", False),
        ("file:///etc/passwd", False),
        ("gopher://127.0.0.1:70/", False),
        ("//127.0.0.1:80", False),
        # authorities other parsers could read differently
        ("http://127.0.0.1@10.1.2.3/", False),
        ("http://user:pw@127.0.0.1:80/", False),
        ("http://2130706433/", False),
        ("http://127.1/", False),
        ("http://0x7f.0.0.1/", False),
        ("http://0177.0.0.1/", False),
        ("http://localhost./", False),
        ("http://loc%61lhost/", False),
        ("http://[fe80::1%25eth0]:80/", False),
        ("http://127.0.0.1:0/", False),
        ("http://127.0.0.1:99999/", False),
        ("http://127.0.0.1:8x/", False),
        ("http://[::1/", False),
        ("http:///x", False),
        ("", False),
    ],
)
def test_default_allows_loopback_and_configured_hosts(url: str, allowed: bool) -> None:
    assert DEFAULT.allows(url) is allowed


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://10.2.3.4:8000", True),
        ("http://10.2.3.4:8001", False),
        ("http://10.2.3.4", False),  # the scheme's port, 80
        ("http://11.0.0.1:8000", False),
        ("http://[::1]:9000", True),
        ("http://[::1]:9001", False),
        ("http://127.0.0.1:9000", False),  # the list replaces the default: loopback is not in it
        ("http://gpu-1:8001", True),
        ("http://GPU-1:8001", True),
        ("https://gpu-1", False),
        ("http://gpu-10:8001", False),
        ("http://[fd12::1]:1", True),
        ("http://[fe80::1]:1", False),
        ("https://secure:443", True),
        ("https://secure", True),
        ("http://secure", False),
    ],
)
def test_given_entries_match_network_address_name_and_port(url: str, allowed: bool) -> None:
    allow = WorkerAllowList.parse(["10.0.0.0/8:8000, [::1]:9000", "GPU-1:8001", "fd00::/8,secure:443"])
    assert allow.allows(url) is allowed


def test_entries_render_as_they_parse() -> None:
    allow = WorkerAllowList.parse(["10.0.0.0/8:8000, [::1]:9000", "gpu-1", "fd00::/8", "::ffff:10.0.0.0/104"])
    assert str(allow) == "10.0.0.0/8:8000, [::1/128]:9000, gpu-1, fd00::/8, 10.0.0.0/8"
    assert WorkerAllowList.parse(["::ffff:10.0.0.0/104"]).allows("http://10.9.9.9")  # mapped → IPv4
    assert str(DEFAULT) == "127.0.0.0/8, ::1/128, localhost, 10.0.0.5/32, worker-0.svc"


def test_none_allows_nothing() -> None:
    allow = WorkerAllowList.parse(["NONE"])
    assert allow.entries == ()
    assert not allow.allows("http://127.0.0.1:8000")
    assert str(allow) == "none"


@pytest.mark.parametrize(
    "values",
    [
        [""],
        [" , "],
        ["none,10.0.0.0/8"],
        ["10.0.0.1/8"],  # host bits set: say what you mean
        ["10.0.0.0/33"],
        ["127.1"],
        ["0x7f.0.0.1"],
        ["300.1.1.1"],
        ["host:0"],
        ["host:65536"],
        ["host:http"],
        ["[::1"],
        ["[::1]9000"],
        ["bad host"],
        ["under/score/"],
        ["*.svc"],
        ["fe80::1%eth0"],
        ["http://10.0.0.1"],
    ],
)
def test_malformed_entries_are_refused(values: list[str]) -> None:
    with pytest.raises(ValueError, match="--worker-allow"):
        WorkerAllowList.parse(values)


def test_target_is_the_host_and_port_connected_to() -> None:
    target = target_of("https://[::1]/v1")
    assert target is not None and (target.host, target.port, str(target.ip)) == ("::1", 443, "::1")
    named = target_of("http://Worker:81")
    assert named is not None and (named.host, named.ip, named.port) == ("worker", None, 81)
    assert parse_entry("Worker:81").matches(named)


async def test_registration_outside_the_list_is_refused_before_the_fleet_changes() -> None:
    a = FakeWorker("a", model="m1")
    async with running(a), serving(settings_for(a.url)) as base, httpx.AsyncClient() as client:
        refused = [
            await client.post(f"{base}/admin/workers", json={"url": url, "id": f"x{i}"})
            for i, url in enumerate(
                ["http://10.1.2.3:80", "http://127.0.0.1@10.1.2.3/", "http://[::ffff:10.1.2.3]:80"]
            )
        ]
        workers = (await client.get(f"{base}/admin/workers")).json()["workers"]
    for resp in refused:
        assert resp.status_code == 403
        error = resp.json()["error"]
        assert (error["code"], error["param"], error["type"]) == (
            "worker_not_allowed",
            "url",
            "invalid_request_error",
        )
    assert [w["url"] for w in workers] == [a.url]


async def test_role_and_id_cannot_smuggle_fragment_keys() -> None:
    a, b = FakeWorker("a", model="m1"), FakeWorker("b", model="m1")
    smuggled = "&events=tcp://10.1.2.3:5557&engine=vllm"
    async with running(a, b), serving(settings_for(a.url)) as base, httpx.AsyncClient() as client:
        bad_role = await client.post(f"{base}/admin/workers", json={"url": b.url, "role": "both" + smuggled})
        added = await client.post(f"{base}/admin/workers", json={"url": b.url, "id": "b" + smuggled})
        rows = (await client.get(f"{base}/admin/workers")).json()["workers"]
    assert bad_role.status_code == 400
    assert added.status_code == 201 and added.json()["id"] == "b" + smuggled  # the id, as given
    row = next(r for r in rows if r["url"] == b.url)
    assert row["engine"]["events"] is None and row["engine"]["configured"] != "vllm"
