"""Per-worker figures over a recent window, for the admin page (``GET /admin/ui/state``): requests/s, time
to first token (p50), failures, and the prefix hit the gateway predicted against the cached tokens the
worker reported.
Compiled with mypyc (``docs/development.md``: what that rules out).

The proxy calls ``WorkerStats.record`` once per finished attempt: one tuple appended to the worker's
bounded deque (O(1); event-loop confined, so no lock). The figures are computed only when asked
(``summaries``): O(workers × ``max_samples``), a filter and a sort of at most ``max_samples`` numbers per
worker. Prometheus keeps the long-term, per-route view (``observability.metrics``); this is the live one.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

from gateway.observability.worker_window import WorkerWindow

__all__ = ["WorkerStats", "WorkerWindow"]

# (monotonic time, ok, seconds to first token or None, prompt tokens, predicted cached, reported cached)
_Sample = tuple[float, bool, float | None, int, int, int | None]


_EMPTY = WorkerWindow()


class WorkerStats:
    """Recent attempts per worker, at most ``max_samples`` each, read over the last ``window_s`` seconds."""

    __slots__ = ("_clock", "_max_samples", "_samples", "_started", "window_s")

    def __init__(
        self, *, window_s: float = 30.0, max_samples: int = 128, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if window_s <= 0 or max_samples <= 0:
            raise ValueError("window_s and max_samples must be positive")
        self.window_s = window_s
        self._max_samples = max_samples
        self._clock = clock
        self._started = clock()
        self._samples: dict[str, deque[_Sample]] = {}

    def record(
        self,
        worker: str,
        ok: bool,
        ttft_s: float | None,
        prompt_tokens: int = 0,
        predicted_tokens: int = 0,
        reported_tokens: int | None = None,
    ) -> None:
        """One finished attempt on ``worker``. ``prompt_tokens`` 0: no hit figures for it (no prediction
        was made); ``reported_tokens`` None: the worker reported no cached tokens."""
        samples = self._samples.get(worker)
        if samples is None:
            samples = self._samples[worker] = deque(maxlen=self._max_samples)
        samples.append((self._clock(), ok, ttft_s, prompt_tokens, predicted_tokens, reported_tokens))

    def summaries(self, workers: Iterable[str]) -> dict[str, WorkerWindow]:
        """The figures of ``workers``; every other worker's samples are forgotten (it left the fleet)."""
        now = self._clock()
        wanted = set(workers)
        for gone in [w for w in self._samples if w not in wanted]:
            del self._samples[gone]
        span = min(self.window_s, max(now - self._started, 1e-3))
        return {w: self._summary(self._samples.get(w), now, span) for w in wanted}

    def _summary(self, samples: deque[_Sample] | None, now: float, span: float) -> WorkerWindow:
        since = now - self.window_s
        if not samples or samples[-1][0] < since:
            return _EMPTY
        if len(samples) == samples.maxlen and samples[0][0] >= since:
            span = max(now - samples[0][0], 1e-3)  # more came than are kept: the samples' own span
        requests = errors = checked = prompt = predicted = reported = checked_predicted = realised = 0
        ttfts: list[float] = []
        for at, ok, ttft, prompt_tokens, pred, rep in samples:  # one pass: this runs on the event loop
            if at < since:
                continue
            requests += 1
            if not ok:
                errors += 1
                continue
            if ttft is not None:
                ttfts.append(ttft)
            if rep is None or prompt_tokens <= 0:
                continue
            prompt += prompt_tokens
            predicted += pred
            reported += min(rep, prompt_tokens)
            if pred > 0:
                checked += 1
                checked_predicted += pred
                realised += min(pred, rep)
        ttfts.sort()
        return WorkerWindow(
            requests=requests,
            requests_per_s=requests / span,
            errors=errors,
            ttft_p50_s=ttfts[len(ttfts) // 2] if ttfts else None,
            predicted_hit=predicted / prompt if prompt else None,
            reported_hit=reported / prompt if prompt else None,
            realised=realised / checked_predicted if checked_predicted else None,
            checked=checked,
        )
