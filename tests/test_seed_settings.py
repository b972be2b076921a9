"""A seed user's `.env` works unchanged: every setting the seed documented is honoured under
its own name, or refused at start with the reason. Nothing is silently dropped."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import srt
from pydantic import ValidationError

import speech
from proc import ServerProcess
from qwen3_asr_server.config import Settings
from qwen3_asr_server.outputs.subtitles import build_cues, cue_rules
from qwen3_asr_server.transcript import Segment, Word

# The seed's documented settings (its README's configuration tables and .env.example), with
# its example values. MODEL_ID is the bundled model here: the seed's 1.7B is not on disk.
SEED_ENV = {
    "PORT": "8100",
    "MODEL_ID": "whisper-tiny.en",
    "IDLE_TIMEOUT": "120",
    "REQUEST_TIMEOUT": "300",
    "LOG_LEVEL": "INFO",
    "WS_BUFFER_SIZE": "14400",
    "WS_OVERLAP_SIZE": "4800",
    "WS_WINDOW_MAX_S": "6.0",
    "WS_FLUSH_SILENCE_MS": "600",
    "ASR_USE_SERVER_VAD": "true",
    "FORCED_ALIGNER_ID": "Qwen/Qwen3-ForcedAligner-0.6B",
    "SUBTITLE_MAX_DURATION": "7.0",
    "SUBTITLE_PAUSE_THRESHOLD": "0.5",
    "SUBTITLE_MIN_DURATION": "0.833",
    "SUBTITLE_MIN_GAP": "0.083",
    "OPENAI_BASE_URL": "",
    "OPENAI_API_KEY": "",
    "TRANSLATE_MODEL": "gemma3:12b",
    "TRANSLATE_TEMPERATURE": "0.3",
    "TRANSLATE_SRT_TEMPERATURE": "0.1",
    "SSE_CHUNK_SECONDS": "5",
    "SSE_OVERLAP_SECONDS": "1",
    "QUANTIZE": "",
    "USE_CUDA_GRAPHS": "false",
    "DUAL_MODEL": "false",
    "FAST_MODEL_ID": "Qwen/Qwen3-ASR-0.6B",
    "USE_SPECULATIVE": "false",
    "USE_VLLM": "false",
    "USE_CAUSAL_ENCODER": "false",
    "ONNX_ENCODER_PATH": "",
    "TRT_ENCODER_PATH": "",
    "GATEWAY_MODE": "false",
    "WORKER_HOST": "127.0.0.1",
    "WORKER_PORT": "8001",
    "NUMA_NODE": "0",
    "USE_GRANIAN": "false",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}

MIGRATING = Path(__file__).resolve().parents[1] / "docs" / "MIGRATING.md"


def settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(SEED_ENV))
def test_no_seed_name_is_silently_ignored(name: str) -> None:
    """Each is a setting (so pydantic reads and checks it) and MIGRATING.md says what it
    does here."""
    assert name.lower() in Settings.model_fields, f"{name} would be dropped by extra=ignore"
    assert f"`{name}`" in MIGRATING.read_text(), f"{name} is missing from docs/MIGRATING.md"


@pytest.mark.slow
def test_the_seed_env_file_starts_the_server(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in SEED_ENV.items()))
    server = ServerProcess({}, cwd=tmp_path)  # PORT from the environment wins over .env
    try:
        server.wait_healthy()
        response = httpx.post(
            server.url + "/v1/audio/transcriptions/stream",
            files={"file": ("a.wav", speech.path("three_sentences.wav").read_bytes())},
            timeout=120,
        )
        assert response.status_code == 200
        assert response.text.count('"chunk_index"') >= 2  # SSE_CHUNK_SECONDS=5: ~10 s clip
    finally:
        server.stop()
    output = server.output()
    for note in ("SSE_OVERLAP_SECONDS", "WORKER_HOST/WORKER_PORT", "WS_OVERLAP_SIZE"):
        assert note in output, output  # accepted, and the log says they have no effect


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("USE_SPECULATIVE", True, "not shown to help"),
        ("USE_CUDA_GRAPHS", True, "vLLM"),
        ("USE_VLLM", True, "ENGINE=remote"),
        ("USE_CAUSAL_ENCODER", True, "experimental"),
        ("USE_GRANIAN", True, "uvicorn"),
        ("ONNX_ENCODER_PATH", "/models/encoder.onnx", "ONNX"),
        ("TRT_ENCODER_PATH", "/models/encoder.trt", "TensorRT"),
        ("NUMA_NODE", 1, "numactl"),
        ("QUANTIZE", "fp8", r"compute capability 8\.9"),
    ],
)
def test_each_refused_setting_fails_at_start_with_its_reason(
    name: str, value: object, reason: str
) -> None:
    with pytest.raises(ValidationError, match=reason) as caught:
        settings(**{name.lower(): value})
    assert name in str(caught.value)


def test_a_quantize_value_outside_the_list_names_the_allowed_ones() -> None:
    with pytest.raises(ValidationError, match="'int8' or 'fp8'"):
        settings(quantize="int4")


@pytest.mark.slow
def test_a_refused_setting_stops_the_process_with_exit_2(tmp_path: Path) -> None:
    server = ServerProcess({"USE_VLLM": "true"}, cwd=tmp_path)
    server.proc.wait(30)
    assert server.proc.returncode == 2
    assert "USE_VLLM is not offered: superseded" in server.output()


def test_openai_names_are_the_translation_endpoint_and_ours_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://seed:11434/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "seed-key")
    seed = settings()
    assert (seed.translate_base_url, seed.translate_api_key) == ("http://seed:11434/v1", "seed-key")
    assert seed.translate_model == "gemma3:12b"  # the seed's default model
    assert any("gemma3:12b" in note for note in seed.notes())
    monkeypatch.setenv("TRANSLATE_BASE_URL", "http://ours:8000/v1")
    monkeypatch.setenv("TRANSLATE_MODEL", "ours")
    both = settings()
    assert (both.translate_base_url, both.translate_model) == ("http://ours:8000/v1", "ours")
    assert both.translate_api_key == "seed-key"  # ours not set: the seed's name counts
    assert "OPENAI_BASE_URL is ignored: TRANSLATE_BASE_URL is set and wins" in both.notes()


def test_ws_buffer_size_sets_the_partial_interval_unless_ours_is_set() -> None:
    assert settings(ws_buffer_size=14400).ws_partial_interval == pytest.approx(0.45)
    assert settings(ws_buffer_size=64000).ws_partial_interval == pytest.approx(2.0)
    both = settings(ws_buffer_size=64000, ws_partial_interval=0.8)
    assert both.ws_partial_interval == 0.8
    assert "WS_BUFFER_SIZE is ignored: WS_PARTIAL_INTERVAL is set and wins" in both.notes()


@pytest.mark.parametrize(
    ("value", "level"), [("TRACE", "TRACE"), ("warn", "WARNING"), ("FATAL", "CRITICAL")]
)
def test_the_seed_log_levels_are_accepted(value: str, level: str) -> None:
    assert settings(log_level=value).log_level == level


def test_an_unknown_log_level_is_refused_with_the_list() -> None:
    with pytest.raises(ValidationError, match="TRACE, DEBUG, INFO"):
        settings(log_level="LOUD")


def words(*spec: tuple[str, float, float]) -> list[Segment]:
    items = [Word(w, s, e) for w, s, e in spec]
    return [Segment(items[0].start, items[-1].end, " ".join(w for w, _, _ in spec), items)]


def test_subtitle_settings_shape_the_cues() -> None:
    # Two words 0.4 s apart, then a short last word right after a sentence end.
    segments = words(("Hello", 0.0, 0.5), ("there.", 0.9, 1.3), ("Next", 1.3, 1.5))
    default = build_cues(segments, cue_rules(settings(), 42))
    assert [c.text for c in default] == ["Hello there.", "Next"]
    # SUBTITLE_MIN_GAP keeps 0.083 s free before the next cue, SUBTITLE_MIN_DURATION
    # stretches the short last cue to 0.833 s
    assert default[1].start - default[0].end == pytest.approx(0.083)
    assert default[1].end - default[1].start == pytest.approx(0.833)
    # SUBTITLE_PAUSE_THRESHOLD: a 0.4 s pause now breaks the cue
    split = build_cues(segments, cue_rules(settings(subtitle_pause_threshold=0.3), 42))
    assert [c.text for c in split] == ["Hello", "there. Next"]
    # SUBTITLE_MAX_DURATION: a long run of words is cut into short cues
    run = words(*[(f"w{i}", i * 0.3, i * 0.3 + 0.25) for i in range(20)])
    short = build_cues(run, cue_rules(settings(subtitle_max_duration=1.5), 42))
    assert len(short) >= 4 and all(c.end - c.start <= 1.5 for c in short)
    gaps = [b.start - a.end for a, b in itertools.pairwise(short)]
    assert all(g >= 0.083 - 1e-9 for g in gaps), gaps


@pytest.mark.slow
def test_subtitle_and_chunk_settings_through_the_server(tmp_path: Path) -> None:
    env = {"MODEL_ID": "whisper-tiny.en", "SUBTITLE_MAX_DURATION": "2", "SSE_CHUNK_SECONDS": "5"}
    server = ServerProcess(env, cwd=tmp_path)
    try:
        server.wait_healthy()
        audio = speech.path("three_sentences.wav").read_bytes()
        body = httpx.post(
            server.url + "/v1/audio/subtitles", files={"file": ("a.wav", audio)}, timeout=120
        ).text
        cues = list(srt.parse(body))
        assert len(cues) >= 5
        assert all((c.end - c.start).total_seconds() <= 2.0 + 1e-3 for c in cues), body
        started = time.perf_counter()
        with httpx.stream(
            "POST",
            server.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", audio)},
            data={"stream": "true"},
            timeout=120,
        ) as response:
            deltas = [x for x in response.iter_lines() if '"transcript.text.delta"' in x]
        assert len(deltas) >= 2, deltas  # ~10 s in ≤ 5 s segments
        assert time.perf_counter() - started < 60
        plain = httpx.post(
            server.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", audio)},
            data={"response_format": "verbose_json"},
            timeout=120,
        ).json()
        # uploads keep SEGMENT_MAX_SECONDS: the 10 s clip is one segment of whisper output
        assert plain["segments"][-1]["end"] > 5.0
    finally:
        server.stop()


def test_partial_cadence_follows_ws_buffer_size() -> None:
    import asyncio

    from qwen3_asr_server.audio.vad import SileroModel
    from qwen3_asr_server.streaming.session import StreamConfig, StreamSession
    from streaming_client import load

    async def partial_calls(interval: float) -> list[float]:
        calls: list[float] = []

        async def transcribe(audio: object, language: object, partial: bool) -> str:
            if partial:
                calls.append(time.perf_counter())
            return "words"

        async def emit(event: object) -> None:
            return None

        config = StreamConfig(partial_interval_s=interval)
        session = StreamSession(config, transcribe, emit, SileroModel())
        audio = np.concatenate([load("sentence_02.wav"), load("sentence_03.wav")])
        for i in range(0, len(audio), 1600):
            await session.feed(audio[i : i + 1600])
            await asyncio.sleep(0.01)
        await session.close("test")
        return calls

    fast = asyncio.run(partial_calls(settings(ws_buffer_size=14400).ws_partial_interval))
    slow = asyncio.run(partial_calls(settings(ws_buffer_size=64000).ws_partial_interval))
    assert len(fast) >= 2 * len(slow) >= 2, (len(fast), len(slow))
