"""Approximate KV index (for backends that publish no KV events): affinity learnt from routing alone."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.integration.gateway_fleet import gateway_fleet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_approximate_mode_sends_a_repeated_prefix_back_to_the_same_worker(tmp_path: Path) -> None:
    with gateway_fleet(tmp_path, num_workers=3, gateway_args=["--kv-index", "approximate"]) as fleet:
        client = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="x", max_retries=0)
        chosen = []
        # long documents: the hit (~2k tokens) outweighs what a young fleet's balance term and a stale
        # queue depth from the 1 s load probes can charge the warm worker under a loaded CI machine
        for doc in ("alpha " * 400, "beta " * 400):
            for question in ("first?", "second?", "third?"):
                raw = client.chat.completions.with_raw_response.create(
                    model="kvgate-sim", max_tokens=2,
                    messages=[{"role": "system", "content": doc}, {"role": "user", "content": question}],
                )  # fmt: skip
                chosen.append(
                    (doc[:5], raw.headers["x-kvgate-worker"], int(raw.headers["x-kvgate-prefix-hit"]))
                )
        for doc in ("alpha", "beta "):
            rows = [c for c in chosen if c[0] == doc]
            assert len({w for _, w, _ in rows}) == 1, rows  # one worker per shared document
            assert rows[0][2] == 0
            assert all(hit > 0 for _, _, hit in rows[1:])
