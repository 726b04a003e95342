"""Which workers may take which part of a request, and seeded tie-breaking.
Compiled with mypyc (``docs/development.md``: what that rules out).

The rule, for every built-in policy: a worker is a candidate only when it is healthy and its role can serve
the request. A normal (non-PD) request needs a worker that both prefills and decodes, so only
``Role.BOTH`` workers serve it; a prefill-only or decode-only worker never gets a full request. Under PD,
prefill goes to ``prefill``/``both`` workers and decode to ``decode``/``both`` workers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.api import Role, WorkerView

SERVING_ROLES: frozenset[Role] = frozenset({Role.BOTH})
PREFILL_ROLES: frozenset[Role] = frozenset({Role.PREFILL, Role.BOTH})
DECODE_ROLES: frozenset[Role] = frozenset({Role.DECODE, Role.BOTH})


def candidates(workers: Sequence[WorkerView], roles: frozenset[Role] = SERVING_ROLES) -> list[WorkerView]:
    """The healthy workers whose role is in ``roles``, in input order."""
    return [w for w in workers if w.healthy and w.role in roles]


def choose_tied(rng: random.Random, tied: Sequence[WorkerView]) -> WorkerView:
    """One of equally good workers: the only one, or a seeded draw (so replicas do not all herd)."""
    if len(tied) == 1:
        return tied[0]
    return tied[rng.randrange(len(tied))]
