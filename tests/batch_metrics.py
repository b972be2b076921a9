"""`asr_batch_size` as /metrics shows it, by priority: what the step-batching test and
bench/realtime_steps.py read."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class BatchSizes:
    count: float = 0.0  # engine calls or decode steps observed
    total: float = 0.0  # jobs in them, summed
    single: float = 0.0  # those that carried one job

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


def batch_sizes(url: str) -> dict[str, BatchSizes]:
    """priority -> its asr_batch_size observations."""
    out: dict[str, BatchSizes] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        if family.name != "asr_batch_size":
            continue
        for s in family.samples:
            entry = out.setdefault(s.labels["priority"], BatchSizes())
            if s.name == "asr_batch_size_count":
                entry.count = s.value
            elif s.name == "asr_batch_size_sum":
                entry.total = s.value
            elif s.name == "asr_batch_size_bucket" and float(s.labels["le"]) == 1.0:
                entry.single = s.value
    return out
