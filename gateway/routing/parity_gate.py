"""The tokenizer parity gate: precise KV routing only when the gateway tokenizes exactly like the workers.

At start-up (and on demand, ``POST /admin/parity``) probe prompts are tokenized locally and through each
worker's tokenize route, the one its engine has (``/tokenize``, SGLang's ``/v1/tokenize``, TGI's
``/chat_tokenize``; ``gateway.analyze.parity``). A real mismatch (both sides answered, ids differ) means the
gateway's block hashes would never match the workers' events: precise mode is refused loudly and the gateway
routes on the approximate index instead. A worker that cannot answer (down, or an engine with no probe:
TensorRT-LLM, LMDeploy, MII) is reported but does not count as a mismatch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import httpx

from gateway.analyze.analyzer import PromptAnalyzer
from gateway.analyze.parity import ParityReport, ParityTarget, check_parity
from gateway.analyze.prompt import TokenizingAnalyzer
from gateway.fleet.registry import WorkerRecord

logger = logging.getLogger(__name__)


def parity_targets(records: Iterable[WorkerRecord]) -> list[ParityTarget]:
    """Each worker with the probe route of its engine (detected, else configured; ``auto`` tries
    ``/tokenize``)."""
    return [ParityTarget.of(r.url, r.facts.kind) for r in records]


async def parity_reports(
    analyzer: PromptAnalyzer | None,
    workers: Sequence[str | ParityTarget],
    client: httpx.AsyncClient,
) -> list[ParityReport]:
    """One report per worker; empty when the analyzer is not a tokenizing one (nothing to compare).

    ``workers`` are ``ParityTarget`` (``parity_targets(fleet)``), or bare URLs, probed on ``/tokenize``.
    """
    if not isinstance(analyzer, TokenizingAnalyzer) or not workers:
        return []
    targets = [w if isinstance(w, ParityTarget) else ParityTarget(w) for w in workers]
    checks = (check_parity(analyzer, t.url, client, route=t.route, engine=t.engine) for t in targets)
    return list(await asyncio.gather(*checks))


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
            "errors": [{"probe": p.probe, "error": p.error} for p in r.errors]
            + ([{"probe": "*", "error": r.skipped}] if r.skipped else []),
            "skipped": r.skipped,
            "skipped_probes": [{"probe": p.probe, "reason": p.skipped} for p in r.results if p.skipped],
        }
        for r in reports
    ]
