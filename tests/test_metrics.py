"""GET /metrics: Prometheus exposition whose counters move with real traffic."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

import speech
from helpers import whisper_settings
from proc import ServerProcess
from qwen3_asr_server.app import create_app
from server import free_port, live_server
from streaming_client import load, open_ws, pcm16

pytestmark = pytest.mark.slow
AUTH = {"Authorization": "Bearer k3y"}


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(url + "/metrics", headers=AUTH, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return float(samples.get((name, tuple(sorted(labels.items()))), 0.0))


def test_counters_move_with_uploads_and_streams() -> None:
    with live_server(create_app(whisper_settings(api_key="k3y"))) as srv:
        assert httpx.get(srv.url + "/metrics", timeout=10).status_code == 401
        before = scrape(srv.url)
        assert value(before, "asr_model_loaded") == 0
        response = httpx.post(
            srv.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", speech.path("sentence_01.wav").read_bytes())},
            headers=AUTH,
            timeout=60,
        )
        assert response.status_code == 200
        with open_ws(srv.url, api_key="k3y") as ws:
            json.loads(ws.recv(timeout=10))
            ws.send(pcm16(np.concatenate([load("sentence_02.wav"), np.zeros(16000, np.float32)])))
            while not json.loads(ws.recv(timeout=30)).get("is_final"):
                pass
        after = scrape(srv.url)
    route = "/v1/audio/transcriptions"
    assert value(after, "asr_http_requests_total", route=route, status="200") == 1
    assert value(after, "asr_http_request_duration_seconds_count", route=route) == 1
    assert value(after, "asr_model_loaded") == 1 and value(after, "asr_model_loads_total") == 1
    assert value(after, "asr_model_load_seconds") > 0
    assert value(after, "asr_queue_wait_seconds_count", priority="batch") >= 1
    assert value(after, "asr_queue_wait_seconds_count", priority="final") >= 1
    assert value(after, "asr_audio_seconds_total", engine="whisper", priority="batch") > 2
    assert value(after, "asr_inference_seconds_total", engine="whisper", priority="final") > 0
    assert value(after, "asr_real_time_factor_count", engine="whisper") >= 2
    batches = sum(value(after, "asr_batch_size_count", priority=p) for p in ("batch", "final"))
    assert batches >= 2
    assert value(after, "asr_stream_final_latency_seconds_count", route="/ws/transcribe") >= 1
    assert "asr_streaming_sessions" in {name for name, _ in after}
    assert value(after, "asr_worker_restarts_total") == 0


LIVE_ROUTES = ("/ws/transcribe", "/v1/listen", "/v1/realtime")


def test_live_streams_are_counted_and_timed_by_route() -> None:
    """Issue 52: a /ws/transcribe stream and a /v1/listen stream open at once are a sample
    each of the sessions and seats gauges (/v1/realtime's at 0, every sum the old total),
    and each one's final is observed under its own route. A WebSocket stream is not an HTTP
    request: neither route shows in asr_http_requests."""
    audio = pcm16(np.concatenate([load("sentence_02.wav"), np.zeros(16000, np.float32)]))
    with live_server(create_app(whisper_settings(api_key="k3y"))) as srv:
        srv_url = srv.url
        listen_url = srv_url.replace("http://", "ws://") + "/v1/listen?encoding=linear16"
        dg = {"Authorization": "Token k3y"}
        with (
            open_ws(srv_url, api_key="k3y") as ws,
            connect(listen_url, additional_headers=dg) as dg_ws,
        ):
            assert json.loads(ws.recv(timeout=10))["status"] == "connected"
            both = scrape(srv_url)
            for name in ("asr_streaming_sessions", "asr_streaming_seats"):
                by_route = {r: value(both, name, route=r) for r in LIVE_ROUTES}
                assert by_route == {"/ws/transcribe": 1, "/v1/listen": 1, "/v1/realtime": 0}
            ws.send(audio)
            dg_ws.send(audio)
            while not json.loads(ws.recv(timeout=30)).get("is_final"):
                pass
            while not json.loads(dg_ws.recv(timeout=30)).get("speech_final"):
                pass

            # (a final is observed just after it is queued to its client: poll a little)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                samples = scrape(srv_url)
                counts = [
                    value(samples, "asr_stream_final_latency_seconds_count", route=route)
                    for route in LIVE_ROUTES[:2]
                ]
                if min(counts) >= 1:
                    break
            assert min(counts) >= 1, counts
        after = scrape(srv_url)
    assert value(after, "asr_stream_final_latency_seconds_count", route="/v1/realtime") == 0
    http_routes = {
        dict(labels).get("route") for name, labels in after if name.startswith("asr_http")
    }
    assert not http_routes & set(LIVE_ROUTES), http_routes


def test_scraping_never_imports_torch(tiny_qwen_dir: Path) -> None:
    proc = ServerProcess({"MODEL_ID": str(tiny_qwen_dir), "API_KEY": "k3y"})
    try:
        proc.wait_healthy()
        samples = scrape(proc.url)
        assert value(samples, "asr_model_loaded") == 0
        assert not proc.torch_loaded()
    finally:
        proc.stop()


def test_collections_are_timed_while_the_app_runs_and_no_longer_after() -> None:
    """/metrics times every garbage collection (the pauses that stop the event loop), from
    the lifespan's start to its end: the callback does not outlive its app."""
    import gc

    app = create_app(whisper_settings())
    with live_server(app) as srv:
        callbacks = len(gc.callbacks)
        gc.collect()
        after = scrape(srv.url)
        assert value(after, "asr_gc_pause_seconds_count", generation="2") >= 1
        assert value(after, "asr_gc_pause_seconds_sum", generation="2") > 0
        assert ("asr_gc_pause_seconds_count", (("generation", "0"),)) in after
    assert len(gc.callbacks) == callbacks - 1


def test_the_served_process_freezes_what_it_imported_at_start() -> None:
    """`python -m qwen3_asr_server` freezes its start-up objects (gen2 collections skip them,
    which shortened loop stalls from 90-160 ms to 20-60 ms under 100 streams)."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    front = ServerProcess({"ENGINE": "remote", "REMOTE_BACKENDS": dead, "API_KEY": "k3y"})
    try:
        front.wait_healthy()
        assert value(scrape(front.url), "asr_gc_frozen_objects") > 10_000
    finally:
        front.stop()


def test_engine_histograms_count_a_value_on_a_bound_in_that_bucket() -> None:
    """Prometheus buckets are `le`: a value equal to a bound belongs to it; above the last
    bound is +Inf only; the exposition's buckets are cumulative."""
    from prometheus_client.core import HistogramMetricFamily

    from qwen3_asr_server.engines.status import Buckets
    from qwen3_asr_server.runtime.histograms import add_snapshot

    buckets = Buckets(bounds=(0.1, 1))  # an int bound is spelt as prometheus_client does: 1.0
    for v in (0.1, 0.5, 1.0, 7.0):
        buckets.observe(v)
    snap = buckets.snapshot()
    assert snap.counts == (1, 2, 1) and snap.count == 4 and snap.total == 8.6
    family = HistogramMetricFamily("x_seconds", "x", labels=[])
    add_snapshot(family, [], snap)
    got = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert got[("x_seconds_bucket", "0.1")] == 1 and got[("x_seconds_bucket", "1.0")] == 3
    assert got[("x_seconds_bucket", "+Inf")] == 4 == got[("x_seconds_count", None)]
