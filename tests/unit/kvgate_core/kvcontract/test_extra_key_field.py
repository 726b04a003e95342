"""SGLang's ``extra_key`` request field folds into the hash root (labelled, after the salt, before the tenant)."""

from __future__ import annotations

import pytest

from kvgate_core.kvcontract.extra_keys import extra_keys, request_extra_keys


def test_extra_key_is_labelled_and_ordered() -> None:
    assert extra_keys(tenant="t", extra_key="k", cache_salt="s", lora="l") == (
        "lora:l", "salt:s", "extra:k", "tenant:t",
    )  # fmt: skip
    assert extra_keys(extra_key="x") != extra_keys(cache_salt="x")
    assert extra_keys(extra_key="") == ()


def test_request_extra_key_from_the_body() -> None:
    assert request_extra_keys({"extra_key": "k", "cache_salt": "s"}) == ("salt:s", "extra:k")
    with pytest.raises(ValueError, match="extra_key"):
        request_extra_keys({"extra_key": 3})
