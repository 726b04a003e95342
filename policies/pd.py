"""``PDPolicy``: prefill/decode disaggregation composed of a prefill policy, a decode policy and a Decider.

The decode policy picks the worker that generates (it must only return ``decode``/``both`` workers); the
``Decider`` says whether prefilling elsewhere is worth it for that worker; the prefill policy then picks
the worker that computes the prompt's KV (only ``prefill``/``both`` workers). The answer is
``Decision(worker=decode, prefill_worker=prefill or None)``: None means the decode worker prefills itself
(it pulls what the shared tier holds and computes the rest), which is also the degraded answer when no
prefill worker is available.

Observer hooks are not forwarded to the sub-policies: each would see the final decision, not its own, so
sub-policies that keep state should be wrapped by a PD policy of their own design.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.api import Decider, Decision, Need, Policy, RouteRequest, WorkerView


class PDPolicy:
    """Prefill/decode disaggregation; implements ``Policy``.

    Attributes:
        disaggregates: always True; tells callers and the conformance suite that ``worker`` may be a
            ``decode`` worker and ``prefill_worker`` a ``prefill`` one.
    """

    disaggregates = True

    def __init__(self, name: str, prefill: Policy, decode: Policy, decider: Decider) -> None:
        self.name = name
        self._prefill = prefill
        self._decode = decode
        self._decider = decider
        self.needs: frozenset[Need] = prefill.needs | decode.needs | getattr(decider, "needs", frozenset())

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        decode = self._decode.select(req, workers)
        if decode.worker is None:
            return Decision(worker=None, reason=f"no decode worker: {decode.reason}")
        decode_view = next(w for w in workers if w.id == decode.worker)
        if not self._decider.disaggregate(req, decode_view):
            return Decision(
                worker=decode.worker, scores=decode.scores, reason="decode worker holds most of the prompt"
            )
        prefill = self._prefill.select(req, workers)
        if prefill.worker is None:
            return Decision(worker=decode.worker, scores=decode.scores, reason="no prefill worker available")
        if prefill.worker == decode.worker:
            return Decision(worker=decode.worker, scores=prefill.scores, reason="decode worker is cheapest")
        return Decision(
            worker=decode.worker,
            prefill_worker=prefill.worker,
            scores=prefill.scores,
            reason=f"prefill: {prefill.reason}; decode: {decode.reason}",
        )
