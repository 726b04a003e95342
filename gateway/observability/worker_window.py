"""``WorkerWindow``: one worker's figures over the admin page's window (``observability.worker_stats``).

In a module of its own, left interpreted: the admin page's response model embeds it, and pydantic builds a
JSON schema only from a dataclass whose annotations it can read, which a class compiled by mypyc
(``kvgate_core.native``) does not offer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerWindow:
    """One worker's figures over the window.

    Attributes:
        requests: attempts that finished in the window (failures included).
        requests_per_s: ``requests`` per second of the window (or of the samples kept, when more came).
        errors: attempts that failed (an error status, a broken stream, a client that left).
        ttft_p50_s: median time to the first byte of the answer, successful attempts only; None without one.
        predicted_hit: prompt tokens the gateway predicted cached, over the prompt tokens of the requests
            whose worker reported cached tokens; None without such a request.
        reported_hit: the cached tokens the worker reported, over the same prompt tokens.
        realised: of the predicted tokens, the share the worker confirmed (None without a prediction).
        checked: requests with a positive prediction and a report (the basis of ``realised``).
    """

    requests: int = 0
    requests_per_s: float = 0.0
    errors: int = 0
    ttft_p50_s: float | None = None
    predicted_hit: float | None = None
    reported_hit: float | None = None
    realised: float | None = None
    checked: int = 0
