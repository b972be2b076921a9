"""Histograms kept outside prometheus_client's own (`HistogramSnapshot`s, read at scrape
time) as metric families, and the garbage collector's pauses (`GCPauses`)."""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..engines.status import HistogramSnapshot


def add_snapshot(family: HistogramMetricFamily, labels: list[str], snap: HistogramSnapshot) -> None:
    """A histogram kept outside prometheus_client (its counts per bucket) as one labelled
    sample set of `family`: cumulative buckets, `le` spelt as prometheus_client spells it."""
    cumulative, running = [], 0
    for bound, count in zip((*snap.bounds, float("inf")), snap.counts, strict=True):
        running += count
        cumulative.append((floatToGoString(bound), float(running)))
    family.add_metric(labels, cumulative, sum_value=snap.total)


class GCPauses(Collector):
    """How long each garbage collection stopped the process, per generation. The callback
    takes no lock: a collection can start while this thread holds any lock (a scrape's), and
    only one collection runs at a time, so plain counters are safe; a scrape may read one
    collection late."""

    BOUNDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)

    def __init__(self) -> None:
        self._counts = [[0] * (len(self.BOUNDS) + 1) for _ in range(3)]
        self._sums = [0.0, 0.0, 0.0]
        self._started = 0.0

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info.get("generation")
        if self._started and generation in (0, 1, 2):
            pause = time.perf_counter() - self._started
            self._counts[generation][bisect.bisect_left(self.BOUNDS, pause)] += 1
            self._sums[generation] += pause

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "asr_gc_pause_seconds",
            "Python garbage collections by generation: how long each stopped the process "
            "(the event loop included).",
            labels=["generation"],
        )
        for g in range(3):
            snap = HistogramSnapshot(self.BOUNDS, tuple(self._counts[g]), self._sums[g])
            add_snapshot(family, [str(g)], snap)
        yield family
