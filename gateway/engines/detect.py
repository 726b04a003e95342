"""Which engine answers at a worker URL, and what it says about itself.

Detection asks cheap read-only routes, each at most once, in this order, and stops at the first signature:

1. ``GET /v1/models`` ``owned_by``: vLLM ``vllm``, SGLang ``sglang``, LMDeploy ``lmdeploy``, TensorRT-LLM
   ``tensorrt_llm``, DeepSpeed-MII ``deepspeed-mii``, kvgate ``kvgate`` (TGI writes the model id there).
2. ``GET /info``: TGI's router says ``"router": "text-generation-router"``.
3. ``GET /server_info``: SGLang's carries its server args (``page_size``, ``internal_states``); TensorRT-LLM's
   is ``{"disaggregated_params": …}``.
4. ``GET /load``: kvgate's own worker shape (``running``/``waiting``), or vLLM's ``{"server_load": n}``.

A server that answers ``/v1/models`` but none of the above is a generic OpenAI server (``openai``); one that
answers nothing stays ``auto`` and is asked again later. Then, per engine, the routes that state its version
and cache facts: ``/version`` (vLLM, TensorRT-LLM), vLLM's ``/metrics`` (``vllm:cache_config_info``), SGLang's
``/server_info``, TGI's ``/info``. TensorRT-LLM's JSON ``/metrics`` is never read here: reading drains it,
and the health loop's load scrape must be its only reader (its block size comes from that scrape).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from gateway.engines.affinity import update_affinity
from gateway.engines.figures import EngineLoad
from gateway.engines.probe import Get, OnceGet, json_of
from gateway.engines.profiles import EngineFacts, EngineKind
from gateway.engines.prometheus import parse_prometheus

#: ``/v1/models`` ``owned_by`` as each engine's own ``ModelCard`` writes it
OWNED_BY: Final[Mapping[str, EngineKind]] = {
    "vllm": EngineKind.VLLM,
    "sglang": EngineKind.SGLANG,
    "lmdeploy": EngineKind.LMDEPLOY,
    "tensorrt_llm": EngineKind.TRTLLM,
    "deepspeed-mii": EngineKind.MII,
    "kvgate": EngineKind.KVGATE,
}


class _Server:
    """One server's answers during one detection (each path asked once): JSON by path, and whether
    anything answered at all."""

    def __init__(self, get: Get, base_url: str) -> None:
        self._get = OnceGet(get)
        self._base = base_url
        self.answered = False

    async def raw(self, path: str) -> tuple[int, bytes] | None:
        try:
            answer = await self._get(self._base, path)
        except (OSError, TimeoutError):
            return None
        self.answered = True
        return answer

    async def json(self, path: str) -> dict[str, Any] | None:
        answer = await self.raw(path)
        doc = json_of(*answer) if answer is not None else None
        return doc if isinstance(doc, dict) else None


async def detect_engine(get: Get, base_url: str, *, configured: EngineKind = EngineKind.AUTO) -> EngineFacts:
    """What runs at ``base_url``: its kind (``configured`` when not ``auto``), version, served model and
    cache facts, with ``detected_by`` naming the answer that told. Never raises for a failing server: a
    server that answers nothing comes back as kind ``auto``.
    """
    server = _Server(get, base_url)
    models = await server.json("/v1/models")
    card = _first_card(models)
    facts = EngineFacts(served_model=_str(card, "id"), model_root=_str(card, "root"))
    if configured is not EngineKind.AUTO:
        facts.kind, facts.detected_by = configured, "configured"
    else:
        facts.kind, facts.detected_by = await _identify(server, card, models is not None)
    reader = _FACT_READERS.get(facts.kind)
    if reader is not None:
        await reader(server, facts)
    update_affinity(facts)
    return facts


def _first_card(models: Mapping[str, Any] | None) -> Mapping[str, Any]:
    data = models.get("data") if models else None
    cards = [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []
    return cards[0] if cards else {}


def _str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


async def _identify(server: _Server, card: Mapping[str, Any], listed: bool) -> tuple[EngineKind, str]:
    owned_by = _str(card, "owned_by") or ""
    if owned_by in OWNED_BY:
        return OWNED_BY[owned_by], f"owned_by={owned_by}"
    info = await server.json("/info")
    if info is not None and info.get("router") == "text-generation-router":
        return EngineKind.TGI, "/info router=text-generation-router"
    server_info = await server.json("/server_info")
    if server_info is not None and ("internal_states" in server_info or "page_size" in server_info):
        return EngineKind.SGLANG, "/server_info (SGLang server args)"
    if server_info is not None and "disaggregated_params" in server_info:
        return EngineKind.TRTLLM, "/server_info (disaggregated_params)"
    load = await server.json("/load")
    if load is not None and "server_load" in load:
        return EngineKind.VLLM, "/load server_load"
    if load is not None and ("running" in load or "waiting" in load):
        return EngineKind.KVGATE, "/load (kvgate's worker shape)"
    if listed:
        return EngineKind.OPENAI, f"no engine signature (owned_by={owned_by or '-'})"
    return EngineKind.AUTO, "no answer" if not server.answered else "no /v1/models"


async def _version(server: _Server, facts: EngineFacts) -> None:
    doc = await server.json("/version")
    facts.version = _str(doc, "version") if doc else None


async def _vllm(server: _Server, facts: EngineFacts) -> None:
    await _version(server, facts)
    answer = await server.raw("/metrics")
    if answer is None or answer[0] != 200:
        return
    figures = parse_prometheus(EngineKind.VLLM, answer[1])
    if isinstance(figures, EngineLoad):
        facts.block_size = figures.block_size
        facts.kv_capacity_tokens = figures.capacity_tokens
        facts.prefix_reuse = figures.prefix_caching


async def _sglang(server: _Server, facts: EngineFacts) -> None:
    info = await server.json("/server_info")
    if info is None:
        return
    facts.version = _str(info, "version")
    facts.block_size = _positive(info.get("page_size"))
    capacity = _positive(info.get("max_total_num_tokens"))
    states = info.get("internal_states")
    if capacity is None and isinstance(states, list) and states and isinstance(states[0], dict):
        capacity = _positive(states[0].get("max_total_num_tokens"))
    facts.kv_capacity_tokens = capacity
    if info.get("disable_radix_cache") is True:
        facts.prefix_reuse = False


async def _tgi(server: _Server, facts: EngineFacts) -> None:
    info = await server.json("/info")
    if info is not None:
        facts.version = _str(info, "version")
        facts.served_model = _str(info, "model_id") or facts.served_model


def _positive(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


_FACT_READERS: Final[Mapping[EngineKind, Callable[[_Server, EngineFacts], Awaitable[None]]]] = {
    EngineKind.VLLM: _vllm,
    EngineKind.SGLANG: _sglang,
    EngineKind.TRTLLM: _version,
    EngineKind.TGI: _tgi,
}
