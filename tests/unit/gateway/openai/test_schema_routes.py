"""Edge checks of the Responses API and the load-balanced routes."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.openai.routes import BALANCED_ROUTES, EMBEDDINGS_ROUTE
from gateway.openai.schema import Framing, parse_balanced, parse_request
from kvgate_core.tokenize.request_prompt import Endpoint


def test_a_responses_body_is_a_prompt_route_with_its_previous_id() -> None:
    raw = orjson.dumps({"model": "m", "input": "hi", "previous_response_id": "resp_1", "max_output_tokens": 9,
                        "stream": True})  # fmt: skip
    parsed = parse_request(raw, Endpoint.RESPONSES, max_tokens_limit=100)
    assert parsed.route.path == b"/v1/responses" and parsed.route.framing is Framing.RESPONSES
    assert parsed.previous_response_id == "resp_1"
    assert parsed.max_tokens == 9 and parsed.stream


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": 5}, "input"),
        ({"model": "m", "input": [3]}, "input[0]"),
        ({"model": "m", "input": "x", "instructions": []}, "instructions"),
        ({"model": "m", "input": "x", "previous_response_id": ""}, "previous_response_id"),
        ({"model": "m", "input": "x", "previous_response_id": "a/../b"}, "previous_response_id"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x"}, "model"),
    ],
)
def test_bad_responses_bodies_name_the_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(orjson.dumps(body), Endpoint.RESPONSES, max_tokens_limit=100)
    assert caught.value.param == param


def test_balanced_routes_read_only_the_model() -> None:
    parsed = parse_balanced(
        b'{"model": "m", "input": ["a"], "whatever": 1}', EMBEDDINGS_ROUTE, require_model=True
    )
    assert parsed.endpoint is None and parsed.model == "m" and not parsed.stream
    tokenize = BALANCED_ROUTES["/tokenize"]
    assert parse_balanced(b'{"prompt": "x"}', tokenize, require_model=False).model == ""
    assert parse_balanced(b"", tokenize, require_model=False).model == ""
    with pytest.raises(InvalidRequest):
        parse_balanced(b'{"prompt": "x"}', EMBEDDINGS_ROUTE, require_model=True)
    with pytest.raises(InvalidRequest):
        parse_balanced(b'{"model": 3}', tokenize, require_model=False)
    with pytest.raises(InvalidRequest):
        parse_balanced(b"[]", tokenize, require_model=False)
