"""``TokenizingAnalyzer``: the ``PromptAnalyzer`` that renders, tokenizes and hashes like the engine.

Chat bodies are rendered with the model's template (full conversation, tools, ``chat_template_kwargs``) and
tokenized through the prefix cache (``incremental``); ``/v1/completions`` text is encoded with the
tokenizer's post-processor and token-id prompts are used as-is (a batch is represented by its first prompt:
``request_prompt``). The hash root is ``root_hash(model, extra_keys)`` with the body's ``lora`` and
``cache_salt`` and the tenant (``kvgate_core.kvcontract.extra_keys``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.analyze.analyzer import PromptAnalysis
from gateway.analyze.incremental import IncrementalEncoder
from gateway.analyze.prefix_cache import PrefixTokenCache
from kvgate_core.kvcontract.extra_keys import request_extra_keys
from kvgate_core.kvcontract.hashing import DEFAULT_BLOCK_SIZE, chain_hashes, root_hash
from kvgate_core.tokenize.bundle import TokenizerBundle
from kvgate_core.tokenize.pieces import DEFAULT_MAX_PIECES
from kvgate_core.tokenize.request_prompt import ChatPrompt, Endpoint, TextPrompt, parse_prompt


class TokenizingAnalyzer:
    """Turns request bodies into token counts and block hashes with a ``TokenizerBundle``.

    Thread safe: ``analyze`` may run on the event loop or in worker threads.

    Args:
        bundle: the model's tokenizer and chat template.
        block_size: tokens per hashed block (the workers' block size).
        cache: prefix-token cache for chat prompts; a default-sized one when None, ``PrefixTokenCache(0)``
            to disable.
        hash_model: model id for the hash root instead of the request's ``model`` (set it when clients use
            an alias of the id the workers hash under).
        max_pieces: the chat-text piece cache's size (``kvgate_core.tokenize.pieces``); 0 disables it.
    """

    __slots__ = ("_block_size", "_bundle", "_encoder", "_hash_model")

    def __init__(
        self,
        bundle: TokenizerBundle,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        cache: PrefixTokenCache | None = None,
        hash_model: str | None = None,
        max_pieces: int = DEFAULT_MAX_PIECES,
    ) -> None:
        self._bundle = bundle
        self._block_size = block_size
        self._hash_model = hash_model
        self._encoder = IncrementalEncoder(
            bundle.tokenizer,
            cache if cache is not None else PrefixTokenCache(),
            block_size,
            max_pieces=max_pieces,
        )

    @property
    def bundle(self) -> TokenizerBundle:
        return self._bundle

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def cache(self) -> PrefixTokenCache:
        return self._encoder.cache

    def analyze(
        self, body: Mapping[str, Any], endpoint: Endpoint, model: str, *, tenant: str | None = None
    ) -> PromptAnalysis:
        """Token count and full-block hashes of the body's prompt.

        Raises:
            ValueError: the body has no usable prompt or the template rejects it (client-facing message).
        """
        prompt = parse_prompt(body, endpoint)
        root = root_hash(self._hash_model or model, request_extra_keys(body, tenant))
        if isinstance(prompt, ChatPrompt):
            ids, hashes = self._encoder.encode(self._bundle.render(prompt), root)
            return PromptAnalysis(len(ids), hashes)
        if isinstance(prompt, TextPrompt):
            tokens: Any = self._bundle.tokenizer.encode(prompt.text, add_special_tokens=True)
        else:
            tokens = prompt.token_ids
        return PromptAnalysis(len(tokens), tuple(chain_hashes(tokens, root, self._block_size)))

    def tokenize(self, body: Mapping[str, Any], endpoint: Endpoint) -> list[int]:
        """The prompt's token ids, computed from scratch (what a worker's ``POST /tokenize`` returns).

        Raises:
            ValueError: as ``analyze``.
        """
        return self._bundle.encode(parse_prompt(body, endpoint))
