"""Real vLLM 0.32.0 KV event frames (``tests/fixtures/engines/vllm-0.32.0``: block size 32) through the adapters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.analyze.prompt import TokenizingAnalyzer
from gateway.kvindex.feeds.decode import BlockStored, decode_event_batch
from gateway.kvindex.feeds.discovery import EventSource, discover_event_sources
from gateway.kvindex.feeds.rechunk import EngineEventTranslator, TranslatorConfig
from gateway.kvindex.feeds.zmq_feed import parse_live, parse_replay_reply
from kvgate_core.kvcontract.events import EventType
from kvgate_core.tokenize.bundle import byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "engines" / "vllm-0.32.0"
ZMQ = FIXTURES / "zmq"
SERVED = "SmolLM2-135M-Instruct"

pytestmark = pytest.mark.skipif(not (ZMQ / "000.msgpack").exists(), reason="vLLM 0.32.0 captures absent")


def live_frames() -> list[list[bytes]]:
    """``[topic, seq, payload]`` of each published message, in order."""
    names = sorted(p.stem for p in ZMQ.glob("[0-9][0-9][0-9].msgpack"))
    return [[(ZMQ / f"{n}.{part}").read_bytes() for part in ("topic", "seq", "msgpack")] for n in names]


def replay_replies() -> list[list[bytes]]:
    numbers = sorted({p.name.split("_")[1] for p in ZMQ.glob("replay_*_frame0.bin")})
    return [[(ZMQ / f"replay_{n}_frame{i}.bin").read_bytes() for i in range(4)] for n in numbers]


def test_every_captured_batch_decodes_and_chains_without_a_skip() -> None:
    translator = EngineEventTranslator(TranslatorConfig("vllm-0", SERVED, 16, lora_in_model=True))
    for seq, frames in enumerate(live_frames()):
        parsed = parse_live(frames)
        assert parsed is not None
        assert parsed[0] == seq
        batch = decode_event_batch(parsed[1])
        assert batch.dp_rank == 0
        assert all(isinstance(e, BlockStored) and e.block_size == 32 for e in batch.events)
        events = translator.translate(batch.events, batch.ts)
        assert [e.type for e in events] == [EventType.STORED] * len(batch.events)
    assert translator.num_skipped == 0


def test_the_first_stored_block_equals_the_gateways_hashes_of_the_same_chat() -> None:
    tokens = json.loads((FIXTURES / "tokenize_chat_response.json").read_text())["tokens"]  # 37 tokens
    parsed = parse_live(live_frames()[0])
    assert parsed is not None
    translator = EngineEventTranslator(TranslatorConfig("vllm-0", SERVED, 16, lora_in_model=True))
    (stored,) = translator.translate(decode_event_batch(parsed[1]).events)
    analyzer = TokenizingAnalyzer(byte_bundle(), block_size=16)
    request = {"model": SERVED, "prompt": tokens}
    assert list(stored.hashes) == list(analyzer.analyze(request, Endpoint.COMPLETIONS, SERVED).block_hashes)


def test_the_replay_exchange_carries_a_topic_frame_and_ends_with_seq_minus_one() -> None:
    live = {parsed[0]: parsed[1] for frames in live_frames() if (parsed := parse_live(frames)) is not None}
    replies = [parse_replay_reply(frames) for frames in replay_replies()]
    assert (ZMQ / "replay_request.bin").read_bytes() == (0).to_bytes(8, "big")
    assert replies[-1] == (-1, b"")
    for reply in replies[:-1]:
        assert reply is not None
        assert live[reply[0]] == reply[1]


async def test_kv_event_sources_answer_becomes_one_source_on_the_worker_host() -> None:
    async def get(_base: str, _path: str) -> tuple[int, bytes]:
        return 200, (FIXTURES / "kv_event_sources.json").read_bytes()

    assert await discover_event_sources(get, "http://127.0.0.1:18001") == [
        EventSource("tcp://127.0.0.1:18101", "tcp://127.0.0.1:18102", "", 0)
    ]
