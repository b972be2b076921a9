"""Uploads whose clients leave stop; the decoded audio that uploads hold is bounded by
MAX_PENDING_AUDIO_SECONDS (issue 19). Figures: bench/uploads.py, docs/RELIABILITY.md."""

from __future__ import annotations

import io
import struct
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

import audio_files
import speech
from helpers import whisper_settings
from proc import ServerProcess
from qwen3_asr_server.api import uploads
from qwen3_asr_server.api.error_table import http_status
from qwen3_asr_server.app import create_app
from qwen3_asr_server.audio.budget import AudioBudget
from qwen3_asr_server.audio.decode import decode_audio, probe_seconds
from qwen3_asr_server.errors import TooLargeError, UnavailableError
from server import live_server
from upload_load import idle, leave_early, many_big, metric, quiet_flac, vm

WHISPER_PROCESS = {"MODEL_ID": "whisper-tiny.en", "LOG_LEVEL": "WARNING", "PRELOAD": "true"}


# -- the budget itself ---------------------------------------------------------------------
def test_budget_reserves_refuses_with_retry_after_and_releases_once() -> None:
    budget = AudioBudget(100)
    first = budget.reserve(60)
    with pytest.raises(UnavailableError) as refused:
        budget.reserve(50)
    assert http_status(refused.value) == 503 and refused.value.code == "audio_budget_full"
    assert refused.value.retry_after is not None and refused.value.retry_after >= 1
    assert budget.in_use == 60 and budget.refused == 1
    second = budget.reserve(40)
    assert budget.full
    with pytest.raises(UnavailableError):
        budget.check_room()
    first.release()
    first.release()  # a second release gives nothing back twice
    assert budget.in_use == 40
    second.grow_to(90)  # the header said 40, the decoded audio is 90
    assert budget.in_use == 90
    third = budget.reserve(5)
    with pytest.raises(UnavailableError):
        second.grow_to(99)
    assert budget.in_use == 95 and second.seconds == 90  # kept what it had
    second.release()
    third.release()
    assert budget.in_use == 0


def test_audio_longer_than_the_whole_budget_is_413_not_a_retry() -> None:
    with pytest.raises(TooLargeError, match="MAX_PENDING_AUDIO_SECONDS"):
        AudioBudget(100).reserve(101)


@pytest.mark.parametrize(
    "make",
    [
        lambda: audio_files.wav_bytes(7.0),
        lambda: audio_files.encode(audio_files.tone(7.0), 16000, "FLAC"),
        lambda: audio_files.encode(audio_files.tone(7.0), 16000, "MP3"),
        lambda: audio_files.av_bytes("mp4", "aac", seconds=7.0),
        lambda: audio_files.av_bytes("webm", "libopus", seconds=7.0),
    ],
    ids=["wav", "flac", "mp3", "m4a", "webm"],
)
def test_the_duration_comes_from_the_header_without_decoding(make) -> None:  # type: ignore[no-untyped-def]
    seconds = probe_seconds(make())
    assert seconds is not None and seconds == pytest.approx(7.0, abs=0.05)


def test_probe_of_raw_pcm_and_of_garbage() -> None:
    assert probe_seconds(b"\0" * 64000, content_type="audio/pcm") == 2.0
    assert probe_seconds(b"not audio at all" * 100) is None


# -- a real server: released however the request ends -------------------------------------
def wav(seconds: float) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(seconds * 16000), np.float32), 16000, format="WAV")
    return buf.getvalue()


def test_the_budget_is_released_however_the_request_ends(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    clip = speech.path("long_2min.wav").read_bytes()
    app = create_app(whisper_settings(max_pending_audio_seconds=200))
    with live_server(app) as server:
        url = server.url + "/v1/audio/transcriptions"

        def in_use() -> float:
            return float(server.get("/health").json()["pending_audio_seconds"])

        # a plain answer
        assert httpx.post(url, files={"file": ("a.wav", wav(3))}, timeout=60).status_code == 200
        assert in_use() == 0
        # not audio: refused by the decoder after its bytes were read
        bad = httpx.post(url, files={"file": ("a.wav", b"RIFF....junk")}, timeout=60)
        assert bad.status_code == 400 and in_use() == 0
        # SSE, read to the end
        with httpx.stream(
            "POST", url, files={"file": ("a.wav", clip)}, data={"stream": "true"}, timeout=120
        ) as r:
            assert r.status_code == 200
            assert in_use() == pytest.approx(121.7, abs=0.1)  # held while it streams
            lines = [line for line in r.iter_lines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]"
        assert in_use() == 0
        # SSE whose client leaves after the first event
        with httpx.stream(
            "POST", url, files={"file": ("a.wav", clip)}, data={"stream": "true"}, timeout=120
        ) as r:
            next(line for line in r.iter_lines() if line.startswith("data:"))
        deadline = time.monotonic() + 10
        while in_use() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert in_use() == 0
        # a plain upload whose client leaves
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url, files={"file": ("a.wav", clip)}, timeout=1.0)
        deadline = time.monotonic() + 10
        while in_use() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert in_use() == 0
        # two 2-minute uploads at once do not fit in 200 s: the second waits for nobody
        first = threading.Thread(
            target=lambda: httpx.post(url, files={"file": ("a.wav", clip)}, timeout=120)
        )
        first.start()
        deadline = time.monotonic() + 10
        while not in_use() and time.monotonic() < deadline:
            time.sleep(0.01)
        second = httpx.post(url, files={"file": ("a.wav", clip)}, timeout=120)
        first.join()
        assert second.status_code == 503, second.text
        assert second.json()["error"]["code"] == "audio_budget_full"
        assert int(second.headers["retry-after"]) >= 1
        assert in_use() == 0
        assert metric(server.url, "asr_audio_budget_refusals_total") == 1
        # a container whose header gives no duration is measured after decoding
        monkeypatch.setattr(uploads, "probe_seconds", lambda *a, **k: None)
        held = server.ctx.budget.reserve(150)  # another request's share
        late = httpx.post(url, files={"file": ("a.wav", wav(60))}, timeout=60)
        assert late.status_code == 503 and late.json()["error"]["code"] == "audio_budget_full"
        held.release()
        assert httpx.post(url, files={"file": ("a.wav", wav(60))}, timeout=60).status_code == 200
        assert in_use() == 0


def test_health_and_metrics_show_the_budget() -> None:
    app = create_app(whisper_settings(max_pending_audio_seconds=1234))
    with live_server(app) as server:
        held = server.ctx.budget.reserve(100.5)
        try:
            body = server.get("/health").json()
            assert body["pending_audio_seconds"] == 100.5
            assert body["max_pending_audio_seconds"] == 1234
            assert metric(server.url, "asr_pending_audio_seconds") == 100.5
            assert metric(server.url, "asr_pending_audio_limit_seconds") == 1234
        finally:
            held.release()
        assert metric(server.url, "asr_pending_audio_seconds") == 0


# -- real processes under load --------------------------------------------------------------
@pytest.mark.slow
def test_uploads_whose_clients_leave_stop_working() -> None:
    """3 uploads of the 2-minute clip whose clients leave after 2 s: at most the segment in
    flight for each runs after they left, and the server is idle soon after (the goal, 2 s, is
    met with room by bench/uploads.py: 0.8-1.4 s; here only the work started after they
    left is counted: a loaded machine takes seconds to finish the batch in flight, which
    cannot be interrupted). Before: 10 segments in 3 engine calls after they left,
    idle after 7-10 s."""
    server = ServerProcess(WHISPER_PROCESS)
    try:
        server.wait_healthy(60)
        result = leave_early(server.url, clients=3, patience=2.0)
        assert result["clients_left"] == 3, result  # all three still uploading when they left
        assert result["segments_after_leaving"] <= 3, result
        # Idle once the call in flight ends: how soon is the machine's speed (5.5 s was seen
        # beside stress-ng with nothing started after they left), so the proof is the count
        # above plus reaching idle at all; the seconds are bench/uploads.py's figure.
        assert result["idle_after_s"] < 120, result
        assert idle(server.url)
        body = httpx.get(server.url + "/health", timeout=10).json()
        assert body["pending_audio_seconds"] == 0
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        # the cancelled requests are counted as 499 (client closed request)
        assert 'route="/v1/audio/transcriptions",status="499"} 3.0' in metrics
    finally:
        server.stop()


@pytest.mark.slow
def test_twelve_one_hour_uploads_stay_within_the_budget() -> None:
    """12 concurrent 1-hour uploads with a 2-hour budget: two are served, ten get 503 with
    Retry-After, and the peak RSS stays under the budget + the model (its peak while it
    transcribes) + 300 MB (before: 12 x 230 MB of float32 held at once, 3.2 GB)."""
    budget_s = 7200
    data = quiet_flac(3600, level=0.0)  # digital silence: the same decoded size, a tiny upload
    server = ServerProcess({**WHISPER_PROCESS, "MAX_PENDING_AUDIO_SECONDS": str(budget_s)})
    try:
        server.wait_healthy(60)
        # the model's own peak while it works (whisper's batched pipeline: ~+250 MB)
        warm = httpx.post(
            server.url + "/v1/audio/transcriptions",
            files={"file": ("long.wav", speech.path("long_2min.wav").read_bytes())},
            timeout=120,
        )
        assert warm.status_code == 200
        model_mb = vm(server.proc.pid, "VmHWM")
        result = many_big(server.url, server.proc.pid, data, clients=12)
        assert result["codes"] == [200] * 2 + [503] * 10, result
        assert result["retry_after"] and all(int(v) >= 1 for v in result["retry_after"])  # type: ignore[union-attr]
        budget_mb = budget_s * 16000 * 4 / 2**20
        assert result["rss_peak_mb"] < model_mb + budget_mb + 300, result  # type: ignore[operator]
        assert httpx.get(server.url + "/health", timeout=10).json()["pending_audio_seconds"] == 0
    finally:
        server.stop()


def test_a_file_longer_than_max_audio_seconds_is_413_even_when_the_budget_is_busy() -> None:
    """A retry could never help it: 413 from the header, not the budget's 503."""
    app = create_app(whisper_settings(max_pending_audio_seconds=100, max_audio_seconds=5))
    with live_server(app) as server:
        held = server.ctx.budget.reserve(98)
        try:
            r = httpx.post(
                server.url + "/v1/audio/transcriptions", files={"file": ("a.wav", wav(10))}
            )
        finally:
            held.release()
    assert r.status_code == 413 and "MAX_AUDIO_SECONDS" in r.text


def test_verbose_json_without_a_vad_keeps_the_documented_stand_in(
    qwen_settings,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """Silero VAD is an optional extra: without it no_speech_prob is 0.0, not a 500."""
    from qwen3_asr_server.audio import vad
    from qwen3_asr_server.errors import ModelLoadError

    def absent() -> None:
        raise ModelLoadError("Silero VAD is not installed")

    monkeypatch.setattr(vad, "silero_onnx_path", absent)
    app = create_app(qwen_settings(segment_vad=False))
    with live_server(app) as server:
        r = httpx.post(
            server.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", speech.path("sentence_02.wav").read_bytes())},
            data={"response_format": "verbose_json"},
            timeout=120,
        )
    assert r.status_code == 200, r.text
    assert all(s["no_speech_prob"] == 0.0 for s in r.json()["segments"])


# -- a header that lies (issue 29) -----------------------------------------------------------
def lying_webm(seconds: float, header_seconds: float) -> bytes:
    """Opus in WebM whose Segment Duration element says `header_seconds` while the stream
    holds `seconds` (FFmpeg reports the header's duration and decodes the whole stream)."""
    data = bytearray(audio_files.av_bytes("webm", "libopus", seconds=seconds))
    at = data.find(b"\x44\x89\x88")  # Duration, an 8-byte float in TimecodeScale units (ms)
    assert at > 0
    data[at + 3 : at + 11] = struct.pack(">d", header_seconds * 1000)
    return bytes(data)


def test_a_lying_header_cannot_decode_past_the_budget() -> None:
    data = lying_webm(60.0, header_seconds=1.0)
    assert probe_seconds(data) == pytest.approx(1.0)
    budget = AudioBudget(30)
    other = budget.reserve(10)  # another request's share
    mine = budget.reserve(1.0)  # what the header says
    peak: list[float] = []

    def grow(seconds: float) -> None:
        mine.grow_to(seconds)
        peak.append(budget.in_use)

    with pytest.raises(UnavailableError) as refused:  # it might fit once others leave
        decode_audio(data, filename="a.webm", max_seconds=3600, reserve=grow)
    assert refused.value.code == "audio_budget_full"
    assert max(peak) <= 30 and 19 <= mine.seconds <= 20  # stopped at the first block past
    mine.release()
    other.release()
    mine = budget.reserve(1.0)
    with pytest.raises(TooLargeError, match="at least 30 s"):  # longer than the whole budget
        decode_audio(data, filename="a.webm", max_seconds=3600, reserve=mine.grow_to)
    assert 29 <= mine.seconds <= 30 and budget.in_use == mine.seconds
    mine.release()
    assert budget.in_use == 0


def test_an_upload_whose_header_lies_is_refused_at_the_budget() -> None:
    data = lying_webm(60.0, header_seconds=1.0)
    app = create_app(whisper_settings(max_pending_audio_seconds=30))
    with live_server(app) as server:
        url = server.url + "/v1/audio/transcriptions"
        held = server.ctx.budget.reserve(10)
        try:
            r = httpx.post(url, files={"file": ("a.webm", data)}, timeout=60)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "audio_budget_full"
            assert server.get("/health").json()["pending_audio_seconds"] == 10
        finally:
            held.release()
        r = httpx.post(url, files={"file": ("a.webm", data)}, timeout=60)
        assert r.status_code == 413 and "MAX_PENDING_AUDIO_SECONDS" in r.text, r.text
        assert server.get("/health").json()["pending_audio_seconds"] == 0
        assert server.ctx.budget.refused == 1
