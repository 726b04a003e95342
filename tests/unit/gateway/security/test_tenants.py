"""Tenants bound to keys: key-file rows, the effective tenant, and the header rewrite in the auth layer."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gateway.errors import InvalidRequest
from gateway.security.auth import AuthMiddleware, KeyRing
from gateway.security.errors import ErrorLayer
from gateway.security.setup import add_security_arguments, security_from_args
from gateway.security.tenants import claimed_tenant, effective_tenant, with_tenant
from kvgate_core.asgi import Message, Receive, Scope, Send

HEADER = b"x-kvgate-tenant"


def test_key_file_rows_name_tenants(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text(
        "# KEY [tenant=NAME]\n"
        "sk-acme   tenant=acme\n"
        "\tsk-globex\ttenant=Globex_2.eu-1  # a comment\n"
        "sk-plain\n"
        "\n"
        "c2stYmFzZTY0== tenant=b64\n"
        "sk-acme tenant=acme\n"  # repeated alike: harmless
    )
    ring = KeyRing.from_file(f)
    found = {key: ring.lookup(key) for key in ("sk-acme", "sk-globex", "sk-plain", "c2stYmFzZTY0==")}
    assert {k: m.tenant if m else "-" for k, m in found.items()} == {
        "sk-acme": "acme",
        "sk-globex": "Globex_2.eu-1",
        "sk-plain": None,
        "c2stYmFzZTY0==": "b64",
    }
    assert len(ring.entries) == 4
    assert ring.lookup("sk-acme tenant=acme") is None and ring.lookup("acme") is None
    assert ring.match("sk-plain") == found["sk-plain"].key_id  # type: ignore[union-attr]


def test_plain_files_and_comma_lists_keep_working(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("sk-one\nsk-two\n")
    assert KeyRing.from_file(f).lookup("sk-two") is not None
    ring = security_from_args(_args("--api-keys", "sk-a tenant=a, sk-b ,sk-c")).api_keys
    assert ring is not None
    assert [ring.lookup(k).tenant for k in ("sk-a", "sk-b", "sk-c")] == ["a", None, None]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ("sk-secret tenant=", "tenant name"),
        ("sk-secret tenant=a/b", "tenant name"),
        ("sk-secret tenant=a:b", "tenant name"),
        ("sk-secret tenant=" + "a" * 65, "tenant name"),
        ("sk-secret role=admin", "only tenant=NAME"),
        ("sk-secret sk-other", "only tenant=NAME"),
        ("sk-secret tenant=a tenant=b", "twice"),
    ],
)
def test_malformed_rows_are_refused_without_quoting_the_key(tmp_path: Path, row: str, words: str) -> None:
    f = tmp_path / "keys"
    f.write_text(f"sk-fine\n{row}\n")
    with pytest.raises(ValueError, match=words) as exc:
        KeyRing.from_file(f)
    assert "line 2" in str(exc.value) and "sk-secret" not in str(exc.value)


def test_one_key_cannot_have_two_tenants() -> None:
    with pytest.raises(ValueError, match="another tenant") as exc:
        KeyRing.of(["sk-secret tenant=a", "sk-secret tenant=b"])
    assert "sk-secret" not in str(exc.value)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_security_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_read_tenant_rows_and_the_allow_list(tmp_path: Path) -> None:
    sec = security_from_args(_args("--api-keys", "sk-a tenant=a,sk-b", "--worker-allow", "10.0.0.0/8"))
    assert sec.api_keys is not None and sec.api_keys.lookup("sk-a").tenant == "a"  # type: ignore[union-attr]
    assert sec.worker_allow is not None and sec.worker_allow.allows("http://10.1.1.1:80")
    assert not sec.worker_allow_for(["http://10.0.0.1"]).allows("http://127.0.0.1:80")  # given: replaces
    default = security_from_args(_args()).worker_allow_for(["http://gpu-0:8000"])
    assert default.allows("http://gpu-0:1") and default.allows("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="--api-keys, item 1"):
        security_from_args(_args("--api-keys", "sk-a tenant=a/b"))
    with pytest.raises(ValueError, match="--worker-allow"):
        security_from_args(_args("--worker-allow", "10.0.0.1/8"))


@pytest.mark.parametrize(
    ("key_tenant", "claimed", "effective"),
    [
        ("acme", None, "acme"),
        ("acme", "team-1", "acme/team-1"),
        ("acme", "globex", "acme/globex"),  # narrowing never crosses: still under acme
        ("acme", "../globex", "acme/../globex"),
        (None, None, None),
        (None, "acme", "key:0123456789ab/acme"),
    ],
)
def test_the_header_only_narrows_within_the_key(
    key_tenant: str | None, claimed: str | None, effective: str | None
) -> None:
    assert effective_tenant(key_tenant=key_tenant, key_id="0123456789ab", claimed=claimed) == effective


def test_claimed_tenant_refuses_repeats_and_bad_values() -> None:
    assert claimed_tenant([(b"host", b"x")]) is None
    assert claimed_tenant([(HEADER, b"team/1:a~")]) == "team/1:a~"
    bad = [
        [(HEADER, b"a"), (HEADER, b"a")],
        [(HEADER, b"a"), (HEADER, b"b")],
        [(HEADER, b"a"), (b"X-Kvgate-Tenant", b"b")],  # a server that kept the client's case
        [(HEADER, b"")],
        [(HEADER, b"a b")],
        [(HEADER, b"a\tb")],
        [(HEADER, b"caf\xe9")],
        [(HEADER, b"a\x00")],
        [(HEADER, b"a" * 129)],
    ]
    for headers in bad:
        with pytest.raises(InvalidRequest) as exc:
            claimed_tenant(headers)
        assert exc.value.param == "x-kvgate-tenant"
    assert claimed_tenant([(HEADER, b"a" * 128)]) == "a" * 128


def test_with_tenant_drops_every_copy() -> None:
    headers = [(b"a", b"1"), (HEADER, b"x"), (b"X-KVGATE-TENANT", b"y"), (b"b", b"2")]
    assert with_tenant(headers, "t") == [(b"a", b"1"), (b"b", b"2"), (HEADER, b"t")]
    assert with_tenant(headers, None) == [(b"a", b"1"), (b"b", b"2")]


class Seen:
    """An app that records the tenant headers each request reached it with."""

    def __init__(self) -> None:
        self.tenants: list[list[bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.tenants.append([v for k, v in scope["headers"] if k.lower() == HEADER])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def _request(app: object, path: str, headers: list[tuple[bytes, bytes]]) -> int:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": headers}
    await app(scope, receive, send)  # type: ignore[operator]
    return int(sent[0]["status"])


def _key(key: str) -> tuple[bytes, bytes]:
    return (b"authorization", f"Bearer {key}".encode())


async def test_the_auth_layer_sets_the_effective_tenant_only() -> None:
    seen = Seen()
    ring = KeyRing.of(["sk-a tenant=a", "sk-b tenant=b", "sk-p", "sk-q"])
    app = ErrorLayer(AuthMiddleware(seen, ring, KeyRing.of(["adm"])))
    p_id, q_id = ring.match("sk-p"), ring.match("sk-q")
    path = "/v1/chat/completions"
    statuses = [
        await _request(app, path, [_key("sk-a")]),
        await _request(app, path, [_key("sk-a"), (HEADER, b"team-1")]),
        await _request(app, path, [_key("sk-b"), (HEADER, b"a")]),  # b claims a: stays in b
        await _request(app, path, [_key("sk-p")]),
        await _request(app, path, [_key("sk-p"), (HEADER, b"a")]),
        await _request(app, path, [_key("sk-q"), (HEADER, b"a")]),  # same claim, another key
        await _request(app, "/admin/route", [_key("adm"), (HEADER, b"a")]),  # an operator names any
    ]
    assert statuses == [200] * 7
    assert seen.tenants == [
        [b"a"],
        [b"a/team-1"],
        [b"b/a"],
        [],
        [f"key:{p_id}/a".encode()],
        [f"key:{q_id}/a".encode()],
        [b"a"],
    ]


@pytest.mark.parametrize(
    "headers",
    [
        [(HEADER, b"b"), (HEADER, b"a")],
        [(HEADER, b"a"), (b"X-Kvgate-Tenant", b"b")],
        [(HEADER, b"a b")],
        [(HEADER, b"\xff")],
    ],
    ids=["duplicate", "duplicate-case", "space", "non-ascii"],
)
async def test_smuggled_or_bad_headers_are_refused(headers: list[tuple[bytes, bytes]]) -> None:
    seen = Seen()
    app = ErrorLayer(AuthMiddleware(seen, KeyRing.of(["sk-a tenant=a"]), None))
    assert await _request(app, "/v1/chat/completions", [_key("sk-a"), *headers]) == 400
    assert seen.tenants == []


async def test_without_client_keys_the_header_is_the_clients() -> None:
    seen = Seen()
    app = ErrorLayer(AuthMiddleware(seen, None, KeyRing.of(["adm"])))
    assert await _request(app, "/v1/chat/completions", [(HEADER, b"whatever")]) == 200
    assert seen.tenants == [[b"whatever"]]
