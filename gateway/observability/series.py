"""Labelled counters and histograms cheap enough to update on every request, exposed at scrape time.
Compiled with mypyc (``docs/development.md``: what that rules out).

``prometheus_client``'s children take a lock and run interpreted code per update: a histogram ``observe``
walks its bounds in Python, ~12k instructions, and a request made three of them plus a counter increment.
Here an update is a dict lookup and, for a histogram, one ``bisect`` over the bounds and two additions (this
module is compiled with the request path, ``kvgate_core.native``). The gateway updates them from its event
loop only. A scrape copies each series' figures (a list copy, atomic under the GIL), so one scrape can
only see a request counted in one figure and not yet in another, never a corrupt value. What they expose
is what ``prometheus_client``'s own types expose (``_total``; ``_bucket`` with ``le``, ``_sum``, ``_count``),
without the ``_created`` series.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import cast

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_go_float = cast("Callable[[float], str]", floatToGoString)  # how prometheus_client writes ``le`` values


class HistogramSeries:
    """One label set's bucket counts (``counts[i]``: the values in bucket ``i`` alone; the last is +Inf)
    and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value: Prometheus's ``le``
        self.total += value


class CounterSeries:
    """One label set's count."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class LabelledHistogram(Collector):
    """A histogram family: ``labels(*values)`` gives the series to ``observe`` (kept; look it up once)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]):
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds != sorted(set(bounds)) or bounds[-1] == float("inf"):
            raise ValueError(f"{name}: buckets must be distinct finite bounds (+Inf is implied)")
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self._bounds = bounds
        self._les = [_go_float(b) for b in bounds] + ["+Inf"]
        self._series: dict[tuple[str, ...], HistogramSeries] = {}

    def labels(self, *values: str) -> HistogramSeries:
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values!r}")
            series = self._series[values] = HistogramSeries(self._bounds)
        return series

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in list(self._series.items()):
            counts, total = list(series.counts), series.total
            cumulative, buckets = 0, []
            for le, count in zip(self._les, counts, strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            family.add_metric(list(values), buckets, total)
        yield family


class LabelledCounter(Collector):
    """A counter family (exposed as ``{name}_total``): ``labels(*values)`` gives the series to ``inc``."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]):
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self._series: dict[tuple[str, ...], CounterSeries] = {}

    def labels(self, *values: str) -> CounterSeries:
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values!r}")
            series = self._series[values] = CounterSeries()
        return series

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in list(self._series.items()):
            family.add_metric(list(values), series.value)
        yield family
