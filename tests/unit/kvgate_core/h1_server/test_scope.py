"""The scope the lean server builds: a trusted local proxy's X-Forwarded-For / -Proto are believed."""

from __future__ import annotations

import pytest

from kvgate_core.h1_server.scope import build_scope


def _scope(client: tuple[str, int], *headers: tuple[bytes, bytes]) -> dict[str, object]:
    return build_scope(b"GET", b"/v1/models?x=1", "1.1", list(headers), client, ("127.0.0.1", 8000), {})


@pytest.mark.parametrize(
    ("client", "headers", "expected", "scheme"),
    [
        (("127.0.0.1", 5000), [], ("127.0.0.1", 5000), "http"),
        (("127.0.0.1", 5000), [(b"x-forwarded-for", b"203.0.113.7")], ("203.0.113.7", 0), "http"),
        (("127.0.0.1", 5000), [(b"x-forwarded-for", b"198.51.100.1, 203.0.113.7, 127.0.0.1"),
                               (b"x-forwarded-proto", b"https")], ("203.0.113.7", 0), "https"),
        (("10.0.0.9", 5000), [(b"x-forwarded-for", b"203.0.113.7")], ("10.0.0.9", 5000), "http"),  # untrusted
        (("127.0.0.1", 5000), [(b"x-forwarded-proto", b"javascript")], ("127.0.0.1", 5000), "http"),
    ],
)  # fmt: skip
def test_forwarded_headers_from_a_local_proxy(
    client: tuple[str, int], headers: list[tuple[bytes, bytes]], expected: tuple[str, int], scheme: str
) -> None:
    scope = _scope(client, *headers)
    assert scope["client"] == expected
    assert scope["scheme"] == scheme
    assert scope["path"] == "/v1/models" and scope["query_string"] == b"x=1"
