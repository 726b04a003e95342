"""The prompt analysis seam between the API layer and routing.

A ``PromptAnalyzer`` turns an OpenAI request body into what routing needs: the prompt's token count and
its block hashes in the kvcontract scheme, hashing exactly what the engine will see (rendered chat template,
tools, token-id prompts; cache salt, LoRA name and tenant folded into the chain's root).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kvgate_core.tokenize.request_prompt import Endpoint


@dataclass(frozen=True, slots=True)
class PromptAnalysis:
    """Token count and full-block hashes of one prompt."""

    num_tokens: int
    block_hashes: tuple[int, ...] = ()


class PromptAnalyzer(Protocol):
    """Tokenizes and hashes prompts.

    ``analyze`` is synchronous and CPU-bound; it raises ``ValueError`` with a client-facing message when
    the body cannot be rendered (bad messages, unknown template variables). ``tenant`` (the
    ``x-kvgate-tenant`` header, see ``kvgate_core.kvcontract.extra_keys``) is folded into the hash root
    together with the body's ``lora`` and ``cache_salt``; forward the header to the worker so it hashes the
    same way.
    """

    def analyze(
        self, body: Mapping[str, Any], endpoint: Endpoint, model: str, *, tenant: str | None = None
    ) -> PromptAnalysis: ...
