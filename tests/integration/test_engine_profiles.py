"""kvgate in front of each foreign engine, through the engine's faithful fake (``tests.support.engines``).

One class per engine; each starts the engine's fake and a gateway given nothing but ``--worker URL`` (plus
``--host``/``--port``; ``--tokenizer bytes`` where precise KV routing or a parity probe is asserted: the
fakes tokenize with kvgate's byte tokenizer, which no engine can hand to a gateway, so "bytes" *is* the
engine's tokenizer there). The assertions follow each engine's own source (docs/engines.md): detection and the facts
shown in ``GET /admin/workers`` (``engine`` object), the engine's own load signal (load put on the fake
directly, behind the gateway's back, must show up in the gateway's ``running``/``queue``), the parity probe
on the engine's route, ``include_usage`` injected on streams and its chunk stripped, ``cached_tokens`` as the
engine reports it, mid-stream failures reaching the client as an OpenAI error event and ``[DONE]``, KV events
(SGLang ZMQ, TensorRT-LLM HTTP drain), and the engine's own quirks (MII's model strictness and static health,
TGI's keep-alive comments, LMDeploy's prefix caching off by default). Everything goes through the real
``openai`` client or plain HTTP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import httpx
import openai
import orjson
import pytest

from tests.support.engines.fleet import EngineFleet, engine_fleet
from tests.support.procs import free_port, free_port_run
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HELLO = [{"role": "user", "content": "hello there, how are you doing today my friend? " * 2}]
#: every fake: 2 running slots (more wait), 1 ms of prefill per uncached prompt token, 5 ms per output token
FAKE_FLAGS = ("--max-running", "2", "--prefill-ms-per-token", "1.0", "--decode-ms-per-token", "5")
BYTES = ("--tokenizer", "bytes")


def client(fleet: EngineFleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="unused", max_retries=0, timeout=30)


def body(model: str, *, content: str | None = None, **extra: Any) -> dict[str, Any]:
    messages = HELLO if content is None else [{"role": "user", "content": content}]
    return {"model": model, "messages": messages, "max_tokens": 4, **extra}


def sse_events(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for frame in raw.split(b"\n\n"):
        frame = frame.strip()
        if frame.startswith(b"data:"):
            payload = frame[5:].strip()
            out.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return out


def raw_stream(url: str, payload: dict[str, Any]) -> bytes:
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json={**payload, "stream": True}, timeout=30
    ) as r:
        assert r.status_code == 200, r.read()
        return b"".join(r.iter_bytes())


def prefix_hit(fleet: EngineFleet, payload: dict[str, Any]) -> int:
    rows = httpx.post(fleet.gateway + "/admin/route", json=payload, timeout=10).json()["workers"]
    return int(next(w["prefix_hit_tokens"] for w in rows if w["id"] == fleet.worker()["id"]))


@contextlib.contextmanager
def direct_load(url: str, model: str, n: int = 4, chars: int = 3000) -> Iterator[None]:
    """``n`` long requests sent to the engine itself, not through the gateway (3 s of prefill each)."""
    with ThreadPoolExecutor(n) as pool:
        futures = [
            pool.submit(httpx.post, url + "/v1/chat/completions", timeout=60,
                        json=body(model, content=f"{i} " + "x" * chars, max_tokens=2))
            for i in range(n)
        ]  # fmt: skip
        try:
            yield
        finally:
            for f in futures:
                f.result()


class EngineContract:
    """What every engine class asserts; subclasses set the engine's facts and provide ``fleet``."""

    ENGINE: ClassVar[str]
    MODEL: ClassVar[str]
    BLOCK_SIZE: ClassVar[int]
    CAPACITY: ClassVar[int | None] = None
    AFFINITY: ClassVar[bool] = True  # routing for cache affinity can pay off (no ``no_affinity_reason``)
    LOAD_SIGNAL: ClassVar[bool] = True
    INJECTS_USAGE: ClassVar[bool] = True
    HEALTH_TRUSTED: ClassVar[bool] = True  # its /health says 503 when it is unhealthy (MII's never does)
    PARITY_PATH: ClassVar[str | None] = None
    #: tokenize routes the gateway must never probe on this engine (they do not exist, or tokenize otherwise)
    WRONG_PROBES: ClassVar[tuple[str, ...]] = ("POST /tokenize", "POST /v1/tokenize", "POST /chat_tokenize")

    def test_engine_detected_with_its_facts(self, fleet: EngineFleet) -> None:
        facts = fleet.engine_facts()
        assert facts, "GET /admin/workers has no engine object"
        assert facts["kind"] == self.ENGINE and facts["detected_by"]
        assert facts["block_size"] == self.BLOCK_SIZE
        if self.CAPACITY is not None:
            assert facts["kv_capacity_tokens"] == self.CAPACITY
        assert (facts["no_affinity_reason"] is None) is self.AFFINITY
        assert {"running", "queue", "kv_usage"} <= set(fleet.worker())

    def test_load_signal_is_the_engines(self, fleet: EngineFleet) -> None:
        with direct_load(fleet.fakes[0], self.MODEL):
            if self.LOAD_SIGNAL:  # two running, two waiting: only the engine knows (the gateway sent none)
                wait_until(lambda: (fleet.worker()["running"], fleet.worker()["queue"]) == (2, 2),
                           timeout_s=10, interval_s=0.1)  # fmt: skip
                assert fleet.engine_facts()["load_signal"] == "engine"
            else:
                wait_until(lambda: fleet.fake_state()["stats"]["waiting"] == 2, timeout_s=10)
                row = fleet.worker()
                assert (row["running"], row["queue"]) == (0, 0)
                assert row["engine"]["load_signal"] == "in-flight" and row["engine"]["load_note"]

    def test_stream_usage_injected_then_stripped(self, fleet: EngineFleet) -> None:
        chunks = list(client(fleet).chat.completions.create(**body(self.MODEL), stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert all(c.usage is None and c.choices for c in chunks)
        sent = fleet.fake_state()["last_body"]["/v1/chat/completions"]
        assert bool((sent.get("stream_options") or {}).get("include_usage")) is self.INJECTS_USAGE

    def test_mid_stream_failure_is_an_error_event_then_done(self, fleet: EngineFleet) -> None:
        fleet.fault(fail_after_tokens=2, count=1)
        got = sse_events(raw_stream(fleet.gateway, body(self.MODEL, max_tokens=8)))
        assert got[-1] == "[DONE]"
        errors = [e for e in got[:-1] if "error" in e]
        assert len(errors) == 1 and errors[0]["error"].get("message")

    def test_an_unhealthy_engine_is_taken_out_and_comes_back(self, fleet: EngineFleet) -> None:
        if not self.HEALTH_TRUSTED:
            pytest.skip(f"{self.ENGINE}'s /health never says unhealthy (see its own test class)")
        fleet.fault(unhealthy=True)
        try:
            wait_until(lambda: fleet.worker()["healthy"] is False, timeout_s=10, interval_s=0.1)
        finally:
            fleet.fault(unhealthy=False)
        wait_until(lambda: fleet.worker()["healthy"] is True, timeout_s=10, interval_s=0.1)

    def test_parity_probe_uses_the_engines_route(self, fleet: EngineFleet) -> None:
        result = httpx.post(fleet.gateway + "/admin/parity", timeout=30).json()
        paths = fleet.fake_state()["paths"]
        assert fleet.engine_facts().get("parity_route") == self.PARITY_PATH
        assert not [p for p in self.WRONG_PROBES if p in paths], paths
        if self.PARITY_PATH is not None:
            assert result["checked"] and result["ok"], result
            assert paths.get(f"POST {self.PARITY_PATH}"), paths


class TestSGLang(EngineContract):
    """SGLang: /v1/loads, /v1/tokenize, cached_tokens behind --enable-cache-report, ZMQ events."""

    ENGINE, MODEL, BLOCK_SIZE, CAPACITY = "sglang", "sglang-fake", 16, 65_536
    PARITY_PATH = "/v1/tokenize"
    WRONG_PROBES = ("POST /chat_tokenize",)  # SGLang's /tokenize is an alias of /v1/tokenize

    @pytest.fixture(scope="class")
    def fleet(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
        flags = (*FAKE_FLAGS, "--page-size", "16", "--enable-cache-report", "--events-port", str(free_port()),
                 "--events-replay-port", str(free_port()))  # fmt: skip
        with engine_fleet(
            "sglang", tmp_path_factory.mktemp("sglang"), fake_flags=[flags], gateway_flags=BYTES
        ) as f:
            yield f

    def test_cached_tokens_reported_with_cache_report(self, fleet: EngineFleet) -> None:
        chat = client(fleet).chat.completions
        chat.create(**body(self.MODEL, content="sglang cached " * 20))
        usage = chat.create(**body(self.MODEL, content="sglang cached " * 20)).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert (usage.prompt_tokens_details.cached_tokens or 0) >= 16

    def test_follows_zmq_kv_events(self, fleet: EngineFleet) -> None:
        payload = body(self.MODEL, content="only the engine saw this prompt " * 8)
        assert prefix_hit(fleet, payload) == 0
        httpx.post(fleet.fakes[0] + "/v1/chat/completions", json=payload, timeout=30).raise_for_status()
        wait_until(lambda: prefix_hit(fleet, payload) >= 16, timeout_s=10, interval_s=0.1)
        assert fleet.engine_facts()["events"]


class TestSGLangDataParallel:
    """SGLang with two DP ranks, started with nothing but its URL: ``/server_info``'s ``kv_events`` descriptor
    names one publisher per rank (base port + rank), the gateway follows both, and the blocks of either rank
    are the worker's."""

    @pytest.fixture(scope="class")
    def fleet(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
        flags = (*FAKE_FLAGS, "--page-size", "16", "--dp-size", "2", "--events-port", str(free_port_run(2)))
        tmp = tmp_path_factory.mktemp("sglang-dp")
        with engine_fleet("sglang", tmp, fake_flags=[flags], gateway_flags=BYTES) as f:
            yield f

    def test_both_ranks_events_are_indexed(self, fleet: EngineFleet) -> None:
        payloads = [body("sglang-fake", content=f"rank {r} alone saw this prompt " * 8) for r in range(2)]
        for payload in payloads:  # the fake's DP controller sends them round robin: one to each rank
            httpx.post(fleet.fakes[0] + "/v1/chat/completions", json=payload, timeout=30).raise_for_status()
        for payload in payloads:
            wait_until(lambda p=payload: prefix_hit(fleet, p) >= 16, timeout_s=10, interval_s=0.1)
        assert len(fleet.engine_facts()["events"]["sources"]) == 2


class TestSGLangConfiguredEvents:
    """SGLang's ZMQ events when the worker URL names the engine, its publisher and model
    (``#engine=sglang&events=…&model=…``): event decoding and re-chunking of 32-token pages alone, apart from
    discovering the endpoint (``TestSGLang.test_follows_zmq_kv_events``)."""

    @pytest.fixture(scope="class")
    def fleet(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
        port = free_port()
        flags = (*FAKE_FLAGS, "--page-size", "32", "--events-port", str(port))
        tmp = tmp_path_factory.mktemp("sglang-events")
        suffix = f"#engine=sglang&events=tcp://127.0.0.1:{port}&model=sglang-fake"
        with engine_fleet("sglang", tmp, fake_flags=[flags], gateway_flags=BYTES, url_suffix=suffix) as f:
            yield f

    def test_follows_configured_zmq_events_in_32_token_pages(self, fleet: EngineFleet) -> None:
        payload = body("sglang-fake", content="configured events prompt " * 8)
        assert prefix_hit(fleet, payload) == 0
        httpx.post(fleet.fakes[0] + "/v1/chat/completions", json=payload, timeout=30).raise_for_status()
        wait_until(lambda: prefix_hit(fleet, payload) >= 32, timeout_s=10, interval_s=0.1)

    def test_cache_salt_namespaces_event_blocks(self, fleet: EngineFleet) -> None:
        salted = body("sglang-fake", content="a salted prompt of tenant a " * 8, cache_salt="tenant-a")
        httpx.post(fleet.fakes[0] + "/v1/chat/completions", json=salted, timeout=30).raise_for_status()
        wait_until(lambda: prefix_hit(fleet, salted) >= 32, timeout_s=10, interval_s=0.1)
        assert prefix_hit(fleet, {k: v for k, v in salted.items() if k != "cache_salt"}) == 0


class TestTensorRTLLM(EngineContract):
    """TensorRT-LLM: /prometheus/metrics (else the slow JSON /metrics), no parity probe, cached_tokens
    always, HTTP event drain with partial blocks and two windows, a dropped connection instead of an error
    event."""

    ENGINE, MODEL, BLOCK_SIZE = "trtllm", "Qwen3-8B", 32

    @pytest.fixture(scope="class")
    def fleet(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
        tmp = tmp_path_factory.mktemp("trtllm")
        (tmp / "Qwen3-8B").mkdir()
        # its load at /prometheus/metrics (return_perf_metrics): the JSON /metrics answers only after 2 s
        # without new iteration stats, never under steady load (the unit tests read it that way)
        flags = (*FAKE_FLAGS, "--model", str(tmp / "Qwen3-8B"), "--event-buffer-max-size", "10000",
                 "--extra-window-size", "512", "--return-perf-metrics")  # fmt: skip
        with engine_fleet("trtllm", tmp, fake_flags=[flags], gateway_flags=BYTES) as f:
            yield f

    def test_model_is_the_directory_basename(self, fleet: EngineFleet) -> None:
        assert [m.id for m in client(fleet).models.list()] == ["Qwen3-8B"]

    def test_cached_tokens_always_reported(self, fleet: EngineFleet) -> None:
        chat = client(fleet).chat.completions
        first = chat.create(**body(self.MODEL, content="trt cached " * 30)).usage
        again = chat.create(**body(self.MODEL, content="trt cached " * 30)).usage
        assert first is not None and first.prompt_tokens_details is not None
        assert again is not None and again.prompt_tokens_details is not None
        assert (again.prompt_tokens_details.cached_tokens or 0) >= 32

    def test_follows_the_http_event_drain(self, fleet: EngineFleet) -> None:
        payload = body(self.MODEL, content="only trtllm saw this prompt " * 8)
        assert prefix_hit(fleet, payload) == 0
        reply = httpx.post(fleet.fakes[0] + "/v1/chat/completions", json=payload, timeout=30).json()
        wait_until(lambda: prefix_hit(fleet, payload) >= 32, timeout_s=10, interval_s=0.1)
        hit, prompt = prefix_hit(fleet, payload), reply["usage"]["prompt_tokens"]
        assert hit % 16 == 0 and hit <= prompt // 32 * 32  # whole engine blocks only, the partial one dropped
        assert fleet.engine_facts()["events"]


class TestTensorRTLLMConfiguredDrain:
    """TensorRT-LLM's HTTP event drain when the worker URL names the engine and model (``#engine=trtllm&
    model=…``): the poller and the mapping alone (stored/removed, partial blocks dropped, the largest
    ``window_size`` kept), apart from detection (``TestTensorRTLLM.test_follows_the_http_event_drain``)."""

    @pytest.fixture(scope="class")
    def fleet(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
        tmp = tmp_path_factory.mktemp("trtllm-drain")
        flags = (*FAKE_FLAGS, "--event-buffer-max-size", "10000", "--extra-window-size", "512")
        suffix = "#engine=trtllm&model=trtllm-fake"
        with engine_fleet("trtllm", tmp, fake_flags=[flags], gateway_flags=BYTES, url_suffix=suffix) as f:
            yield f

    def test_follows_the_configured_http_event_drain(self, fleet: EngineFleet) -> None:
        payload = body("trtllm-fake", content="configured drain prompt " * 8)
        reply = httpx.post(fleet.fakes[0] + "/v1/chat/completions", json=payload, timeout=30).json()
        wait_until(lambda: prefix_hit(fleet, payload) >= 32, timeout_s=10, interval_s=0.1)
        assert prefix_hit(fleet, payload) <= reply["usage"]["prompt_tokens"] // 32 * 32
        assert fleet.fake_state()["paths"].get("POST /kv_cache_events")


class TestTGI(EngineContract):
    """TGI v3: Prometheus queue/batch gauges, /chat_tokenize parity, no cached_tokens ever,
    ``id: ""`` chunks, keep-alive comments, ``{"error": {message, http_status_code}}`` + [DONE]."""

    ENGINE, MODEL, BLOCK_SIZE, CAPACITY = "tgi", "fake-org/tgi-fake", 1, 65_536
    PARITY_PATH = "/chat_tokenize"
    WRONG_PROBES = ("POST /tokenize", "POST /v1/tokenize")  # TGI's /tokenize takes text and adds a BOS

    @pytest.fixture(scope="class")
    def fleet(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
        flags = (*FAKE_FLAGS, "--keep-alive-s", "0.05")
        with engine_fleet(
            "tgi", tmp_path_factory.mktemp("tgi"), fake_flags=[flags], gateway_flags=BYTES
        ) as f:
            yield f

    def test_usage_never_has_cached_tokens(self, fleet: EngineFleet) -> None:
        chat = client(fleet).chat.completions
        for _ in range(2):
            reply = chat.create(**body(self.MODEL))
        assert reply.usage is not None and reply.usage.prompt_tokens_details is None
        assert reply.model == self.MODEL

    def test_keep_alive_comments_pass_through(self, fleet: EngineFleet) -> None:
        raw = raw_stream(fleet.gateway, body(self.MODEL, content="k" * 600))  # 0.6 s of prefill
        frames = [f.strip() for f in raw.split(b"\n\n") if f.strip()]
        assert any(f.startswith(b":") for f in frames), frames[:3]
        assert sse_events(raw)[-1] == "[DONE]"


class TestLMDeploy(EngineContract):
    """LMDeploy: Prometheus gauges, no messages-level probe, prefix caching off by default."""

    ENGINE, MODEL, BLOCK_SIZE = "lmdeploy", "lmdeploy-fake", 64
    AFFINITY = False

    @pytest.fixture(scope="class")
    def fleet(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
        with engine_fleet("lmdeploy", tmp_path_factory.mktemp("lmdeploy"), fake_flags=[FAKE_FLAGS]) as f:
            yield f

    def test_cached_tokens_zero_without_prefix_caching(self, fleet: EngineFleet) -> None:
        chat = client(fleet).chat.completions
        for _ in range(2):
            usage = chat.create(**body(self.MODEL)).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == 0
        assert (
            "no_affinity_reason" in fleet.engine_facts()
            and "prefix" in fleet.engine_facts()["no_affinity_reason"]
        )


class TestLMDeployWithPrefixCaching:
    """LMDeploy started with ``--enable-prefix-caching``: the gateway learns it from ``cached_tokens``."""

    @pytest.fixture(scope="class")
    def fleet(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
        flags = (*FAKE_FLAGS, "--enable-prefix-caching")
        with engine_fleet("lmdeploy", tmp_path_factory.mktemp("lmdeploy-pc"), fake_flags=[flags]) as f:
            yield f

    def test_affinity_turns_on_once_cached_tokens_are_reported(self, fleet: EngineFleet) -> None:
        chat = client(fleet).chat.completions
        for _ in range(2):
            usage = chat.create(**body("lmdeploy-fake", content="lmdeploy prefix " * 20)).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert (usage.prompt_tokens_details.cached_tokens or 0) >= 64
        wait_until(lambda: fleet.engine_facts().get("no_affinity_reason") is None, timeout_s=5)


class TestMII(EngineContract):
    """DeepSpeed-MII: no load signal, static health, exact model name, no stream usage, chunks
    without object/created, untemplated prompt_tokens, no prefix cache."""

    ENGINE, MODEL, BLOCK_SIZE = "mii", "fake-org/mii-fake", 128
    AFFINITY, LOAD_SIGNAL, INJECTS_USAGE, HEALTH_TRUSTED = False, False, False, False

    @pytest.fixture(scope="class")
    def fleet(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
        with engine_fleet("mii", tmp_path_factory.mktemp("mii"), fake_flags=[FAKE_FLAGS]) as f:
            yield f

    def test_model_reaches_mii_exactly_and_unknown_models_are_the_gateways_404(
        self, fleet: EngineFleet
    ) -> None:
        reply = client(fleet).chat.completions.create(**body(self.MODEL))
        assert reply.choices[0].message.content
        assert fleet.fake_state()["last_body"]["/v1/chat/completions"]["model"] == self.MODEL
        with pytest.raises(openai.NotFoundError):
            client(fleet).chat.completions.create(**body("mii-fake"))

    def test_stream_chunks_without_object_created_or_usage(self, fleet: EngineFleet) -> None:
        stream = client(fleet).chat.completions.create(
            **body(self.MODEL), stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        sent = fleet.fake_state()["last_body"]["/v1/chat/completions"]
        assert sent["stream_options"] == {"include_usage": True}  # passed on as asked; MII ignores it

    def test_health_is_not_trusted(self, fleet: EngineFleet) -> None:
        assert "passive" in str(fleet.engine_facts().get("health"))


class TestMIIBroken:
    """A broken MII (``/health`` still 200) beside a good one: failed generations take it out of rotation."""

    @pytest.fixture(scope="class")
    def fleet(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
        with engine_fleet(
            "mii", tmp_path_factory.mktemp("mii-broken"), fake_flags=[FAKE_FLAGS, (*FAKE_FLAGS, "--broken")]
        ) as f:
            yield f

    def test_requests_succeed_and_the_broken_worker_is_marked(self, fleet: EngineFleet) -> None:
        chat = client(fleet).chat.completions
        for i in range(8):
            assert chat.create(**body("fake-org/mii-fake", content=f"request {i}")).choices[0].message.content
        broken = fleet.worker(1)
        assert broken["breaker"] != "closed" or not broken["healthy"], broken
        assert httpx.get(fleet.fakes[1] + "/health", timeout=5).json() == {"status": "ok"}
