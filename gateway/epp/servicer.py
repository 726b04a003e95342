"""The gRPC services of the picker: ``envoy.service.ext_proc.v3.ExternalProcessor`` and health.

``ExtProcServicer.Process`` runs one ``PickerStream`` per stream (one per HTTP request). ``PickerHealth``
answers the names GIE's charts and Envoy probe: ``""``, ``liveness``, ``readiness``,
``inference-extension`` and the ext_proc service name; readiness turns ``NOT_SERVING`` while draining.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Final

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb, external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import _async as health_aio, health_pb2

from gateway.epp.stream import PickerStream

EXT_PROC_SERVICE: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
#: readiness-like names: SERVING once the picker has endpoints to pick, NOT_SERVING while draining
READY_NAMES: Final = ("", "readiness", "inference-extension", EXT_PROC_SERVICE)


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Envoy's external processor, one ``PickerStream`` per request.

    Args:
        new_stream: builds the state of one stream.
    """

    def __init__(self, new_stream: Callable[[], PickerStream]) -> None:
        self._new_stream = new_stream

    async def Process(  # noqa: N802 - the gRPC method's name
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """Answer one request's messages (the stream's end, or its cancellation, ends its accounting)."""
        async for answer in self._new_stream().run(request_iterator):
            yield answer


class PickerHealth:
    """The gRPC health service and the statuses the picker reports on it."""

    def __init__(self) -> None:
        self.servicer = health_aio.HealthServicer()

    async def set_ready(self, ready: bool) -> None:
        """``liveness`` always serves; the readiness names follow ``ready``."""
        serving = health_pb2.HealthCheckResponse.SERVING
        await self.servicer.set("liveness", serving)
        status = serving if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in READY_NAMES:
            await self.servicer.set(name, status)
