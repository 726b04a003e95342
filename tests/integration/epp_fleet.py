"""Real processes for picker tests: sim workers and a ``kvgate epp`` naming them, plus a grpc.aio client
that drives the ext_proc stream the way Envoy does."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb, external_processor_pb2_grpc as pb_grpc

from tests.support.procs import free_port, kvgate_cmd, start_process, stop_process
from tests.support.waiting import wait_ready


@dataclass
class EppFleet:
    workers: list[str]  # host:port, as the picker names them
    grpc_port: int
    health_port: int
    metrics_port: int
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def start_workers(
    logs: Path, num_workers: int, worker_args: Sequence[str] = ()
) -> dict[str, subprocess.Popen[bytes]]:
    """``num_workers`` sim workers on loopback, ready; keyed by ``127.0.0.1:PORT``."""
    workers: dict[str, subprocess.Popen[bytes]] = {}
    for i in range(num_workers):
        port = free_port()
        proc = start_process(
            kvgate_cmd("worker", "--sim", "--port", str(port), *worker_args), log=logs / f"worker{i}.log"
        )
        workers[f"127.0.0.1:{port}"] = proc
    for i, (addr, proc) in enumerate(workers.items()):
        wait_ready(proc, f"http://{addr}/health", logs=logs / f"worker{i}.log")
    return workers


@contextmanager
def epp_fleet(
    logs: Path,
    *,
    num_workers: int = 2,
    epp_args: Sequence[str] = (),
    workers: Sequence[str] | None = None,
    tls: bool = False,
) -> Iterator[EppFleet]:
    """Sim workers (unless ``workers`` are given) and a ``kvgate epp`` in front, plaintext unless ``tls``
    (its default: a self-signed certificate made at start); stopped by PID."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        if workers is None:
            procs.update(start_workers(logs, num_workers))
            workers = list(procs)
        grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
        args = [
            "--grpc-port",
            str(grpc_port),
            "--grpc-health-port",
            str(health_port),
            "--metrics-port",
            str(metrics_port),
            "--secure-serving",
            "on" if tls else "off",
            "--health-interval-s",
            "0.5",
            *(f"--worker=http://{w}" for w in workers),
            *epp_args,
        ]
        epp = start_process(kvgate_cmd("epp", *args), log=logs / "epp.log")
        procs["epp"] = epp
        wait_ready(epp, f"http://127.0.0.1:{metrics_port}/ready", logs=logs / "epp.log")
        yield EppFleet(list(workers), grpc_port, health_port, metrics_port, logs, procs)
    finally:
        for proc in reversed(list(procs.values())):
            stop_process(proc)


def headers_message(
    path: str,
    *,
    method: str = "POST",
    end_of_stream: bool = False,
    extra: dict[str, str] | None = None,
    subset: object = None,
) -> pb.ProcessingRequest:
    """A ``request_headers`` message as Envoy sends it."""
    values = {":method": method, ":path": path, ":authority": "gw", "content-type": "application/json"}
    values.update(extra or {})
    hmap = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    )
    message = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hmap, end_of_stream=end_of_stream))
    if subset is not None:
        message.metadata_context.filter_metadata["envoy.lb.subset_hint"].update(
            {"x-gateway-destination-endpoint-subset": subset}
        )
    return message


def body_messages(body: bytes, chunk: int = 16384, *, response: bool = False) -> list[pb.ProcessingRequest]:
    """``body`` as streamed body messages, ``end_of_stream`` on the last."""
    out = []
    for start in range(0, max(len(body), 1), chunk):
        part = pb.HttpBody(body=body[start : start + chunk], end_of_stream=start + chunk >= len(body))
        out.append(
            pb.ProcessingRequest(response_body=part) if response else pb.ProcessingRequest(request_body=part)
        )
    return out


def response_headers_message(
    status: int, content_type: str, served: str | None = None
) -> pb.ProcessingRequest:
    values = {":status": str(status), "content-type": content_type}
    hmap = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    )
    message = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=hmap))
    if served is not None:
        message.metadata_context.filter_metadata["envoy.lb"].update(
            {"x-gateway-destination-endpoint-served": served}
        )
    return message


async def exchange(
    target: str, messages: Sequence[pb.ProcessingRequest], timeout_s: float = 20.0
) -> list[pb.ProcessingResponse]:
    """Send ``messages`` on one stream, half-close, and collect every answer."""

    async def requests() -> AsyncIterator[pb.ProcessingRequest]:
        for m in messages:
            yield m

    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        return [r async for r in stub.Process(requests(), timeout=timeout_s)]


def destination(answer: pb.ProcessingResponse) -> tuple[str, str]:
    """The header and the ``envoy.lb`` metadata value a headers answer names."""
    header = next(
        h.header.raw_value.decode()
        for h in answer.request_headers.response.header_mutation.set_headers
        if h.header.key == "x-gateway-destination-endpoint"
    )
    meta = (
        answer.dynamic_metadata.fields["envoy.lb"]
        .struct_value.fields["x-gateway-destination-endpoint"]
        .string_value
    )
    return header, meta
