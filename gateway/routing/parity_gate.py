"""The tokenizer parity gate: precise KV routing only when the gateway tokenizes exactly like the workers.

At start-up (and on demand, ``POST /admin/parity``) probe prompts are tokenized locally and through each
worker's ``POST /tokenize``. A real mismatch (both sides answered, ids differ) means the gateway's block
hashes would never match the workers' events: precise mode is refused loudly and the gateway routes on the
approximate index instead. A worker that cannot answer (down, or a backend without ``/tokenize``) is
reported but does not count as a mismatch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from gateway.analyze.analyzer import PromptAnalyzer
from gateway.analyze.parity import ParityReport, check_parity
from gateway.analyze.prompt import TokenizingAnalyzer

logger = logging.getLogger(__name__)


async def parity_reports(
    analyzer: PromptAnalyzer | None, worker_urls: Sequence[str], client: httpx.AsyncClient
) -> list[ParityReport]:
    """One report per worker; empty when the analyzer is not a tokenizing one (nothing to compare)."""
    if not isinstance(analyzer, TokenizingAnalyzer) or not worker_urls:
        return []
    return list(await asyncio.gather(*(check_parity(analyzer, url, client) for url in worker_urls)))


def refuse_precise(reports: Sequence[ParityReport]) -> bool:
    """True (and logged at ERROR) when any worker tokenizes differently from the gateway."""
    bad = [r for r in reports if r.mismatches]
    for report in bad:
        logger.error("%s: precise KV routing is refused; routing on the approximate index", report.summary())
    return bool(bad)


def reports_json(reports: Sequence[ParityReport]) -> list[dict[str, Any]]:
    return [
        {
            "worker": r.worker_url,
            "ok": r.ok,
            "mismatches": [{"probe": p.probe, "first_difference": p.first_difference} for p in r.mismatches],
            "errors": [{"probe": p.probe, "error": p.error} for p in r.errors],
        }
        for r in reports
    ]
