"""schemathesis fuzzes the gateway's generated OpenAPI document (its ``/openapi.json``): no input may cause a 5xx."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from loadtest.fleet import Fleet, FleetSpec, launch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MAX_TOKENS = {"type": "integer", "minimum": 1, "maximum": 64}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    spec = FleetSpec(
        workers=2,
        policy="prefix_cache_aware",
        worker_args=("--decode-tps", "2000"),
        log_dir=tmp_path_factory.mktemp("fuzz"),
    )
    with launch(spec) as f:
        yield f


def bounded(document: dict[str, Any], model: str) -> dict[str, Any]:
    """The served document with generation bounds, so cases reach the workers and finish in time.

    The document allows any model, any ``max_tokens`` up to the gateway's limit and prompts of any size;
    fuzzing those would spend the budget on 404s and on long decodes. Only completion request properties
    are narrowed (the model the fleet serves, at most 64 new tokens, ``n`` 1, bounded sizes); every other
    schema is fuzzed as served.
    """
    schemas = document["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = schemas[name]["properties"]
        props["model"] = {"type": "string", "enum": [model]}
        props["max_tokens"] = props["max_completion_tokens"] = MAX_TOKENS
        props["n"] = {"type": "integer", "enum": [1]}  # what the sim worker supports
    schemas["ChatCompletionRequest"]["properties"]["messages"]["maxItems"] = 8
    content = schemas["ChatMessage"]["properties"]["content"]["anyOf"]
    content[0]["maxLength"] = 2000
    content[1]["maxItems"] = 4
    token_ids = {
        "type": "array",
        "minItems": 1,
        "maxItems": 512,
        "items": {"type": "integer", "minimum": 0, "maximum": 255},
    }
    schemas["CompletionRequest"]["properties"]["prompt"] = {
        "oneOf": [{"type": "string", "minLength": 1, "maxLength": 2000}, token_ids]
    }
    return document


def test_fuzzing_the_served_openapi_document_finds_no_server_error(fleet: Fleet, tmp_path: Path) -> None:
    base = fleet.gateway_urls[0]
    served = httpx.get(f"{base}/openapi.json", timeout=10).json()
    model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
    spec = tmp_path / "openapi.json"
    spec.write_bytes(orjson.dumps(bounded(served, model)))
    exe = Path(sys.executable).with_name("schemathesis")
    cmd = [
        str(exe),
        "run",
        str(spec),
        "--url",
        base,
        "--checks",
        "not_a_server_error",
        "--max-examples",
        "25",
        "--mode",
        "all",
        "--seed",
        "1",
        "--request-timeout",
        "20",
        "--generation-deterministic",
        # Draining is correct whatever the id, but once it drains the fleet's workers (schemathesis reuses
        # ids it has seen) every later completion is a correct 503, which this check would report.
        "--exclude-operation-id",
        "drainWorker",
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=220,
        cwd=tmp_path,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout.lower()
