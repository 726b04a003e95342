"""``GET /load`` advertises the engine's running slots (``max_running``): a gateway sizes its connections by it."""

from __future__ import annotations

from kvgate_core.tokenize.bundle import byte_bundle
from workers.engine.serve import EngineOptions, build_engine_from_options
from workers.engine_api import LoadInfo
from workers.sim.engine import SimConfig, SimEngine
from workers.sim.scheduler import SimTiming


def test_load_info_carries_the_slots_when_known() -> None:
    info = LoadInfo(
        running=1, waiting=0, kv_usage=0.0, num_cached_blocks=0, num_total_blocks=8, max_running=32
    )
    assert info.to_dict()["max_running"] == 32
    assert "max_running" not in LoadInfo(1, 0, 0.0, 0, 8).to_dict()


def test_the_sim_advertises_its_max_running() -> None:
    timing = SimTiming(prefill_tps=1e7, decode_tps=1e5, max_running=512, max_model_len=256)
    engine = SimEngine(SimConfig(worker_id="w", kv_tokens=8192, timing=timing), byte_bundle("kvgate-sim"))
    assert engine.load().to_dict()["max_running"] == 512


def test_the_engine_advertises_its_scheduler_slots() -> None:
    engine = build_engine_from_options(
        EngineOptions(model="tiny", kv_tokens=1024, worker_id="w1", max_running=12)
    )
    assert engine.load().max_running == 12
