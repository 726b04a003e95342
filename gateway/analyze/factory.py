"""Build the gateway's ``PromptAnalyzer`` from the ``--tokenizer`` flag.

Specs: ``none`` (no analyzer), ``bytes`` (``ByteTokenizer``), a path (``tokenizer.json``, a Hugging Face
directory, a ``.gguf`` file), or ``auto``, which tries in order:

1. ``GET {worker}/tokenizer`` (kvgate workers serve a ``TokenizerBundle.to_json``) from the first worker that
   answers. Workers often start alongside the gateway, so this polls while some worker is unreachable or
   answers 5xx, for up to ``auto_wait_s``, logging warnings;
2. a local model directory or tokenizer file that an engine names in ``GET /v1/models`` (vLLM's ``root``, or
   an ``id`` that is a readable path): the engine's own tokenizer, so hashes match its KV events;
3. nothing exact: ``resolve_tokenizer`` says so (``exact=False``) and the caller routes on the byte tokenizer
   with the approximate index (cache-aware, learned from its own routing), with one WARNING line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx
import orjson

from gateway.analyze.analyzer import PromptAnalyzer
from gateway.analyze.prompt import TokenizingAnalyzer
from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle, load_bundle

logger = logging.getLogger(__name__)

AUTO: Final = "auto"
NONE: Final = "none"
DEFAULT_AUTO_WAIT_S: Final = 30.0
_RETRY_INTERVAL_S: Final = 0.5
_REQUEST_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class TokenizerChoice:
    """What ``--tokenizer`` resolved to.

    Attributes:
        bundle: the tokenizer (None: ``none``, or ``auto`` found no exact one).
        source: where it came from, for logs and ``/admin``.
        exact: the workers' own tokenizer (or the operator's choice): prefix hashes can match KV events.
    """

    bundle: TokenizerBundle | None
    source: str
    exact: bool


async def resolve_tokenizer(
    spec: str,
    *,
    worker_urls: Sequence[str],
    client: httpx.AsyncClient,
    auto_wait_s: float = DEFAULT_AUTO_WAIT_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> TokenizerChoice:
    """Resolve ``spec`` (see the module docstring); ``auto`` never fails, it reports ``bundle=None``.

    Raises:
        ValueError: an explicit path that cannot be loaded (the message says why).
    """
    if spec == NONE:
        return TokenizerChoice(None, "--tokenizer none", exact=False)
    if spec == "bytes":
        return TokenizerChoice(byte_bundle(), "--tokenizer bytes", exact=True)
    if spec != AUTO:
        return TokenizerChoice(await asyncio.to_thread(load_bundle, spec), f"--tokenizer {spec}", exact=True)
    bundle = await fetch_bundle(worker_urls, client, wait_s=auto_wait_s, sleep=sleep)
    if bundle is not None:
        return TokenizerChoice(bundle, "GET /tokenizer of a worker", exact=True)
    for url in worker_urls:
        found = await named_model_bundle(url.split("#", 1)[0].rstrip("/"), client)
        if found is not None:
            return TokenizerChoice(
                found[0], f"model directory {found[1]} named by {url}/v1/models", exact=True
            )
    return TokenizerChoice(
        None, "no worker serves GET /tokenizer or names a readable model path", exact=False
    )


async def named_model_bundle(base_url: str, client: httpx.AsyncClient) -> tuple[TokenizerBundle, str] | None:
    """The tokenizer of a model directory (or tokenizer file) that the engine at ``base_url`` names in
    ``GET /v1/models`` (vLLM's ``root``; any ``id`` that is a path), when this machine can read it; the bundle
    is named after the served model id, which is what clients send as ``model``."""
    try:
        resp = await client.get(f"{base_url}/v1/models", timeout=_REQUEST_TIMEOUT_S)
        cards = orjson.loads(resp.content).get("data", []) if resp.status_code == 200 else []
    except (httpx.HTTPError, orjson.JSONDecodeError, AttributeError) as exc:
        logger.debug("GET %s/v1/models failed: %r", base_url, exc)
        return None
    for card in cards if isinstance(cards, list) else []:
        if not isinstance(card, dict):
            continue
        model = card.get("id") if isinstance(card.get("id"), str) else None
        for key in ("root", "id"):
            value = card.get(key)
            if isinstance(value, str) and value.startswith(("/", "~", ".")):
                found = await asyncio.to_thread(_load_named, value, model, base_url)
                if found is not None:
                    return found
    return None


def _load_named(value: str, model: str | None, base_url: str) -> tuple[TokenizerBundle, str] | None:
    path = Path(value).expanduser()
    if not (path.is_file() or (path / "tokenizer.json").is_file()):
        return None
    try:
        return load_bundle(path, model=model), str(path)
    except ValueError as exc:
        logger.warning(
            "the tokenizer of %s (named by %s/v1/models) cannot be loaded: %s", path, base_url, exc
        )
        return None


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
    choice = await resolve_tokenizer(
        spec, worker_urls=worker_urls, client=client, auto_wait_s=auto_wait_s, sleep=sleep
    )
    return analyzer_for(choice, block_size=block_size)


def analyzer_for(choice: TokenizerChoice, *, block_size: int) -> PromptAnalyzer | None:
    """The analyzer over a resolved tokenizer (None when there is none)."""
    if choice.bundle is None:
        return None
    logger.info("tokenizer %r from %s (block size %d)", choice.bundle.model, choice.source, block_size)
    return TokenizingAnalyzer(choice.bundle, block_size=block_size)


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
    logger.info("--tokenizer auto: no worker of %s served GET /tokenizer", list(worker_urls))
    return None


async def _fetch_one(base_url: str, client: httpx.AsyncClient) -> tuple[TokenizerBundle | None, bool]:
    """The worker's bundle (or None) and whether asking again later might succeed."""
    try:
        resp = await client.get(f"{base_url}/tokenizer", timeout=_REQUEST_TIMEOUT_S)
    except httpx.HTTPError as exc:
        logger.debug("GET %s/tokenizer failed: %r", base_url, exc)
        return None, True
    if resp.status_code != 200:
        # 404: not a kvgate worker (an engine's tokenizer is looked for next); only 5xx is worth a warning
        log = logger.warning if resp.status_code >= 500 else logger.info
        log("GET %s/tokenizer answered %d", base_url, resp.status_code)
        return None, resp.status_code >= 500
    try:
        return await asyncio.to_thread(TokenizerBundle.from_json, resp.content), False
    except ValueError as exc:
        logger.warning("GET %s/tokenizer returned an unusable tokenizer: %s", base_url, exc)
        return None, False
