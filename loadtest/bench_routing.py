"""Routing quality on a simulated fleet: hit rate vs the ideal single cache, TTFT, imbalance, replicas.

Run: ``python -m loadtest.bench_routing [--quick] [--fleet kvgate|foreign]
[--scenarios multi_turn,shared_prefix,trace] [--cases rr,ll,pca,pca_x4,pca_x4_first] [--trace-speedup 10]
[--prefill-tps 20000] [--out DIR]``.
Each scenario ends with the prefill utilisation per case (uncached prompt tokens over the fleet's capacity).

Every case starts a fresh fleet (``loadtest.fleet``): 8 simulated workers whose KV caches (16k tokens
each) are much smaller than the working set, prefill-dominated timings like a GPU fleet (20k prompt
tokens/s of prefill, 100 tokens/s of decode per sequence, 32 batch slots), and one gateway, or four sharing
a private ``redis-server`` (``pca_x4_first``, not run by default: the same four with every request sent to
the first, to see what the other replicas cost it apart from splitting the traffic). Workloads: multi-turn
chat and shared-prefix groups (open loop, Poisson), and the first 1,000 records of the Mooncake
conversation trace (``loadtest/data``) replayed on token-id prompts, scaled down 32× in length (one
512-token trace block = one 16-token KV block) and sped up 10×.
Per case: fleet cache hit rate (``cached_tokens`` / prompt tokens), the ideal hit rate
of the same request sequence through ONE cache of the fleet's capacity (``loadtest.ideal_cache``), TTFT
p50/p99 and its queue + prefill part on the worker (``worker_ttfts``: what routing decides, apart from the
HTTP and process time around it) and the p50 of the rest (``outside_ttfts``: each request's TTFT minus its
modelled queue + prefill), load imbalance (max/mean over the 8 workers of prompt tokens served,
and of prefill work, i.e. uncached tokens), the gateways' CPU share and their mean upstream TTFT (from
sending a request to a worker to its first chunk, read from the gateways' ``/metrics``: the worker's real
time to first token, without the client-side half that this rig's shared cores make noisy). Rates are
kept modest: gateway, workers and driver share this machine's two cores. Each case's requests are written
to ``OUT/records/`` (JSON lines). The same scenarios replay offline, in seconds, through
``python -m loadtest.route_sim``.

``--fleet foreign`` runs the same scenarios on workers that publish no KV events and tokenize in whitespace
words (``--sim --foreign``), the gateway on its default flags (``--policy`` only for the other policies, and
``#kv_tokens=`` in each worker URL): see ``loadtest.foreign_fleet``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from gateway.settings import DEFAULT_POLICY
from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint
from loadtest.driver import DriverConfig, RequestRecord, RunResult, run_load
from loadtest.fleet import Fleet, FleetSpec, free_port, launch
from loadtest.foreign_fleet import WORD_BLOCK_SIZE, WorkerFleet, as_words, worker_tokens_per_token
from loadtest.ideal_cache import PromptBlocks, ideal_replay, prompt_blocks
from loadtest.proc_stats import merged, parse_histogram
from loadtest.report import percentile, summarize
from loadtest.router_cmd import RouterCommand, parse_router_cmd, peer_command, tree_cpu_s
from loadtest.trace import MOONCAKE_TRACE, TraceOptions, trace_sessions
from loadtest.workloads import Session, WorkloadSpec, multi_turn, shared_prefix

BLOCK_SIZE = 16
NUM_WORKERS = 8
KV_TOKENS = 16_384
PREFILL_TPS = 20_000
DECODE_TPS = 100
MAX_RUNNING = 32
KVGATE_FLEET = WorkerFleet(foreign=False, kv_tokens=KV_TOKENS, prefill_tps=PREFILL_TPS)
TRACE = MOONCAKE_TRACE


@dataclass(frozen=True, slots=True)
class Scenario:
    """A workload and how to drive it (``rate``: sessions/s, Poisson; None: the sessions' arrivals, or a
    closed loop of ``concurrency`` sessions where they carry none), and the fleet it runs on: ``workers``
    workers of ``kv_tokens`` each (kvgate-fleet tokens; the foreign fleet's are scaled to its words), which
    on the foreign fleet announce their capacity (``#kv_tokens=``) only where ``announce``."""

    name: str
    sessions: Callable[[bool], list[Session]]
    rate: float | None
    max_requests: int
    duration_s: float
    concurrency: int = 8
    workers: int = NUM_WORKERS
    kv_tokens: int = KV_TOKENS
    announce: bool = True


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    policy: str
    gateways: int = 1
    gateway_args: tuple[str, ...] = ()  # extra ``kvgate gateway`` flags (e.g. ``--processes 2``)
    #: send every request to the first gateway only (the others run, share state and route nothing): what
    #: the replicas cost the one that serves, apart from splitting the traffic
    drive_first_only: bool = False
    #: another router in kvgate's place (``loadtest.fleet``'s template: ``{port}``, ``{workers}``)
    router_cmd: str | None = None

    @property
    def label(self) -> str:
        """The policy, with the extra gateway flags if any, or the peer router (the table's first column)."""
        if self.router_cmd is not None:
            return self.name
        return " ".join((self.policy, *self.gateway_args))

    def slug(self, scenario: str) -> str:
        """A file name for this case's logs and records under ``scenario``."""
        if self.router_cmd is not None:
            return f"{scenario}-" + "".join(c if c.isalnum() else "_" for c in self.name)
        return "-".join(
            (scenario, self.policy, str(self.gateways), *(a.strip("-") for a in self.gateway_args))
        ) + ("-first" if self.drive_first_only else "")


#: ``--peer tuned`` flags: vllm-router's cache_aware balance thresholds as a tuned deployment sets them
PEER_TUNED_ARGS = "--balance-abs-threshold 8 --balance-rel-threshold 1.5"


def peer_case(spec: str, venv: Path) -> Case:
    """A peer router as a case: ``vllm-router:cache_aware``, ``sglang-router:cache_aware`` (see
    ``loadtest.router_cmd``), ``…:tuned`` for cache_aware with ``PEER_TUNED_ARGS``.

    Raises:
        ValueError: an unknown preset or policy.
    """
    preset, tuned = (spec[: -len(":tuned")], True) if spec.endswith(":tuned") else (spec, False)
    command = peer_command(preset, venv)
    if tuned:
        return router_case(RouterCommand(f"{command.name} (tuned)", f"{command.template} {PEER_TUNED_ARGS}"))
    return router_case(command)


def router_case(command: RouterCommand) -> Case:
    """Another router in kvgate's place (``--peer``, ``--router-cmd``): its ``{metrics_port}`` given a free
    port here (the fleet fills ``{port}`` and ``{workers}``)."""
    return Case(command.name, "peer", router_cmd=command.template.replace("{metrics_port}", str(free_port())))


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: Case
    run: RunResult
    ideal_hit_rate: float
    gateway_cpu_s: float
    prefill_imbalance: float
    imbalance: float
    upstream_ttft_mean_s: float = float("nan")
    extra: dict[str, float] = field(default_factory=dict)


CASES = {
    "rr": Case("round_robin", "round_robin"),
    "ll": Case("least_load", "least_load"),
    "pca": Case("prefix_cache_aware", "prefix_cache_aware"),
    "pca_x4": Case("prefix_cache_aware ×4 gw", "prefix_cache_aware", gateways=4),
    "pca_x4_first": Case(
        "prefix_cache_aware ×4 gw, all to the first", "prefix_cache_aware", gateways=4, drive_first_only=True
    ),
    "pca_p2": Case(
        "prefix_cache_aware --processes 2", "prefix_cache_aware", gateway_args=("--processes", "2")
    ),
}
DEFAULT_CASES = tuple(name for name in CASES if name != "pca_x4_first")  # that one is a diagnosis


def _chat_closed(quick: bool) -> list[Session]:
    """More sessions than the run reaches, so that the closed loop always has a new one to start."""
    spec = WorkloadSpec(num_sessions=2_000, turns=12, system_words=200, question_words=20)
    return multi_turn(spec)


def _multi_turn(quick: bool) -> list[Session]:
    spec = WorkloadSpec(num_sessions=24 if quick else 64, turns=8, system_words=200, question_words=20)
    return multi_turn(spec)


def _shared_prefix(quick: bool) -> list[Session]:
    spec = WorkloadSpec(num_sessions=32, turns=4 if quick else 8, prefix_words=400, question_words=20)
    sessions = shared_prefix(spec)
    random.Random(1).shuffle(sessions)  # questions of the groups arrive in random order, as in SGLang's bench
    return sessions


#: How the trace is replayed: 10× speed, lengths ÷32 (one 512-token trace block = one 16-token KV block).
TRACE_OPTIONS = TraceOptions(speedup=10.0, scale=32, max_output_tokens=16)


def _trace(
    quick: bool, speedup: float = TRACE_OPTIONS.speedup, burst_spread_ms: float = 0.0
) -> list[Session]:
    options = replace(
        TRACE_OPTIONS, limit=400 if quick else 1000, speedup=speedup, burst_spread_ms=burst_spread_ms
    )
    return trace_sessions(TRACE, options)


def prefill_utilisation(run: RunResult, prefill_tps: float, workers: int = NUM_WORKERS) -> float:
    """Uncached prompt tokens computed over what the fleet could prefill in the run's wall time."""
    work = sum(max(0, r.prompt_tokens - r.cached_tokens) for r in run.records if r.ok)
    return work / (prefill_tps * workers * run.wall_s) if run.wall_s > 0 else float("nan")


SCENARIOS = {
    "multi_turn": Scenario("multi_turn", _multi_turn, rate=1.5, max_requests=600, duration_s=60.0),
    "shared_prefix": Scenario("shared_prefix", _shared_prefix, rate=8.0, max_requests=600, duration_s=60.0),
    "trace": Scenario("trace", _trace, rate=None, max_requests=1000, duration_s=70.0),
    # 32 closed-loop chat sessions on 4 small caches; on the foreign fleet the workers announce nothing
    "chat_closed": Scenario(
        "chat_closed",
        _chat_closed,
        rate=None,
        max_requests=20_000,
        duration_s=30.0,
        concurrency=32,
        workers=4,
        kv_tokens=50_000,
        announce=False,
    ),
}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def upstream_ttft_mean(metrics_pages: Sequence[str]) -> float:
    """The gateways' mean time from sending a request upstream to its first streamed chunk
    (``kvgate_ttfb_seconds`` over every route and gateway): the worker's own time to first token plus
    loopback, without the client's and the gateway's front half, which on this rig swing by several ms
    between runs. nan when no request was streamed."""
    total = count = 0.0
    for page in metrics_pages:
        for line in page.splitlines():
            if line.startswith("kvgate_ttfb_seconds_sum"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith("kvgate_ttfb_seconds_count"):
                count += float(line.rsplit(" ", 1)[1])
    return total / count if count else float("nan")


def histogram_quantile(
    metrics_pages: Sequence[str], family: str, q: float, labels: Mapping[str, str] | None = None
) -> float:
    """The ``q`` quantile of the histogram ``family`` (its series with ``labels``) pooled over every gateway's
    page (``Histogram.quantile``); nan without observations."""
    return merged(parse_histogram(page, family, labels) for page in metrics_pages).quantile(q)


def replica_lag_quantile(metrics_pages: Sequence[str], kind: str, q: float) -> float:
    """``histogram_quantile`` of ``kvgate_replica_lag_seconds{kind}``: load, prediction or kv_events."""
    return histogram_quantile(metrics_pages, "kvgate_replica_lag_seconds", q, {"kind": kind})


def sent_in_order(
    sessions: Sequence[Session], records: Sequence[RequestRecord], bundle: TokenizerBundle | None = None
) -> list[PromptBlocks]:
    """The requests the run sent, in the order it sent them, as the cache sees them (tokenized by the
    workers' ``bundle``, the byte tokenizer by default).

    A session's requests run in order, so its k-th record (by start time) is its k-th request.
    """
    by_id = {s.id: s for s in sessions}
    seen: Counter[str] = Counter()
    bundle = bundle or byte_bundle()
    out = []
    for rec in sorted(records, key=lambda r: r.start_s):
        req = by_id[rec.session].requests[seen[rec.session]]
        seen[rec.session] += 1
        output = rec.completion_tokens if rec.ok else None
        out.append(prompt_blocks(req.body, Endpoint(req.endpoint), bundle, output_tokens=output))
    return out


def imbalance(
    records: Sequence[RequestRecord], workers: int, weight: Callable[[RequestRecord], int]
) -> float:
    """max/mean over all ``workers`` (idle ones count as 0) of ``weight`` summed per worker."""
    per: defaultdict[str, int] = defaultdict(int)
    for r in records:
        if r.ok and r.worker:
            per[r.worker] += weight(r)
    total = sum(per.values())
    return max(per.values()) / (total / workers) if total else float("nan")


def worker_ttfts(records: Sequence[RequestRecord], prefill_tps: float = PREFILL_TPS) -> list[float]:
    """Each successful request's queue + prefill time on its worker under the simulated worker's timing
    model (one FIFO prefill server per worker at ``prefill_tps``; cached tokens cost nothing), taking the
    send times as arrivals: the part of TTFT that routing decides, without the HTTP, gateway, worker
    and driver time around it, which on a small machine shared by the whole fleet is large and noisy."""
    return [modelled for _, modelled in _modelled_ttfts(records, prefill_tps)]


def outside_ttfts(records: Sequence[RequestRecord], prefill_tps: float = PREFILL_TPS) -> list[float]:
    """Each successful request's TTFT minus its modelled queue + prefill (``worker_ttfts``): the time spent
    outside the workers' model (HTTP, gateway, the processes' scheduling, the driver)."""
    pairs = _modelled_ttfts(records, prefill_tps)
    return [r.ttft_s - modelled for r, modelled in pairs if r.ttft_s is not None]


def _modelled_ttfts(
    records: Sequence[RequestRecord], prefill_tps: float
) -> list[tuple[RequestRecord, float]]:
    free: defaultdict[str, float] = defaultdict(float)
    out = []
    for r in sorted((r for r in records if r.ok and r.worker), key=lambda r: r.start_s):
        assert r.worker is not None, "filtered above"
        done = max(r.start_s, free[r.worker]) + max(0, r.prompt_tokens - r.cached_tokens) / prefill_tps
        free[r.worker] = done
        out.append((r, done - r.start_s))
    return out


_DUMPED = (
    "session",
    "start_s",
    "ttft_s",
    "prompt_tokens",
    "cached_tokens",
    "worker",
    "predicted_hit_tokens",
    "error",
)


def run_case(
    scenario: Scenario,
    case: Case,
    sessions: list[Session],
    out: Path,
    pca_params: str | None = None,
    workers: WorkerFleet = KVGATE_FLEET,
) -> CaseResult:
    """One fresh fleet, one workload, one policy; ``pca_params`` (JSON) tunes ``prefix_cache_aware``."""
    spec = _fleet_spec(scenario, case, out, pca_params, workers)
    with launch(spec) as fleet:
        run, cpu = _drive(fleet, scenario, sessions, first_only=case.drive_first_only)
        # a peer has none of kvgate's metrics (its /metrics may be a worker's 404): its figures read nan
        urls = fleet.gateway_urls if case.router_cmd is None else []
        pages = [httpx.get(u + "/metrics", timeout=5.0).text for u in urls]
    extra = {
        f"{kind} lag p{round(q * 100)} ms": 1e3 * replica_lag_quantile(pages, kind, q)
        for kind in ("load", "prediction", "kv_events")
        for q in (0.5, 0.9)
    }
    extra["event loop lag p90 ms"] = 1e3 * histogram_quantile(pages, "kvgate_event_loop_lag_seconds", 0.9)
    recs = run.records
    dump = out / "records" / f"{case.slug(scenario.name)}.jsonl"
    dump.parent.mkdir(parents=True, exist_ok=True)
    with dump.open("w", encoding="utf-8") as f:
        for r in recs:
            row = {k: getattr(r, k) for k in _DUMPED}
            f.write(json.dumps(row) + "\n")
    return CaseResult(
        case=case,
        run=run,
        ideal_hit_rate=_ideal(sessions, recs, workers, scenario.workers),
        gateway_cpu_s=cpu,
        prefill_imbalance=imbalance(
            recs, scenario.workers, lambda r: max(0, r.prompt_tokens - r.cached_tokens)
        ),
        imbalance=imbalance(recs, scenario.workers, lambda r: r.prompt_tokens),
        upstream_ttft_mean_s=upstream_ttft_mean(pages),
        extra={k: v for k, v in extra.items() if v == v},  # nan: no replica shared the state
    )


def _fleet_spec(
    scenario: Scenario, case: Case, out: Path, pca_params: str | None, workers: WorkerFleet
) -> FleetSpec:
    gateway_args: tuple[str, ...] = case.gateway_args
    if pca_params and case.policy == "prefix_cache_aware":
        conf = out / "pca_policy.json"  # YAML is a superset of JSON
        conf.write_text(json.dumps({"type": case.policy, "params": json.loads(pca_params)}), encoding="utf-8")
        gateway_args += ("--policy-config", str(conf))
    # The foreign fleet's gateway runs on its defaults: --policy only where it is not the default one.
    implicit = workers.foreign and case.policy == DEFAULT_POLICY and not gateway_args
    return FleetSpec(
        workers=scenario.workers,
        gateways=case.gateways,
        policy=None if implicit or case.router_cmd is not None else case.policy,
        gateway_args=gateway_args,
        worker_args=workers.worker_args(DECODE_TPS, MAX_RUNNING),
        worker_fragment=f"kv_tokens={workers.kv_tokens}" if workers.foreign and scenario.announce else "",
        router_cmd=case.router_cmd,
        log_dir=out / "logs" / case.slug(scenario.name),
    )


def _ideal(
    sessions: Sequence[Session], records: Sequence[RequestRecord], workers: WorkerFleet, count: int
) -> float:
    """The ideal hit rate in the workers' units: one cache of the fleet's capacity in their tokens."""
    sent = sent_in_order(sessions, records, workers.bundle())
    block_size = WORD_BLOCK_SIZE if workers.foreign else BLOCK_SIZE
    return ideal_replay(sent, count * workers.kv_tokens, block_size).hit_rate


def _drive(
    fleet: Fleet, scenario: Scenario, sessions: list[Session], *, first_only: bool = False
) -> tuple[RunResult, float]:
    cfg = DriverConfig(
        target=",".join(fleet.gateway_urls[:1] if first_only else fleet.gateway_urls),
        rate=scenario.rate,
        concurrency=scenario.concurrency,
        max_requests=scenario.max_requests,
        duration_s=scenario.duration_s,
        request_timeout_s=60.0,
    )
    pids = [p.pid for p in fleet.gateway_procs]
    before = sum(tree_cpu_s(p) for p in pids)  # a --processes gateway counts whole
    run = asyncio.run(run_load(sessions, cfg))
    return run, sum(tree_cpu_s(p) for p in pids) - before


def predicted(records: Sequence[RequestRecord]) -> float:
    """The gateway's predicted hit (``x-kvgate-prefix-hit``) over prompt tokens, for successful requests."""
    ok = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    return sum(r.predicted_hit_tokens or 0 for r in ok) / prompt if prompt else float("nan")


def table(results: Sequence[CaseResult], prefill_tps: float = PREFILL_TPS) -> str:
    """Markdown rows with the ratios the targets speak of."""
    by = {r.case.name: r for r in results}
    rr = by.get(CASES["rr"].name)
    one = by.get(CASES["pca"].name)
    head = (
        "| policy | gateways | requests | failed | req/s | hit rate | ideal | hit/ideal | TTFT p50 ms "
        "| TTFT p99 ms | p50 rr/this | queue+prefill p50 ms | outside p50 ms | imbalance | prefill imbalance "
        "| predicted hit | gateway CPU % | upstream TTFT mean ms |"
    )
    lines = [head, "|" + "---|" * 18]
    queue_prefill_p50 = {
        r.case.name: percentile(worker_ttfts(r.run.records, prefill_tps), 50) for r in results
    }
    outside_p50 = {r.case.name: percentile(outside_ttfts(r.run.records, prefill_tps), 50) for r in results}
    for r in results:
        s = summarize(r.run)
        cpu = 100.0 * r.gateway_cpu_s / max(r.run.wall_s, 1e-9) / r.case.gateways
        speed = f"{rr_p50 / s.ttft_p50:.2f}×" if rr and (rr_p50 := summarize(rr.run).ttft_p50) else "–"
        lines.append(
            f"| {r.case.label} | {r.case.gateways} | {s.requests} | {s.failed} | {s.req_per_s:.1f} "
            f"| {s.hit_rate:.1%} | {r.ideal_hit_rate:.1%} | {s.hit_rate / r.ideal_hit_rate:.2f} "
            f"| {s.ttft_p50 * 1e3:.1f} | {s.ttft_p99 * 1e3:.1f} | {speed} "
            f"| {queue_prefill_p50[r.case.name] * 1e3:.1f} | {outside_p50[r.case.name] * 1e3:.1f} "
            f"| {r.imbalance:.2f} "
            f"| {r.prefill_imbalance:.2f} | {predicted(r.run.records):.1%} | {cpu:.0f} "
            f"| {r.upstream_ttft_mean_s * 1e3:.1f} |"
        )
    x4 = by.get(CASES["pca_x4"].name)
    if one and x4:
        a, b = summarize(one.run), summarize(x4.run)
        lines.append("")
        lines.append(
            f"4 vs 1 gateway replicas: hit rate {b.hit_rate:.1%} vs {a.hit_rate:.1%} "
            f"({(b.hit_rate - a.hit_rate) / a.hit_rate:+.1%}); TTFT p50 {b.ttft_p50 * 1e3:.1f} vs "
            f"{a.ttft_p50 * 1e3:.1f} ms; queue+prefill p50 {queue_prefill_p50[x4.case.name] * 1e3:.1f} vs "
            f"{queue_prefill_p50[one.case.name] * 1e3:.1f} ms; outside p50 "
            f"{outside_p50[x4.case.name] * 1e3:.1f} vs {outside_p50[one.case.name] * 1e3:.1f} ms"
        )
    lagged = [r for r in results if r.extra]
    if lagged:
        lines.append("")
        lines.append(
            "Lags, every gateway's pooled: `load` / `prediction` = how late a replica took in the others' "
            "changes (`kvgate_replica_lag_seconds`, the oldest change of each push or batch received), "
            "`kv_events` = from the relaying replica receiving a worker's events to a replica applying them; "
            "event loop = how late a 100 ms timer fired (`kvgate_event_loop_lag_seconds`):"
        )
        for r in lagged:
            figures = ", ".join(f"{k} {v:.1f}" for k, v in r.extra.items())
            lines.append(f"- {r.case.name}: {figures}")
    return "\n".join(lines) + "\n"


def _workload(
    scenario: Scenario, quick: bool, *, foreign: bool, prefill_tps: float = PREFILL_TPS
) -> tuple[list[Session], WorkerFleet]:
    """The scenario's sessions and the workers to run them on (``--fleet foreign``: word prompts, and a fleet
    scaled to the workload's words per kvgate token; see ``loadtest.foreign_fleet``)."""
    sessions = scenario.sessions(quick)
    if not foreign:
        return sessions, replace(KVGATE_FLEET, kv_tokens=scenario.kv_tokens, prefill_tps=prefill_tps)
    words = as_words(sessions)
    ratio = worker_tokens_per_token(sessions, words)
    return words, WorkerFleet.scaled(scenario.kv_tokens, prefill_tps, ratio)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench_routing", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller workloads (~20 s a case)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"from {', '.join(SCENARIOS)}")
    ap.add_argument(
        "--cases", default=",".join(DEFAULT_CASES),
        help=f"from {', '.join(CASES)} (default {','.join(DEFAULT_CASES)})",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("loadtest-results/bench_routing"))
    ap.add_argument("--pca-params", help="prefix_cache_aware params as JSON, e.g. '{\"balance_weight\": 0}'")
    ap.add_argument(
        "--fleet",
        choices=["kvgate", "foreign"],
        default="kvgate",
        help="kvgate: --sim workers with KV events; foreign: --sim --foreign ones (no events, word tokens)",
    )
    ap.add_argument(
        "--trace-speedup", type=float, default=TRACE_OPTIONS.speedup,
        help="replay the trace this many times faster than recorded (raise it until queueing exists)",
    )  # fmt: skip
    ap.add_argument(
        "--prefill-tps", type=float, default=PREFILL_TPS,
        help="each kvgate-fleet worker's prefill rate (the foreign fleet's is scaled from it); lower it to "
        "load the fleet",
    )  # fmt: skip
    ap.add_argument(
        "--announce-capacity", action="store_true",
        help="foreign fleet: every worker URL carries #kv_tokens= (chat_closed announces nothing otherwise)",
    )  # fmt: skip
    ap.add_argument(
        "--peer", action="append", default=[], metavar="PRESET",
        help="a peer router as one more case, side by side: vllm-router:cache_aware, "
        "sglang-router:cache_aware, ...:round_robin, or vllm-router:cache_aware:tuned (abs 8, rel 1.5); "
        "repeatable; needs --peer-venv",
    )  # fmt: skip
    ap.add_argument(
        "--router-cmd", action="append", default=[], metavar="NAME=COMMAND",
        help="any router as one more case: a command line with {port} and {workers} (each worker URL an "
        "argument), e.g. another kvgate tree to compare with; repeatable",
    )  # fmt: skip
    ap.add_argument(
        "--peer-venv", type=Path, default=Path("/tmp/peer-routers"),
        help="the venv the peers are installed in (pip install vllm-router==0.1.17 sglang-router==0.3.2)",
    )  # fmt: skip
    ap.add_argument(
        "--burst-spread-ms", type=float, default=0.0,
        help="trace: spread each burst of same-instant arrivals evenly over this many ms (0: as recorded)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    scenarios = dict(SCENARIOS)
    if args.announce_capacity:
        scenarios = {name: replace(s, announce=True) for name, s in scenarios.items()}
    if args.trace_speedup != TRACE_OPTIONS.speedup or args.burst_spread_ms:
        scenarios["trace"] = replace(
            SCENARIOS["trace"], sessions=lambda quick: _trace(quick, args.trace_speedup, args.burst_spread_ms)
        )
    names, cases = args.scenarios.split(","), args.cases.split(",")
    unknown = [n for n in names if n not in SCENARIOS] + [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown scenario or case: {', '.join(unknown)}")
    try:
        peers = [peer_case(spec, args.peer_venv) for spec in args.peer]
        peers += [router_case(parse_router_cmd(spec)) for spec in args.router_cmd]
    except ValueError as exc:
        ap.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    report = [f"# bench_routing ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", ""]
    for name in names:
        scenario = scenarios[name]
        sessions, workers = _workload(
            scenario, args.quick, foreign=args.fleet == "foreign", prefill_tps=args.prefill_tps
        )
        results = []
        for case in [CASES[key] for key in cases] + peers:
            t0 = time.monotonic()
            results.append(run_case(scenario, case, sessions, args.out, args.pca_params, workers))
            print(f"[{name}] {case.name} done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        utilisation = ", ".join(
            f"{r.case.name} {prefill_utilisation(r.run, workers.prefill_tps, scenario.workers):.2f}"
            for r in results
        )
        text = (
            f"## {name}\n\n{workers.describe(scenario.workers, scenario.announce)}\n\n"
            f"{table(results, workers.prefill_tps)}\n"
            f"prefill utilisation (uncached prompt tokens / the fleet's prefill capacity): {utilisation}\n"
        )
        print(text, flush=True)
        report.append(text)
    (args.out / "report.md").write_text("\n".join(report), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
