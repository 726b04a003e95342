"""The ext_proc messages an Endpoint Picker sends back to Envoy, built from plain values.

Pure builders over the ``xds-protos`` stubs (``envoy.service.ext_proc.v3``): the header response that names
the destination (header and ``envoy.lb`` dynamic metadata, identical, as GIE's protocol requires), the
request body re-streamed in chunks of at most 62,000 bytes, pass-through answers for the response phase,
and immediate (error) responses. What to answer when lives in ``gateway.epp.stream``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Final

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

#: the header (and ``envoy.lb`` metadata key) that names the endpoint(s) to send the request to
DESTINATION_HEADER: Final = "x-gateway-destination-endpoint"
#: the metadata key the data plane fills with the endpoint that actually served the request
SERVED_KEY: Final = "x-gateway-destination-endpoint-served"
#: the dynamic-metadata namespace Envoy's load balancer reads
LB_NAMESPACE: Final = "envoy.lb"
SUBSET_NAMESPACE: Final = "envoy.lb.subset_hint"
SUBSET_KEY: Final = "x-gateway-destination-endpoint-subset"
#: the largest streamed body chunk sent back (some Envoy builds cap a streamed chunk at 64 KiB)
BODY_CHUNK_BYTES: Final = 62_000

_OVERWRITE = base_pb2.HeaderValueOption.HeaderAppendAction.Value("OVERWRITE_IF_EXISTS_OR_ADD")


def header_value(name: str, value: str) -> base_pb2.HeaderValueOption:
    """A header that replaces any value the client sent under the same name."""
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value.encode("latin-1")), append_action=_OVERWRITE
    )


def destination_response(
    endpoints: Sequence[str], *, body_length: int | None, extra: Mapping[str, str] | None = None
) -> pb.ProcessingResponse:
    """The request-headers answer that picks ``endpoints`` (the first is the pick, the rest fallbacks).

    Sets the destination header (always overwriting a client's), the same value under ``envoy.lb``
    metadata, ``content-length`` when the request has a body, and clears the route cache.
    """
    value = ",".join(endpoints)
    headers = [header_value(DESTINATION_HEADER, value)]
    if body_length is not None:
        headers.append(header_value("content-length", str(body_length)))
    headers.extend(header_value(k, v) for k, v in (extra or {}).items())
    common = pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=headers), clear_route_cache=True)
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION_HEADER: value}})
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=common), dynamic_metadata=metadata
    )


def body_chunks(body: bytes, *, response: bool = False) -> Iterator[pb.ProcessingResponse]:
    """``body`` as streamed body answers of at most ``BODY_CHUNK_BYTES``, ``end_of_stream`` on the last
    (one empty answer for an empty body)."""
    for start in range(0, max(len(body), 1), BODY_CHUNK_BYTES):
        chunk = body[start : start + BODY_CHUNK_BYTES]
        yield streamed_body(chunk, end_of_stream=start + BODY_CHUNK_BYTES >= len(body), response=response)


def streamed_body(chunk: bytes, *, end_of_stream: bool, response: bool) -> pb.ProcessingResponse:
    """One ``FULL_DUPLEX_STREAMED`` body answer carrying ``chunk`` (request or response phase)."""
    mutation = pb.BodyMutation(
        streamed_response=pb.StreamedBodyResponse(body=chunk, end_of_stream=end_of_stream)
    )
    answer = pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))
    if response:
        return pb.ProcessingResponse(response_body=answer)
    return pb.ProcessingResponse(request_body=answer)


def continue_headers(*, response: bool, extra: Mapping[str, str] | None = None) -> pb.ProcessingResponse:
    """Let headers through unchanged (plus ``extra`` headers)."""
    mutation = pb.HeaderMutation(set_headers=[header_value(k, v) for k, v in (extra or {}).items()])
    answer = pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mutation))
    if response:
        return pb.ProcessingResponse(response_headers=answer)
    return pb.ProcessingResponse(request_headers=answer)


def continue_trailers(*, response: bool) -> pb.ProcessingResponse:
    """Let trailers through unchanged."""
    if response:
        return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())


def immediate(status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]]) -> pb.ProcessingResponse:
    """Answer the client directly (an error): Envoy sends ``status`` with ``body`` and ``headers``."""
    mutation = pb.HeaderMutation(
        set_headers=[header_value(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
    )
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status), headers=mutation, body=body
        )
    )


def header_map(headers: base_pb2.HeaderMap) -> dict[str, str]:
    """Envoy's header map as a dict (keys are lower-case; values from ``raw_value``, else ``value``)."""
    out: dict[str, str] = {}
    for h in headers.headers:
        out[h.key.lower()] = h.raw_value.decode("latin-1") if h.raw_value else h.value
    return out


def metadata_value(metadata: base_pb2.Metadata, namespace: str, key: str) -> object:
    """``metadata_context.filter_metadata[namespace][key]`` as a Python value, None when absent."""
    if namespace not in metadata.filter_metadata:
        return None
    fields = metadata.filter_metadata[namespace]
    if key not in fields.fields:
        return None
    value = fields[key]
    if isinstance(value, struct_pb2.ListValue):
        return list(value)
    return value
