"""``serve_picker``: the picker's lifetime, from the gateway's ``Deps`` to the gRPC servers and back.

Start: the endpoint sources are read once (so the tokenizer can be resolved from real workers), the
gateway's preflight and ``open_deps`` build the request path exactly as ``kvgate gateway`` does, one health
round finds the healthy endpoints, then the ext_proc server (with health), the health-only server and the
metrics server bind. Background loops (health probes, KV feeds through ``Deps``, endpoint sources) run in
one ``TaskGroup``. Stop: readiness goes NOT_SERVING, ``drain_timeout_s`` passes, the servers stop with a
grace period for the streams in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
import httpx
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2_grpc

from gateway.deps import Deps, open_deps, preflight
from gateway.epp.accounting import InFlight
from gateway.epp.discovery import EndpointSource, follow
from gateway.epp.endpoints_file import EndpointsFile
from gateway.epp.inference_pool import InferencePoolSource
from gateway.epp.metrics_http import metrics_server
from gateway.epp.picker import EndpointPicker, Pick
from gateway.epp.servicer import ExtProcServicer, PickerHealth
from gateway.epp.settings import EppSettings
from gateway.epp.stream import PickerStream
from gateway.epp.tls import TlsIdentity, load_identity, self_signed

logger = logging.getLogger(__name__)
_GRACE_S = 5.0


@contextlib.asynccontextmanager
async def open_sources(settings: EppSettings) -> AsyncIterator[list[EndpointSource]]:
    """The configured endpoint sources (the pool's httpx client closes on exit)."""
    sources: list[EndpointSource] = []
    async with contextlib.AsyncExitStack() as stack:
        if settings.endpoints_file is not None:
            sources.append(EndpointsFile(settings.endpoints_file))
        if settings.pool is not None:
            verify: str | bool = settings.pool.ca_path or True
            client = await stack.enter_async_context(httpx.AsyncClient(verify=verify, timeout=10.0))
            sources.append(InferencePoolSource(settings.pool, client))
        yield sources


def _credentials(settings: EppSettings) -> grpc.ServerCredentials | None:
    if not settings.secure_serving:
        return None
    identity: TlsIdentity = load_identity(settings.cert_path) if settings.cert_path else self_signed()
    return grpc.ssl_server_credentials([(identity.key_pem, identity.cert_pem)])


def _transport(settings: EppSettings) -> str:
    if not settings.secure_serving:
        return "plaintext"
    return (
        f"TLS, certificate from {settings.cert_path}"
        if settings.cert_path
        else "TLS, self-signed certificate"
    )


def _bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> None:
    if credentials is None:
        server.add_insecure_port(address)
    else:
        server.add_secure_port(address, credentials)


def build_servers(
    settings: EppSettings, new_stream: Callable[[], PickerStream], health: PickerHealth
) -> list[grpc.aio.Server]:
    """The ext_proc server (health too) and the health-only server, bound but not started."""
    limit = settings.stream.max_body_bytes + (1 << 20)
    options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
    credentials = _credentials(settings)
    host = settings.gateway.host
    main = grpc.aio.server(options=options)
    pb_grpc.add_ExternalProcessorServicer_to_server(ExtProcServicer(new_stream), main)
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, main)
    _bind(main, f"{host}:{settings.grpc_port}", credentials)
    servers = [main]
    if settings.health_port:
        side = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.servicer, side)
        _bind(side, f"{host}:{settings.health_port}", credentials)
        servers.append(side)
    return servers


def stream_factory(deps: Deps, settings: EppSettings) -> Callable[[], PickerStream]:
    """Builds each stream's state over the gateway's router, load board and fleet."""
    picker = EndpointPicker(
        router=deps.router, fleet=deps.fleet, load=deps.state.load, affinity=deps.proxy.affinity,
        config=settings.picker, offload=deps.offload,
    )  # fmt: skip

    def start(pick: Pick) -> InFlight:
        return InFlight(
            pick, router=deps.router, load=deps.state.load, fleet=deps.fleet, metrics=deps.metrics
        )

    return lambda: PickerStream(picker, start, settings.stream)


async def initial_workers(settings: EppSettings, sources: Sequence[EndpointSource]) -> EppSettings:
    """The settings with the sources' endpoints added to the flags' (read once, before start-up)."""
    specs = {s.id: s for s in settings.gateway.workers}
    for source in sources:
        specs.update({s.id: s for s in (await source.read() or ())})
    gateway = dataclasses.replace(settings.gateway, workers=tuple(specs.values()))
    return dataclasses.replace(settings, gateway=gateway)


async def serve_picker(
    settings: EppSettings, stop: asyncio.Event, on_ready: Callable[[], None] = lambda: None
) -> None:
    """Serve until ``stop`` is set.

    Raises:
        ConfigError: the configuration cannot work (policy, tokenizer, state, sources, certificate).
    """
    async with open_sources(settings) as sources:
        fixed = settings.gateway.workers
        settings = await initial_workers(settings, sources)
        gateway, overrides = await preflight(settings.gateway)
        async with open_deps(gateway, overrides) as deps:
            await deps.health.round()
            health = PickerHealth()
            servers = build_servers(settings, stream_factory(deps, settings), health)
            async with asyncio.TaskGroup() as tasks:
                loops = [tasks.create_task(deps.health.run(), name="health-checks")]
                loops += [
                    tasks.create_task(follow(deps, s, settings.resync_s, fixed), name=f"source:{s.name}")
                    for s in sources
                ]
                async with contextlib.AsyncExitStack() as stack:
                    if settings.metrics_port:
                        await stack.enter_async_context(
                            metrics_server(gateway.host, settings.metrics_port, deps.metrics.render)
                        )
                    for server in servers:
                        await server.start()
                    await health.set_ready(True)
                    logger.warning(
                        "kvgate epp serving ext_proc on %s:%d (%s)", gateway.host, settings.grpc_port,
                        _transport(settings),
                    )  # fmt: skip
                    on_ready()
                    await stop.wait()
                    await health.set_ready(False)
                    await asyncio.sleep(settings.drain_timeout_s)
                    await asyncio.gather(*(s.stop(_GRACE_S) for s in servers))
                for loop in loops:
                    loop.cancel()
