"""API keys, rate limits, the concurrency cap and tenant-aware hashing through a real gateway process."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.gateway_fleet import gateway_fleet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MODEL = "kvgate-sim"
MESSAGES = [{"role": "user", "content": "a reasonably long question about kv caches " * 8}]


def test_api_keys_rate_limits_and_admin_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-alpha\nsk-beta\n")
    args = [
        "--api-keys",
        str(keys),
        "--admin-keys",
        "adm-1",
        "--rate-limit-rpm",
        "3",
        "--policy",
        "round_robin",
    ]
    with gateway_fleet(tmp_path, num_workers=1, gateway_args=args) as fleet:
        anon = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            anon.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        alpha = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="sk-alpha", max_retries=0)
        for _ in range(3):
            assert alpha.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2).choices
        with pytest.raises(openai.RateLimitError) as exc:
            alpha.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        assert int(exc.value.response.headers["retry-after"]) >= 1
        beta = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="sk-beta", max_retries=0)
        assert beta.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2
        ).choices  # own bucket
        assert (
            httpx.get(
                fleet.gateway + "/admin/workers", headers={"authorization": "Bearer sk-alpha"}
            ).status_code
            == 401
        )
        assert (
            httpx.get(fleet.gateway + "/admin/workers", headers={"authorization": "Bearer adm-1"}).status_code
            == 200
        )
        assert httpx.get(fleet.gateway + "/health").status_code == 200
        assert "sk-alpha" not in fleet.log("gateway.log")


def test_tenant_is_hashed_the_same_on_both_sides(tmp_path: Path) -> None:
    with gateway_fleet(tmp_path, num_workers=2) as fleet:
        client = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="x", max_retries=0)
        for tenant in ("acme", "globex"):
            headers = {"x-kvgate-tenant": tenant}
            first = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=2, extra_headers=headers
            )
            second = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=2, extra_headers=headers
            )
            usage = second.parse().usage
            assert usage is not None
            assert usage.prompt_tokens_details is not None
            cached = usage.prompt_tokens_details.cached_tokens
            # the second tenant shares no KV with the first one: its first request is a miss everywhere
            assert first.parse().usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
            assert cached and cached > 0
            assert second.headers["x-kvgate-worker"] == first.headers["x-kvgate-worker"]
            assert int(second.headers["x-kvgate-prefix-hit"]) == cached
        metrics = httpx.get(fleet.gateway + "/metrics").text
        realised = _metric(metrics, "kvgate_prefix_realised_tokens_total")
        assert realised >= 2 * cached  # the closed loop saw both tenants' predictions come true
        assert _metric(metrics, "kvgate_prefix_drift") == 0.0


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")
