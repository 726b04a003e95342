"""Random but seeded fleets and requests for policy tests, and the example plugin's entry point."""

from __future__ import annotations

import importlib.metadata as md
import random
from pathlib import Path

from policies import Role, RouteRequest, WorkerId, WorkerView

EXAMPLE_PLUGIN_DIR = Path(__file__).resolve().parents[3] / "examples" / "kvgate-example-policy"
EXAMPLE_ENTRY_POINT = md.EntryPoint(
    name="lowest_id", value="kvgate_example_policy.lowest_id:make", group="kvgate.policies"
)


def worker(wid: str, **kw: object) -> WorkerView:
    """A worker view with defaults for everything not given."""
    return WorkerView(id=WorkerId(wid), **kw)  # type: ignore[arg-type]


def random_request(rng: random.Random, block_size: int = 16) -> RouteRequest:
    blocks = rng.randint(0, 64)
    return RouteRequest(
        model="m",
        num_prompt_tokens=blocks * block_size + rng.randint(0, block_size - 1),
        block_hashes=tuple(rng.getrandbits(64) for _ in range(blocks)),
        session_id=rng.choice([None, "s1", "s2", f"s{rng.randint(3, 50)}"]),
        headers={"x-session-id": "s1"},
        max_tokens=rng.choice([None, 16, 256]),
    )


def random_fleet(rng: random.Random, req: RouteRequest, size: int | None = None) -> list[WorkerView]:
    n = rng.randint(0, 12) if size is None else size
    blocks = len(req.block_hashes)
    fleet = []
    for i in range(n):
        gpu = rng.randint(0, blocks)
        fleet.append(
            worker(
                f"w{i:02d}",
                role=rng.choice([Role.BOTH, Role.BOTH, Role.PREFILL, Role.DECODE]),
                healthy=rng.random() > 0.2,
                inflight_requests=rng.randint(0, 20),
                inflight_tokens=rng.choice([0, rng.randint(0, 50_000)]),
                queue_depth=rng.randint(0, 40),
                kv_usage=rng.random(),
                gpu_hit_blocks=gpu,
                tier_hit_blocks=rng.randint(0, blocks - gpu),
            )
        )
    return fleet
