"""bench_proxy's other routers: command templating, peer presets, process-tree CPU, the side-by-side table."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from loadtest.bench_proxy import _paced_body, _paced_params, _parser, _routers, side_by_side
from loadtest.router_cmd import RouterCommand, parse_router_cmd, peer_command, tree_cpu_s

WORKERS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


def test_workers_placeholder_expands_to_one_argument_per_url() -> None:
    cmd = parse_router_cmd("rr=my-router --listen {port} --backends {workers} --metrics {metrics_port}")
    assert cmd.name == "rr"
    argv = cmd.render(7000, WORKERS, 7001)
    assert argv == ["my-router", "--listen", "7000", "--backends", *WORKERS, "--metrics", "7001"]


def test_workers_inside_a_quoted_argument_stay_one_argument() -> None:
    argv = RouterCommand("x", "r --port={port} --urls='{workers}'").render(1, WORKERS, 2)
    assert argv == ["r", "--port=1", "--urls=" + " ".join(WORKERS)]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-equals-sign", "NAME=COMMAND"),
        ("=router {port}", "NAME=COMMAND"),
        ("name=", "NAME=COMMAND"),
    ],
    ids=["no-equals", "empty-name", "empty-command"],
)
def test_malformed_router_cmd_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_router_cmd(spec)


@pytest.mark.parametrize(
    ("template", "message"),
    [("router --workers {workers}", "must contain {port}"), ("r {port} {host}", "unknown placeholder")],
    ids=["no-port", "unknown-placeholder"],
)
def test_bad_template_is_refused_when_rendered(template: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RouterCommand("x", template).render(1, WORKERS, 2)


@pytest.mark.parametrize(
    ("spec", "name", "head", "policy"),
    [
        ("vllm-router", "vllm-router", ["/venv/bin/vllm-router"], "round_robin"),
        ("sglang-router", "sglang-router", ["/venv/bin/python", "-m", "sglang_router.launch_router"],
         "round_robin"),
        ("vllm-router:cache_aware", "vllm-router cache_aware", ["/venv/bin/vllm-router"], "cache_aware"),
    ],
    ids=["vllm", "sglang", "vllm-cache-aware"],
)  # fmt: skip
def test_peer_presets_render_their_launch_command(spec: str, name: str, head: list[str], policy: str) -> None:
    cmd = peer_command(spec, Path("/venv"))
    argv = cmd.render(7000, WORKERS, 7001)
    assert cmd.name == name
    assert argv[: len(head)] == head
    assert argv[argv.index("--port") + 1] == "7000"
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--worker-urls") + 3] == WORKERS
    assert argv[argv.index("--policy") + 1] == policy
    assert argv[argv.index("--prometheus-port") + 1] == "7001"


@pytest.mark.parametrize("spec", ["nginx", "vllm-router:least_load"], ids=["unknown-peer", "bad-policy"])
def test_unknown_peer_or_policy_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="--peer"):
        peer_command(spec, Path("/venv"))


def test_routers_start_with_kvgate_then_variants_commands_and_peers() -> None:
    args = _parser().parse_args(
        ["--kvgate-variant", "kvgate x2=--processes 2", "--router-cmd", "mine=r --port {port} {workers}",
         "--peer", "sglang-router", "--peer-venv", "/v", "--gateway-arg=--trace"]
    )  # fmt: skip
    routers = _routers(args, [9001, 9002])
    assert [r.name for r in routers] == ["kvgate", "kvgate x2", "mine", "sglang-router"]
    assert routers[1].argv[-3:] == ["--trace", "--processes", "2"]
    assert "--worker=http://127.0.0.1:9002" in routers[1].argv
    assert routers[2].argv == ["r", "--port", str(routers[2].port), *WORKERS]
    assert len({r.port for r in routers}) == 4


def test_tree_cpu_counts_this_process() -> None:
    first = tree_cpu_s(os.getpid())
    sum(i * i for i in range(200_000))
    assert tree_cpu_s(os.getpid()) >= first > 0


def test_tree_cpu_of_a_gone_process_is_zero() -> None:
    assert tree_cpu_s(2**22 + 1) == 0.0


def cell(rps: float, p50_ms: float, cpu_us: float) -> dict[str, float]:
    return {"requests": rps, "rps": rps, "p50_ms": p50_ms, "p99_ms": 2 * p50_ms, "errors": 0.0,
            "cpu_us": cpu_us}  # fmt: skip


def test_side_by_side_has_a_row_per_router_and_mode() -> None:
    direct = {"non-stream": cell(5000, 0.1, 0), "stream": cell(4000, 0.2, 0)}
    results = {
        name: {m: (cell(1000, 0.5, 300), cell(3000, 5.0, 250)) for m in ("non-stream", "stream")}
        for name in ("kvgate", "vllm-router")
    }
    table = side_by_side(direct, results, 64).splitlines()
    assert "req/s @64" in table[0] and "CPU µs/req @64" in table[0]
    assert len(table) == 2 + 4
    assert table[2] == "| kvgate | non-stream | 1000 | 300 | 3000 | 250 | +0.400 | +0.800 | 0 |"
    assert table[5].startswith("| vllm-router | stream |")


def test_a_paced_request_carries_its_token_count_and_gap_to_the_mock() -> None:
    body = _paced_body(64, 1.5)
    assert orjson.loads(body)["stream"] is True
    assert _paced_params(body) == (64, 1.5)
    assert _paced_params(b'{"model":"mock","stream":true}') is None
