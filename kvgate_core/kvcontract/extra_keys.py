"""The extra keys folded into a prompt's hash root: LoRA adapter, cache salt, engine extra key and tenant.

Both the gateway (when it hashes a prompt) and a worker (when it names its KV blocks) build them here, so a
router never claims affinity that the engine cannot serve. Each key is labelled (``lora:``, ``salt:``,
``extra:``, ``tenant:``) and they come in that fixed order, so a salt can never collide with an adapter
name. Absent or empty values add no key, so the golden vectors of the other keys never change.

Where they come from in a request:

* LoRA: the body's ``lora`` string. An adapter selected through the ``model`` field (vLLM's way) needs no
  key: the model name is already the root's first component.
* cache salt: the body's ``cache_salt`` string (vLLM's and SGLang's field).
* extra key: the body's ``extra_key`` string (SGLang's field; SGLang keeps requests with different extra
  keys apart in its radix cache, so the gateway must not claim a hit across them).
* tenant: the ``x-kvgate-tenant`` header, which the gateway forwards to the worker: as the client sent it
  when the gateway has no client keys, else rewritten to the tenant the key may use
  (``gateway.security.tenants``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

TENANT_HEADER: Final = "x-kvgate-tenant"
LORA_FIELD: Final = "lora"
CACHE_SALT_FIELD: Final = "cache_salt"
EXTRA_KEY_FIELD: Final = "extra_key"


def extra_keys(
    *,
    lora: str | None = None,
    cache_salt: str | None = None,
    extra_key: str | None = None,
    tenant: str | None = None,
) -> tuple[str, ...]:
    """The labelled extra keys for ``root_hash(model, extra_keys)``; empty values are left out."""
    keys: list[str] = []
    if lora:
        keys.append(f"lora:{lora}")
    if cache_salt:
        keys.append(f"salt:{cache_salt}")
    if extra_key:
        keys.append(f"extra:{extra_key}")
    if tenant:
        keys.append(f"tenant:{tenant}")
    return tuple(keys)


def request_extra_keys(body: Mapping[str, Any], tenant: str | None = None) -> tuple[str, ...]:
    """Extra keys of an OpenAI request body (``lora``, ``cache_salt``, ``extra_key``) plus the tenant.

    Raises:
        ValueError: ``lora``, ``cache_salt`` or ``extra_key`` is present but not a string.
    """
    return extra_keys(
        lora=_optional_str(body, LORA_FIELD),
        cache_salt=_optional_str(body, CACHE_SALT_FIELD),
        extra_key=_optional_str(body, EXTRA_KEY_FIELD),
        tenant=tenant,
    )


def _optional_str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"'{name}' must be a string")
    return value
