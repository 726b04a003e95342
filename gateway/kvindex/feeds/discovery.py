"""Where an engine publishes its KV events, one source per DP rank: vLLM's ``GET /kv_event_sources``,
SGLang's ``GET /server_info`` (``discover_sglang_sources``).

vLLM 0.32 answers ``{dp_rank: KVEventsConfig}`` (``entrypoints/serve/instrumentator/basic.py``,
``v1/engine/core_client.py``), each config as its publisher resolved it (the port already offset by the DP
rank)::

    {"0": {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
           "replay_endpoint": "tcp://*:5558", "buffer_steps": 10000, "hwm": 100000,
           "max_queue_size": 100000, "topic": ""}}

Later vLLM answers a list of ``{"data_parallel_rank", "endpoint", "replay_endpoint", "topic"}`` (bare, or
under ``"sources"``); both are read. A publisher binds wildcard addresses (``*``, ``0.0.0.0``, ``::``) or
loopback ones, which mean the engine's own host: they are replaced by the worker URL's host. A rank with
events disabled or another publisher than ZMQ has no source; ``inproc://`` endpoints are unreachable, and
``ipc://`` ones only from the same host (a loopback worker URL).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final
from urllib.parse import urlsplit

import orjson

from gateway.engines.probe import Get, json_of

SOURCES_PATH: Final = "/kv_event_sources"

_WILDCARDS: Final = frozenset({"*", "0.0.0.0", "::", "[::]", "", "localhost", "::1", "[::1]"})
_TCP: Final = re.compile(r"^tcp://(?P<host>\[[^\]]*\]|[^:/]*|[^/]*?)(?::(?P<port>\d+))$")


@dataclass(frozen=True, slots=True)
class EventSource:
    """One ZMQ publisher of an engine: PUB endpoint, ROUTER replay endpoint (or None), topic, DP rank."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    dp_rank: int = 0


async def discover_event_sources(get: Get, worker_url: str) -> list[EventSource]:
    """The worker's KV event sources, reachable from here, in DP-rank order (empty: it publishes none).

    Args:
        get: the health loop's GET (``gateway.engines.probe.Get``: ``(base_url, path) -> (status, body)``;
            raises ``OSError``/``TimeoutError``, which propagate). A non-200 answer means no sources.
        worker_url: the worker's base URL; its host replaces wildcard and loopback hosts.
    """
    body = json_of(*await get(worker_url, SOURCES_PATH))
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    sources = [source for rank, entry in _entries(body) if (source := _source(rank, entry, host)) is not None]
    return sorted(sources, key=lambda s: s.dp_rank)


async def discover_sglang_sources(get: Get, worker_url: str) -> list[EventSource]:
    """SGLang's KV event publishers, one per DP rank, read from ``GET /server_info``.

    SGLang runs one publisher per independent KV cache (``dp_size`` of them), rank ``r`` on the configured
    port + ``r``, each with its own sequence and, when configured, its own replay ROUTER on the replay port
    + ``r``. Newer releases describe them in a ``kv_events`` object (``dp_size``, ``endpoint_host``,
    ``endpoint_port_base``, ``replay_endpoint_host``, ``replay_endpoint_port_base``, ``topic``,
    ``block_size``: ``describe_kv_events_publisher`` in SGLang's
    ``python/sglang/srt/entrypoints/runtime_context.py``); older ones only echo ``kv_events_config`` (the JSON
    string given to ``--kv-events-config``, or a mapping) beside the flattened ``dp_size``. The
    ``publisher`` defaults to ``"null"``: no events unless it says ``"zmq"``."""
    body = json_of(*await get(worker_url, "/server_info"))
    if not isinstance(body, Mapping):
        return []
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    described = body.get("kv_events")
    if isinstance(described, Mapping):
        return _sglang_described(described, host)
    config = body.get("kv_events_config")
    if isinstance(config, str):
        try:
            config = orjson.loads(config)
        except orjson.JSONDecodeError:
            return []
    if not isinstance(config, Mapping) or config.get("publisher") != "zmq":
        return []
    first = _source(0, config, host)
    if first is None:
        return []
    ranks = _positive(body.get("dp_size"))
    return [_shifted(first, rank) for rank in range(ranks)]


def _sglang_described(kv: Mapping[str, Any], host: str) -> list[EventSource]:
    """The ``kv_events`` descriptor's ranks; nothing unless it names a ZMQ publisher on a port."""
    base = kv.get("endpoint_port_base")
    if kv.get("publisher", "zmq") != "zmq" or not isinstance(base, int) or isinstance(base, bool):
        return []
    where = kv.get("endpoint_host")
    config: dict[str, Any] = {"endpoint": f"tcp://{where if isinstance(where, str) else '*'}:{base}"}
    replay = kv.get("replay_endpoint_port_base")
    if isinstance(replay, int) and not isinstance(replay, bool):
        replay_host = kv.get("replay_endpoint_host")
        config["replay_endpoint"] = f"tcp://{replay_host if isinstance(replay_host, str) else '*'}:{replay}"
    if isinstance(topic := kv.get("topic"), str):
        config["topic"] = topic
    first = _source(0, config, host)
    return [_shifted(first, rank) for rank in range(_positive(kv.get("dp_size")))] if first else []


def _positive(value: object) -> int:
    """A rank count as served (1 where absent or not a positive integer)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _shifted(source: EventSource, rank: int) -> EventSource:
    """Rank ``rank``'s publisher: rank 0's ports + ``rank``."""
    replay = source.replay_endpoint
    return replace(
        source,
        endpoint=_port_plus(source.endpoint, rank),
        replay_endpoint=_port_plus(replay, rank) if replay is not None else None,
        dp_rank=rank,
    )


def _port_plus(endpoint: str, offset: int) -> str:
    match = _TCP.match(endpoint)
    if match is None:  # an ipc:// path has no port to offset
        return endpoint
    return f"tcp://{match['host']}:{int(match['port']) + offset}"


def reachable_endpoint(endpoint: str, host: str) -> str | None:
    """``endpoint`` with a wildcard or loopback host replaced by ``host``; None when unreachable from here."""
    if endpoint.startswith("inproc://"):
        return None
    if endpoint.startswith("ipc://"):
        return endpoint if _is_loopback(host) else None
    match = _TCP.match(endpoint)
    if match is None:
        return None
    bound = match["host"]
    if bound in _WILDCARDS or bound.startswith("127."):
        bound = f"[{host}]" if ":" in host else host
    return f"tcp://{bound}:{match['port']}"


def _entries(body: Any) -> list[tuple[int, Mapping[str, Any]]]:
    if isinstance(body, Mapping) and isinstance(body.get("sources"), list):
        body = body["sources"]
    if isinstance(body, list):
        return [
            (e.get("data_parallel_rank") or 0, e)
            for e in body
            if isinstance(e, Mapping) and isinstance(e.get("data_parallel_rank") or 0, int)
        ]
    if isinstance(body, Mapping):
        return [(int(k), v) for k, v in body.items() if str(k).isdigit() and isinstance(v, Mapping)]
    return []


def _source(rank: int, entry: Mapping[str, Any], host: str) -> EventSource | None:
    if entry.get("enable_kv_cache_events") is False or entry.get("publisher", "zmq") != "zmq":
        return None
    endpoint = entry.get("endpoint")
    if not isinstance(endpoint, str) or (reached := reachable_endpoint(endpoint, host)) is None:
        return None
    replay = entry.get("replay_endpoint")
    topic = entry.get("topic")
    return EventSource(
        endpoint=reached,
        replay_endpoint=reachable_endpoint(replay, host) if isinstance(replay, str) else None,
        topic=topic if isinstance(topic, str) else "",
        dp_rank=rank,
    )


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")
