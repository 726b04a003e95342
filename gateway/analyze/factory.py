"""Build the gateway's ``PromptAnalyzer`` from the ``--tokenizer`` flag.

Specs: ``none`` (no analyzer), ``bytes`` (``ByteTokenizer``), a path (``tokenizer.json``, a Hugging Face
directory, a ``.gguf`` file), or ``auto``: fetch ``GET {worker}/tokenizer`` (a ``TokenizerBundle.to_json``)
from the first worker that answers. Workers often start alongside the gateway, so ``auto`` polls while some
worker is unreachable or answers 5xx, for up to ``auto_wait_s``, logging warnings; when no worker served a
tokenizer it returns None and start-up fails with the caller's message (a wrong tokenizer would silently
break every prefix hash, so there is no fallback to another one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import httpx

from gateway.analyze.analyzer import PromptAnalyzer
from gateway.analyze.prompt import TokenizingAnalyzer
from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle, load_bundle

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
    """The bundle served by the first worker that answers ``GET /tokenizer``, polling for up to ``wait_s``.

    Polling continues only while some worker may still be starting (unreachable, or a 5xx answer); when
    every worker answered without a usable tokenizer (404, a malformed bundle) it gives up at once.
    """
    if not worker_urls:
        logger.warning("--tokenizer auto: no workers configured to fetch a tokenizer from")
        return None
    rounds = max(1, int(wait_s / _RETRY_INTERVAL_S) + 1)
    for attempt in range(rounds):
        may_retry = False
        for url in worker_urls:
            bundle, retryable = await _fetch_one(url.split("#", 1)[0].rstrip("/"), client)
            if bundle is not None:
                return bundle
            may_retry = may_retry or retryable
        if not may_retry or attempt + 1 == rounds:
            break
        if attempt % 10 == 0:
            logger.warning(
                "--tokenizer auto: no worker served GET /tokenizer yet; retrying for %.0f s", wait_s
            )
        await sleep(_RETRY_INTERVAL_S)
    logger.warning("--tokenizer auto: no worker of %s served a tokenizer", list(worker_urls))
    return None


async def _fetch_one(base_url: str, client: httpx.AsyncClient) -> tuple[TokenizerBundle | None, bool]:
    """The worker's bundle (or None) and whether asking again later might succeed."""
    try:
        resp = await client.get(f"{base_url}/tokenizer", timeout=_REQUEST_TIMEOUT_S)
    except httpx.HTTPError as exc:
        logger.debug("GET %s/tokenizer failed: %r", base_url, exc)
        return None, True
    if resp.status_code != 200:
        logger.warning("GET %s/tokenizer answered %d", base_url, resp.status_code)
        return None, resp.status_code >= 500
    try:
        return await asyncio.to_thread(TokenizerBundle.from_json, resp.content), False
    except ValueError as exc:
        logger.warning("GET %s/tokenizer returned an unusable tokenizer: %s", base_url, exc)
        return None, False
