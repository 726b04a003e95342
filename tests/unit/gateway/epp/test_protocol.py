"""The ext_proc answers the picker builds, and the usage it reads from response chunks."""

from __future__ import annotations

import pytest

from gateway.epp import protocol
from gateway.epp.stream import error_response
from gateway.epp.tls import self_signed
from gateway.epp.usage import UsageReader
from gateway.errors import NoHealthyWorker


@pytest.mark.parametrize("size", [0, 1, 61_999, 62_000, 62_001, 200_000])
def test_body_chunks_are_bounded_and_end_once(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    chunks = [c.request_body.response.body_mutation.streamed_response for c in protocol.body_chunks(body)]
    assert b"".join(c.body for c in chunks) == body
    assert all(len(c.body) <= protocol.BODY_CHUNK_BYTES for c in chunks)
    assert [c.end_of_stream for c in chunks] == [False] * (len(chunks) - 1) + [True]


def test_destination_header_and_metadata_agree() -> None:
    answer = protocol.destination_response(["10.0.0.1:80", "10.0.0.2:80"], body_length=12)
    sets = {
        h.header.key: h.header.raw_value.decode()
        for h in answer.request_headers.response.header_mutation.set_headers
    }
    meta = (
        answer.dynamic_metadata.fields["envoy.lb"]
        .struct_value.fields[protocol.DESTINATION_HEADER]
        .string_value
    )
    assert sets[protocol.DESTINATION_HEADER] == meta == "10.0.0.1:80,10.0.0.2:80"
    assert sets["content-length"] == "12"
    assert answer.request_headers.response.clear_route_cache


def test_error_response_keeps_openai_shape_and_status() -> None:
    answer = error_response(NoHealthyWorker("none"))
    assert answer.immediate_response.status.code == 503
    assert b'"code":"no_healthy_worker"' in answer.immediate_response.body


def test_usage_reader_joins_an_event_split_across_chunks() -> None:
    reader = UsageReader(streaming=True)
    for chunk in (
        b'data: {"choices":[]}\n\ndata: {"usage":{"prompt_tokens":5,',
        b'"prompt_tokens_details":{"cached_tokens":4}}}\n\n',
    ):
        reader.feed(chunk)
    usage = reader.end()
    assert usage is not None and usage.cached_tokens == 4 and usage.prompt_tokens == 5


def test_usage_reader_parses_a_whole_json_answer() -> None:
    reader = UsageReader(streaming=False)
    reader.feed(b'{"usage":{"prompt_tokens":7,')
    reader.feed(b'"prompt_tokens_details":{"cached_tokens":0}}}')
    assert reader.end() == (7, 0)
    assert UsageReader(streaming=False, max_bytes=3).end() is None


def test_self_signed_identity_is_pem() -> None:
    identity = self_signed()
    assert identity.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert identity.cert_pem.startswith(b"-----BEGIN CERTIFICATE-----")
