"""Prefill/decode disaggregation: the gateway's half of the PD protocol.

The protocol (when the policy's ``Decision`` names a ``prefill_worker``; otherwise the decode worker
serves the request alone, exactly as without PD):

1. **Prefill.** The gateway POSTs the client's body to the prefill worker's same endpoint, with
   ``max_tokens: 1`` and ``stream: false`` (``stream_options``, ``max_completion_tokens``, ``n`` and
   ``logprobs``-style fields dropped) and the header ``x-kvgate-pd: prefill``. The worker computes the
   prompt's KV, pushes the prompt's full blocks to the shared tier and answers only once that push is
   durable (acknowledged by the tier), so the decode worker will find them. The answer's body is
   discarded; only its status matters. (kvgate's workers need no header for this: the real engine holds
   the last chunk of any one-token request until its pushes are durable, the sim holds every request's;
   the header tells other engines and logs which half of a PD pair a request is.)
2. **Decode.** The gateway then forwards the client's original bytes to the decode worker with the header
   ``x-kvgate-pd: decode``. On a local prefix miss the worker pulls the blocks the tier holds, loads them
   into its cache and computes only the rest, then streams (or returns) the answer, which the gateway
   relays to the client unchanged.
3. **Failure.** A prefill that fails (connection error, timeout, non-200) never fails the request: the
   gateway logs it, counts a failure on the prefill worker's breaker and sends the request to the decode
   worker anyway, without the prefill header (decode-only). The decode attempt is retried like any
   request.
4. **Usage.** The client sees the decode worker's usage: ``prompt_tokens`` is the whole prompt,
   ``prompt_tokens_details.cached_tokens`` the prompt tokens the decode worker did not compute (its own
   cache hits plus blocks pulled from the tier) and ``completion_tokens`` the decode worker's output. The
   prefill worker's one token is never counted.
5. **Headers.** The response carries ``x-kvgate-worker`` = the decode worker and
   ``x-kvgate-prefill-worker`` = the prefill worker (absent when no prefill ran or it failed).
6. **Load.** The prefill worker's in-flight accounting holds the prompt's tokens for the prefill call's
   duration; the decode worker's is held by the proxy as for any request.

This module owns step 1 and 3 (``PrefillRunner``); the proxy calls it between routing and forwarding. The
prefill call runs on the proxy's own pooled HTTP/1.1 client (``kvgate_core.h1``), so no request crosses two
client stacks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gateway.fleet.registry import WorkerRecord
from gateway.routing.hold import Hold
from gateway.state.protocols import LoadBoard
from kvgate_core.h1 import H1Pool, PoolSaturatedError, Target

logger = logging.getLogger(__name__)

PD_HEADER: Final = "x-kvgate-pd"
# the header line after the content-type that ``Target.post_request`` always writes
_PREFILL_HEADER: Final = f"{PD_HEADER}: prefill\r\n".encode()
_SATURATED: Final = "saturated"
_DROPPED: Final = ("stream_options", "max_completion_tokens", "n", "logprobs", "top_logprobs", "best_of")


def prefill_body(body: Mapping[str, Any]) -> bytes:
    """The prefill request's body: the client's, asking for one token, not streamed."""
    out = {k: v for k, v in body.items() if k not in _DROPPED}
    out["max_tokens"] = 1
    out["stream"] = False
    return orjson.dumps(out)


@dataclass(frozen=True, slots=True)
class PrefillOutcome:
    """How a prefill call ended.

    Attributes:
        ok: the prefill worker answered 200 (its blocks are in the tier).
        worker: the prefill worker's id.
        seconds: how long the call took.
        reason: why it failed ("" when ok).
    """

    ok: bool
    worker: str
    seconds: float
    reason: str = ""


class PrefillRunner:
    """Runs the prefill step of a PD request.

    Args:
        pool: the proxy's pooled upstream client (a connection is reused only after a complete answer).
        load: in-flight accounting (the prefill worker holds the prompt's tokens during the call).
        timeout_s: deadline of the whole prefill call (a prefill slower than this falls back).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        *,
        pool: H1Pool,
        load: LoadBoard,
        timeout_s: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("the prefill timeout must be > 0")
        self._pool = pool
        self._targets: dict[str, Target] = {}
        self._load = load
        self._timeout_s = timeout_s
        self._clock = clock

    async def run(self, record: WorkerRecord, path: str, body: bytes, prompt_tokens: int) -> PrefillOutcome:
        """POST the prefill request to ``record``; never raises for an upstream failure."""
        tokens = max(1, prompt_tokens)
        hold = Hold.take(self._load, record, tokens)
        start = self._clock()
        try:
            reason = await self._call(record.url, path, body)
            hold.end(answered=not reason)
        finally:
            hold.end(answered=False)
        seconds = self._clock() - start
        if reason:
            if reason != _SATURATED:  # a busy worker is not a broken one: its breaker stays as it is
                record.breaker.record_failure()
            logger.warning("PD prefill failed; decoding alone", extra={"worker": record.id, "reason": reason})
            return PrefillOutcome(False, record.id, seconds, reason)
        record.breaker.record_success()
        return PrefillOutcome(True, record.id, seconds)

    async def _call(self, url: str, path: str, body: bytes) -> str:
        """The failure's reason, or an empty string on success."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = Target.parse(url)
        request = target.post_request(path.encode(), body, _PREFILL_HEADER)
        try:
            async with asyncio.timeout(self._timeout_s):
                status, _ = await self._pool.fetch(target, request)  # closes the connection unless read whole
        except TimeoutError:
            return "timeout"
        except PoolSaturatedError:  # its connection cap and wait queue are full (or the wait ran out)
            return _SATURATED
        except OSError as exc:  # UpstreamConnectionError: connect failed, or the connection broke
            return f"connect: {exc!r}"
        return "" if status == 200 else f"status {status}"
