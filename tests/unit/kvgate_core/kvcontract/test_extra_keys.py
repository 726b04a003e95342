from __future__ import annotations

import pytest

from kvgate_core.kvcontract.extra_keys import extra_keys, request_extra_keys


def test_keys_are_labelled_and_ordered() -> None:
    assert extra_keys(tenant="t", cache_salt="s", lora="l") == ("lora:l", "salt:s", "tenant:t")
    assert extra_keys() == ()
    assert extra_keys(lora="", cache_salt=None) == ()


def test_a_salt_never_collides_with_an_adapter() -> None:
    assert extra_keys(lora="x") != extra_keys(cache_salt="x")


def test_request_keys_read_the_body_and_the_tenant() -> None:
    body = {"lora": "sql", "cache_salt": "abc", "model": "m"}
    assert request_extra_keys(body, tenant="acme") == ("lora:sql", "salt:abc", "tenant:acme")
    assert request_extra_keys({}) == ()


@pytest.mark.parametrize("field", ["lora", "cache_salt"])
def test_non_string_fields_are_client_errors(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        request_extra_keys({field: 1})
