"""Build the gateway's ``PromptAnalyzer`` from the ``--tokenizer`` flag.

Specs: ``none`` (no analyzer), ``bytes`` (``ByteTokenizer``), a path (``tokenizer.json``, a Hugging Face
directory, a ``.gguf`` file), or ``auto``: fetch ``GET {worker}/tokenizer`` (a ``TokenizerBundle.to_json``)
from the first worker that answers. Workers often start alongside the gateway, so ``auto`` polls the workers
until ``auto_wait_s`` has passed, logging a warning on each failed round; it then gives up and returns None,
and start-up fails with the caller's message (a wrong tokenizer would silently break every prefix hash, so
there is no fallback to another one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import httpx

from gateway.tokenize.analyzer import PromptAnalyzer
from gateway.tokenize.bundle import TokenizerBundle, byte_bundle, load_bundle
from gateway.tokenize.prompt import TokenizingAnalyzer

logger = logging.getLogger(__name__)

AUTO: Final = "auto"
NONE: Final = "none"
DEFAULT_AUTO_WAIT_S: Final = 30.0
_RETRY_INTERVAL_S: Final = 0.5
_REQUEST_TIMEOUT_S: Final = 10.0


async def build_analyzer(
    spec: str,
    *,
    block_size: int,
    worker_urls: Sequence[str],
    client: httpx.AsyncClient,
    auto_wait_s: float = DEFAULT_AUTO_WAIT_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> PromptAnalyzer | None:
    """The analyzer for ``spec``, or None for ``none`` (or ``auto`` when no worker served a tokenizer).

    Args:
        spec: ``none``, ``bytes``, ``auto`` or a path.
        block_size: tokens per hashed block.
        worker_urls: base URLs of the workers (``auto`` asks them in order); a ``#role=`` suffix is ignored.
        client: the gateway's HTTP client.
        auto_wait_s: how long ``auto`` keeps polling the workers.
        sleep: injected for tests.

    Raises:
        ValueError: a path that cannot be loaded (the message says why).
    """
    if spec == NONE:
        return None
    if spec == AUTO:
        bundle = await fetch_bundle(worker_urls, client, wait_s=auto_wait_s, sleep=sleep)
        if bundle is None:
            return None
    elif spec == "bytes":
        bundle = byte_bundle()
    else:
        bundle = await asyncio.to_thread(load_bundle, spec)
    logger.info("tokenizer %r loaded from %s (block size %d)", bundle.model, spec, block_size)
    return TokenizingAnalyzer(bundle, block_size=block_size)


async def fetch_bundle(
    worker_urls: Sequence[str],
    client: httpx.AsyncClient,
    *,
    wait_s: float = DEFAULT_AUTO_WAIT_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> TokenizerBundle | None:
    """The bundle served by the first worker that answers ``GET /tokenizer``, polling for up to ``wait_s``."""
    if not worker_urls:
        logger.warning("--tokenizer auto: no workers configured to fetch a tokenizer from")
        return None
    rounds = max(1, int(wait_s / _RETRY_INTERVAL_S) + 1)
    for attempt in range(rounds):
        for url in worker_urls:
            bundle = await _fetch_one(url.split("#", 1)[0].rstrip("/"), client)
            if bundle is not None:
                return bundle
        if attempt + 1 < rounds:
            if attempt % 10 == 0:
                logger.warning(
                    "--tokenizer auto: no worker served GET /tokenizer yet; retrying for %.0f s", wait_s
                )
            await sleep(_RETRY_INTERVAL_S)
    logger.warning(
        "--tokenizer auto: no worker of %s served a tokenizer within %.0f s", list(worker_urls), wait_s
    )
    return None


async def _fetch_one(base_url: str, client: httpx.AsyncClient) -> TokenizerBundle | None:
    try:
        resp = await client.get(f"{base_url}/tokenizer", timeout=_REQUEST_TIMEOUT_S)
    except httpx.HTTPError as exc:
        logger.debug("GET %s/tokenizer failed: %r", base_url, exc)
        return None
    if resp.status_code != 200:
        logger.warning("GET %s/tokenizer answered %d", base_url, resp.status_code)
        return None
    try:
        return await asyncio.to_thread(TokenizerBundle.from_json, resp.content)
    except (ValueError, KeyError) as exc:
        logger.warning("GET %s/tokenizer returned an unusable tokenizer: %s", base_url, exc)
        return None
