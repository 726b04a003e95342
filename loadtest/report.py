"""Summaries, markdown tables and PNG plots for load-driver runs (one run, or several side by side)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loadtest.driver import RequestRecord, RunResult


@dataclass(frozen=True, slots=True)
class Summary:
    """Figures of one run. Latencies in seconds; ``hit_rate`` is cached / prompt tokens."""

    requests: int
    failed: int
    wall_s: float
    req_per_s: float
    output_tok_per_s: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    e2e_p50: float
    e2e_p99: float
    itl_p50: float
    itl_p99: float
    hit_rate: float
    imbalance: float
    workers: int


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) of ``values``; nan when empty."""
    return float(np.percentile(values, q)) if values else float("nan")


def load_imbalance(records: Sequence[RequestRecord]) -> float:
    """max/mean of prompt tokens served per worker (1.0 = perfectly even; nan without worker headers)."""
    per: Counter[str] = Counter()
    for r in records:
        if r.ok and r.worker:
            per[r.worker] += max(1, r.prompt_tokens)
    if not per:
        return float("nan")
    vals = list(per.values())
    return max(vals) / (sum(vals) / len(vals))


def summarize(result: RunResult) -> Summary:
    recs = result.records
    ok = [r for r in recs if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s for r in ok]
    itl = [g for r in ok for g in r.itl_s]
    prompt = sum(r.prompt_tokens for r in ok)
    wall = max(result.wall_s, 1e-9)
    return Summary(
        requests=len(recs),
        failed=len(recs) - len(ok),
        wall_s=result.wall_s,
        req_per_s=len(ok) / wall,
        output_tok_per_s=sum(r.completion_tokens for r in ok) / wall,
        ttft_p50=percentile(ttft, 50),
        ttft_p90=percentile(ttft, 90),
        ttft_p99=percentile(ttft, 99),
        e2e_p50=percentile(e2e, 50),
        e2e_p99=percentile(e2e, 99),
        itl_p50=percentile(itl, 50),
        itl_p99=percentile(itl, 99),
        hit_rate=(sum(r.cached_tokens for r in ok) / prompt) if prompt else float("nan"),
        imbalance=load_imbalance(recs),
        workers=len({r.worker for r in ok if r.worker}),
    )


_COLUMNS = (
    ("requests", "requests", "{:d}"),
    ("failed", "failed", "{:d}"),
    ("req/s", "req_per_s", "{:.1f}"),
    ("out tok/s", "output_tok_per_s", "{:.0f}"),
    ("TTFT p50 ms", "ttft_p50", "ms"),
    ("TTFT p99 ms", "ttft_p99", "ms"),
    ("E2E p50 ms", "e2e_p50", "ms"),
    ("E2E p99 ms", "e2e_p99", "ms"),
    ("ITL p50 ms", "itl_p50", "ms"),
    ("hit rate", "hit_rate", "{:.1%}"),
    ("imbalance", "imbalance", "{:.2f}"),
)


def _fmt(value: float | int, how: str) -> str:
    if isinstance(value, float) and np.isnan(value):
        return "–"
    if how == "ms":
        return f"{float(value) * 1000:.1f}"
    return how.format(value)


def markdown_table(summaries: Mapping[str, Summary], baseline: str | None = None) -> str:
    """One row per run; with ``baseline``, extra columns give TTFT p50 and hit-rate ratios against it."""
    head = ["run", *[c[0] for c in _COLUMNS]]
    if baseline:
        head += [f"TTFT p50 vs {baseline}", f"throughput vs {baseline}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = summaries.get(baseline) if baseline else None
    for name, s in summaries.items():
        row = [name, *[_fmt(getattr(s, attr), how) for _, attr, how in _COLUMNS]]
        if base is not None:
            row.append(f"{base.ttft_p50 / s.ttft_p50:.2f}× faster" if s.ttft_p50 > 0 else "–")
            row.append(f"{s.req_per_s / base.req_per_s:.2f}×" if base.req_per_s > 0 else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _cdf(ax: object, values: Sequence[float], label: str) -> None:
    if not values:
        return
    xs = np.sort(np.asarray(values)) * 1000.0
    ys = np.arange(1, len(xs) + 1) / len(xs)
    ax.plot(xs, ys, label=label)  # type: ignore[attr-defined]


def plot_runs(results: Mapping[str, RunResult], out_dir: Path, bin_s: float = 1.0) -> list[Path]:
    """Write ``ttft_cdf.png``, ``latency_cdf.png``, ``hit_rate.png``, ``throughput.png`` and
    ``load_per_worker.png`` (one panel per run) into ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fname, attr, title in (
        ("ttft_cdf.png", "ttft_s", "TTFT CDF"),
        ("latency_cdf.png", "e2e_s", "E2E latency CDF"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, res in results.items():
            _cdf(ax, [getattr(r, attr) for r in res.records if r.ok and getattr(r, attr) is not None], name)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=90)
        plt.close(fig)
        paths.append(out_dir / fname)
    paths.append(_plot_over_time(results, out_dir, bin_s, plt))
    paths.append(_plot_load(results, out_dir, bin_s, plt))
    return paths


def _bins(records: Sequence[RequestRecord], bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    ends = np.asarray([r.start_s + r.e2e_s for r in records if r.ok])
    if ends.size == 0:
        return np.zeros(0), np.zeros(0, dtype=int)
    idx = (ends // bin_s).astype(int)
    return ends, idx


def _plot_over_time(results: Mapping[str, RunResult], out_dir: Path, bin_s: float, plt: object) -> Path:
    fig, (ax_hit, ax_tp) = plt.subplots(1, 2, figsize=(11, 4))  # type: ignore[attr-defined]
    for name, res in results.items():
        ok = [r for r in res.records if r.ok]
        _, idx = _bins(ok, bin_s)
        if idx.size == 0:
            continue
        n = int(idx.max()) + 1
        cached = np.bincount(idx, weights=[r.cached_tokens for r in ok], minlength=n)
        prompt = np.bincount(idx, weights=[r.prompt_tokens for r in ok], minlength=n)
        t = np.arange(n) * bin_s
        ax_hit.plot(t, np.divide(cached, prompt, out=np.zeros(n), where=prompt > 0), label=name)
        ax_tp.plot(t, np.bincount(idx, minlength=n) / bin_s, label=name)
    ax_hit.set_title("cache hit rate over time")
    ax_hit.set_xlabel("s")
    ax_tp.set_title("completed requests/s")
    ax_tp.set_xlabel("s")
    for ax in (ax_hit, ax_tp):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = out_dir / "hit_rate_throughput.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)  # type: ignore[attr-defined]
    return path


def _plot_load(results: Mapping[str, RunResult], out_dir: Path, bin_s: float, plt: object) -> Path:
    fig, axes = plt.subplots(1, max(1, len(results)), figsize=(5 * max(1, len(results)), 4), squeeze=False)  # type: ignore[attr-defined]
    for ax, (name, res) in zip(axes[0], results.items(), strict=False):
        ok = [r for r in res.records if r.ok and r.worker]
        _, idx = _bins(ok, bin_s)
        if idx.size:
            n = int(idx.max()) + 1
            for worker in sorted({r.worker for r in ok if r.worker}):
                mask = np.asarray([r.worker == worker for r in ok])
                ax.plot(np.arange(n) * bin_s, np.bincount(idx[mask], minlength=n) / bin_s, label=worker)
        ax.set_title(f"load per worker: {name}")
        ax.set_xlabel("s")
        ax.set_ylabel("requests/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "load_per_worker.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)  # type: ignore[attr-defined]
    return path


def write_report(
    results: Mapping[str, RunResult],
    out_dir: Path,
    title: str,
    baseline: str | None = None,
    notes: Sequence[str] = (),
) -> Path:
    """Write ``report.md`` (table, notes, plots) and the plots into ``out_dir``; returns the report path."""
    summaries = {name: summarize(res) for name, res in results.items()}
    plots = plot_runs(results, out_dir)
    body = [f"# {title}", "", markdown_table(summaries, baseline), *[f"- {n}" for n in notes], ""]
    body += [f"![{p.stem}]({p.name})" for p in plots]
    path = out_dir / "report.md"
    path.write_text("\n".join(body) + "\n", encoding="utf-8")
    return path
