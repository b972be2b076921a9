"""Prometheus metrics (prometheus-client), one registry per app.

Histograms and counters are observed where things happen (middleware, scheduler, service,
streaming sessions); everything that is state (queue depth, model loaded, loads, sessions,
worker restarts) is read at scrape time by `StateCollector`, so scraping only reads state,
never drives it, and never imports torch.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..audio.vad import VADStats
from ..engines.status import LATENCY_BOUNDS, HistogramSnapshot
from .histograms import GCPauses, add_snapshot

PRIORITY_NAMES = {0: "final", 1: "partial", 2: "batch"}
LATENCY_BUCKETS = LATENCY_BOUNDS


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "asr_http_requests",
            "HTTP requests by route and status.",
            ["route", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "asr_http_request_duration_seconds",
            "HTTP request duration by route.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "asr_queue_wait_seconds",
            "Time a job waited in the inference queue, by priority.",
            ["priority"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "asr_batch_size",
            "Jobs per engine call, or rows per decode step (Qwen's step loop), by the most "
            "urgent priority in it.",
            ["priority"],
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.inference_seconds = Counter(
            "asr_inference_seconds",
            "Seconds spent inside the engine, by engine and priority.",
            ["engine", "priority"],
            registry=r,
        )
        self.audio_seconds = Counter(
            "asr_audio_seconds",
            "Seconds of audio transcribed, by engine and priority.",
            ["engine", "priority"],
            registry=r,
        )
        self.real_time_factor = Histogram(
            "asr_real_time_factor",
            "Engine seconds per audio second of each job.",
            ["engine"],
            buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
            registry=r,
        )
        self.final_latency = Histogram(
            "asr_stream_final_latency_seconds",
            "Streaming: end of speech (the closing silence complete) to the final sent, by route.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stream_lag = Histogram(
            "asr_stream_lag_seconds",
            "Streaming: each audio message's processing, from the session taking it (waiting "
            "for room included) to the end of its voice detection and turn handling. Messages "
            "the session has not taken yet wait in the socket and are not counted.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

        self.gc_pauses = GCPauses()
        r.register(self.gc_pauses)

    def gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        """For gc.callbacks (installed by the app's lifespan): time each collection."""
        self.gc_pauses.callback(phase, info)

    def observe_job(self, priority: int, waited: float) -> None:
        """Called by the scheduler's worker thread when a job starts."""
        self.queue_wait.labels(PRIORITY_NAMES.get(priority, str(priority))).observe(waited)

    def observe_batch(self, priority: int, jobs: int) -> None:
        """An engine call of `jobs` jobs, or a decode step of `jobs` rows."""
        self.batch_size.labels(PRIORITY_NAMES.get(priority, str(priority))).observe(jobs)

    def observe_inference(
        self, engine: str, priority: int, engine_seconds: float, audio_seconds: float
    ) -> None:
        name = PRIORITY_NAMES.get(priority, str(priority))
        self.inference_seconds.labels(engine, name).inc(engine_seconds)
        self.audio_seconds.labels(engine, name).inc(audio_seconds)
        if audio_seconds > 0:
            self.real_time_factor.labels(engine).observe(engine_seconds / audio_seconds)

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    def watch(self, state: Callable[[], dict[str, Any]]) -> None:
        """Report the app's state (see StateCollector) at every scrape."""
        self.registry.register(StateCollector(state))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class StateCollector(Collector):
    """Reads the manager, scheduler, sessions and worker at scrape time."""

    def __init__(self, state: Callable[[], dict[str, Any]]) -> None:
        self._state = state

    def describe(self) -> list[Metric]:
        return []  # the metrics are only known at scrape time

    def collect(self) -> Iterator[Metric]:
        s = self._state()
        gauges = {
            "asr_model_loaded": ("1 when the model is loaded.", s["model_loaded"]),
            "asr_model_load_seconds": ("Duration of the last model load.", s["load_seconds"]),
            "asr_queue_depth": ("Jobs waiting in the inference queue.", s["queue_depth"]),
            "asr_stream_max_lag_seconds": (
                "The largest lag of a live stream now: seconds since the audio it is processing "
                "arrived (0 when every stream is up to date).",
                s["stream_max_lag"],
            ),
            "asr_stream_pending_final_seconds": (
                "Seconds of streamed audio committed and waiting for its final, all streams.",
                s["stream_pending_final_seconds"],
            ),
            "asr_pending_audio_seconds": (
                "Seconds of decoded audio held by uploads (MAX_PENDING_AUDIO_SECONDS budget).",
                s["pending_audio_seconds"],
            ),
            "asr_gc_frozen_objects": (
                "Objects the garbage collector no longer scans (frozen after start-up).",
                gc.get_freeze_count(),
            ),
            "asr_pending_audio_limit_seconds": (
                "MAX_PENDING_AUDIO_SECONDS.",
                s["pending_audio_limit_seconds"],
            ),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=float(value))
        counters = {
            "asr_model_loads": ("Model loads.", s["loads"]),
            "asr_model_unloads": ("Model unloads (idle or shutdown).", s["unloads"]),
            "asr_audio_budget_refusals": (
                "Uploads answered 503 because the decoded-audio budget was spent.",
                s["audio_budget_refusals"],
            ),
            "asr_worker_restarts": (
                "Inference worker processes that died or were killed.",
                s["worker_restarts"],
            ),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=float(value))
        yield from _stream_gauges(s["stream_routes"])
        yield from _vad_metrics(s["vad"])
        yield from _backend_metrics(s.get("backends", []))
        yield from _backend_histograms(s.get("backend_slot_wait"), s.get("backend_latency", ()))
        yield from _download_metrics(s.get("download"), bool(s.get("fallback")))


def _stream_gauges(routes: dict[str, tuple[int, int]]) -> Iterator[Metric]:
    """Live streams and their seats by route (summed over route: every stream, every seat)."""
    streams = GaugeMetricFamily(
        "asr_streaming_sessions",
        "Streaming sessions open (live streams; a stereo call is one), by route.",
        labels=["route"],
    )
    seats = GaugeMetricFamily(
        "asr_streaming_seats",
        "Seats of WS_MAX_SESSIONS taken: one per channel of every live stream, by route.",
        labels=["route"],
    )
    for route, (count, taken) in sorted(routes.items()):
        streams.add_metric([route], float(count))
        seats.add_metric([route], float(taken))
    yield from (streams, seats)


def _download_metrics(download: dict[str, Any] | None, fallback: bool) -> Iterator[Metric]:
    """A hub model fetched in the background, and the announced fallback to the bundled one."""
    yield GaugeMetricFamily(
        "asr_model_fallback",
        "1 when the bundled model serves because the default one is unavailable.",
        value=float(fallback),
    )
    if download is None:
        return
    gauges = {
        "asr_model_download_bytes": ("Bytes of the model download on disk.", "bytes_done"),
        "asr_model_download_total_bytes": ("Bytes of the whole model download.", "bytes_total"),
        "asr_model_download_eta_seconds": ("Estimated seconds left (-1: unknown).", "eta_s"),
    }
    for name, (doc, key) in gauges.items():
        value = download[key]
        yield GaugeMetricFamily(name, doc, value=float(-1 if value is None else value))
    yield GaugeMetricFamily(
        "asr_model_download_done",
        "1 when the download is complete.",
        value=float(download["state"] == "done"),
    )
    yield CounterMetricFamily(
        "asr_model_download_failures",
        "Failed download attempts.",
        value=float(download["failures"]),
    )


def _backend_metrics(backends: list[dict[str, Any]]) -> Iterator[Metric]:
    """ENGINE=remote: one series per backend URL."""
    if not backends:
        return
    up = GaugeMetricFamily("asr_backend_up", "1 when the remote backend is up.", labels=["backend"])
    inflight = GaugeMetricFamily(
        "asr_backend_inflight", "Jobs in flight on the remote backend.", labels=["backend"]
    )
    requests = CounterMetricFamily(
        "asr_backend_requests", "Jobs the remote backend answered.", labels=["backend"]
    )
    errors = CounterMetricFamily(
        "asr_backend_errors", "Jobs the remote backend failed.", labels=["backend"]
    )
    seconds = CounterMetricFamily(
        "asr_backend_request_seconds",
        "Total seconds of answered jobs (divide by asr_backend_requests for the mean latency).",
        labels=["backend"],
    )
    for b in backends:
        label = [b["url"]]
        up.add_metric(label, float(b["state"] == "up"))
        inflight.add_metric(label, float(b["inflight"]))
        requests.add_metric(label, float(b["requests"]))
        errors.add_metric(label, float(b["errors"]))
        seconds.add_metric(label, float(b["seconds"]))
    yield from (up, inflight, requests, errors, seconds)


def _vad_metrics(vad: VADStats) -> Iterator[Metric]:
    """The streaming sessions' voice detection, batched across sessions (`audio/vad.py`)."""
    counters = {
        "asr_vad_seconds": ("Thread seconds spent in streaming voice detection.", vad.seconds),
        "asr_vad_frames": ("32 ms frames through streaming voice detection.", vad.frames),
        "asr_vad_calls": (
            "Silero model calls of streaming voice detection (frames / calls: how many "
            "streams share one call).",
            vad.calls,
        ),
    }
    for name, (doc, value) in counters.items():
        yield CounterMetricFamily(name, doc, value=float(value))
    yield GaugeMetricFamily(
        "asr_vad_wait_seconds",
        "How long the oldest voice detection request waiting or running has waited.",
        value=vad.oldest_wait,
    )


def _backend_histograms(
    slot_wait: HistogramSnapshot | None, latency: tuple[tuple[str, HistogramSnapshot], ...]
) -> Iterator[Metric]:
    """ENGINE=remote: the time jobs waited for a backend slot (the front's queueing for the
    backends), and each backend's answer time (its own queueing and inference)."""
    if slot_wait is None:
        return
    wait = HistogramMetricFamily(
        "asr_backend_slot_wait_seconds",
        "Time a job waited for a free backend slot (every usable backend full).",
        labels=[],
    )
    add_snapshot(wait, [], slot_wait)
    answer = HistogramMetricFamily(
        "asr_backend_latency_seconds",
        "Time from a job sent to a remote backend to its answer (the backend's queueing "
        "and inference).",
        labels=["backend"],
    )
    for url, snap in latency:
        add_snapshot(answer, [url], snap)
    yield from (wait, answer)
