"""DUAL_MODEL: streaming partials on FAST_MODEL_ID, everything else on MODEL_ID. Proved with
the tiny random-weight Qwen checkpoint as the main model and the bundled whisper as the
fast one: whisper's partials read as English, the tiny Qwen's output does not."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import speech
from engines import Recording
from proc import ServerProcess
from qwen3_asr_server.app import create_app
from qwen3_asr_server.config import Settings
from qwen3_asr_server.engines import create_engine
from qwen3_asr_server.engines.dual import DualEngine
from server import live_server
from streaming_client import Collector, load, open_ws, stream
from wer import normalize

pytestmark = pytest.mark.slow


def dual_settings(tiny_qwen_dir: Path, **values: object) -> Settings:
    base: dict[str, object] = {
        "model_id": str(tiny_qwen_dir),
        "max_new_tokens": 8,
        "dual_model": True,
        "fast_model_id": "whisper-tiny.en",
    }
    return Settings(_env_file=None, **{**base, **values})  # type: ignore[arg-type]


def test_create_engine_pairs_the_models(tiny_qwen_dir: Path) -> None:
    engine = create_engine(dual_settings(tiny_qwen_dir))
    assert isinstance(engine, DualEngine)
    assert (engine.main.name, engine.fast.name) == ("qwen", "whisper")
    assert engine.fast.model_id == "whisper-tiny.en"
    assert not isinstance(create_engine(dual_settings(tiny_qwen_dir, dual_model=False)), DualEngine)


def test_partials_run_on_the_fast_model_and_the_rest_on_the_main_one(
    tiny_qwen_dir: Path,
) -> None:
    settings = dual_settings(tiny_qwen_dir, idle_timeout=2)
    plain = create_engine(settings)
    assert isinstance(plain, DualEngine)
    main, fast = Recording(plain.main), Recording(plain.fast)
    engine = DualEngine(main, fast)  # type: ignore[arg-type]
    with live_server(create_app(settings, engine=engine)) as srv:
        audio = np.concatenate([load("sentence_02.wav"), np.zeros(16000, np.float32)])
        with open_ws(srv.url, language="en") as ws:
            c = Collector(ws)
            stream(ws, audio, speed=1.0)
            assert c.wait_for(lambda c: len(c.finals()) >= 1, timeout=30), c.messages
        partials = [p["text"] for p in c.partials() if p["text"]]
        finals = c.finals()
        assert partials and fast.calls, "no partial ran on the fast model"
        # Every partial is whisper's (English words of the sentence); no final ran there.
        assert len(fast.texts) == len(fast.calls)
        spoken = set(normalize(speech.transcripts()["sentence_02.wav"]).split())
        assert any(set(normalize(p).split()) & spoken for p in partials), partials
        assert all(
            p in " ".join(fast.texts) or p.split()[0] in " ".join(fast.texts) for p in partials
        )
        # The final is the main model's: the tiny Qwen's text, not whisper's English.
        assert finals[-1] in main.texts, (finals, main.texts)
        assert not set(normalize(finals[-1]).split()) & spoken
        # An upload runs on the main model only.
        before_fast, before_main = len(fast.calls), len(main.calls)
        response = httpx.post(
            srv.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", speech.path("sentence_02.wav").read_bytes())},
            timeout=60,
        )
        assert response.status_code == 200
        assert len(main.calls) == before_main + 1 and len(fast.calls) == before_fast
        health = httpx.get(srv.url + "/health").json()
        assert health["engine"] == "qwen"
        assert health["fast_model"]["engine"] == "whisper"
        assert health["fast_model"]["loaded"] is True

        # Both unload together when idle.
        def unloaded() -> bool:
            models = (plain.main._model, plain.fast._model)  # type: ignore[attr-defined]
            return not srv.ctx.manager.loaded and models == (None, None)

        deadline = time.monotonic() + 20
        while not unloaded() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert unloaded()
        assert httpx.get(srv.url + "/health").json()["fast_model"]["loaded"] is False


def test_an_english_only_fast_model_leaves_other_languages_to_the_main_one(
    tiny_qwen_dir: Path,
) -> None:
    from qwen3_asr_server.engines.base import TranscribeRequest

    engine = create_engine(dual_settings(tiny_qwen_dir))
    assert isinstance(engine, DualEngine)
    silence = np.zeros(1600, np.float32)
    assert engine.for_request(TranscribeRequest(silence, "en", partial=True)) is engine.fast
    assert engine.for_request(TranscribeRequest(silence, "zh", partial=True)) is engine.main
    assert engine.for_request(TranscribeRequest(silence, None, partial=True)) is engine.main
    assert engine.for_request(TranscribeRequest(silence, "en")) is engine.main


def test_the_process_shows_both_models(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    env = {
        "MODEL_ID": str(tiny_qwen_dir),
        "DUAL_MODEL": "true",
        "FAST_MODEL_ID": "whisper-tiny.en",
        "PRELOAD": "true",
    }
    server = ServerProcess(env, cwd=tmp_path)
    try:
        server.wait_healthy()
        deadline = time.monotonic() + 180
        health = httpx.get(server.url + "/health").json()
        while not health["model_loaded"] and time.monotonic() < deadline:
            time.sleep(0.3)
            health = httpx.get(server.url + "/health").json()
        assert health["model_loaded"], health
        assert health["fast_model"] == {
            "model_id": "whisper-tiny.en",
            "engine": "whisper",
            "device": "cpu",
            "loaded": True,
        }
    finally:
        server.stop()


@pytest.mark.parametrize("fast", ["test-org/not-cached", "whisper"])
def test_a_fast_model_that_cannot_load_is_named_as_fast_model_id(tmp_path: Path, fast: str) -> None:
    """issue 41: a fast model that failed to load was reported as MODEL_ID, with the main
    model's name, and without the offline hint."""
    env = {
        "MODEL_ID": "whisper-tiny.en",
        "DUAL_MODEL": "true",
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(tmp_path / "empty-cache"),
    }
    if fast == "whisper":  # a whisper model directory that CTranslate2 cannot read
        broken = tmp_path / "broken-whisper"
        broken.mkdir()
        (broken / "model.bin").write_bytes(b"not a model")
        env.update(FAST_MODEL_ID=str(broken))
    else:
        env.update(FAST_MODEL_ID=fast)
    server = ServerProcess(env, cwd=tmp_path)
    try:
        server.wait_healthy()
        response = httpx.post(
            server.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", speech.path("sentence_02.wav").read_bytes())},
            timeout=120,
        )
    finally:
        server.stop()
    assert response.status_code == 503, response.text
    message = response.json()["error"]["message"]
    assert "FAST_MODEL_ID" in message and env["FAST_MODEL_ID"] in message, message
    assert "whisper-tiny.en" not in message.split(".")[0], message
    if fast != "whisper":
        assert "not in the HF cache" in message, message


def test_a_partial_that_finds_the_fast_model_busy_is_skipped_not_queued(
    tiny_qwen_dir: Path,
) -> None:
    """With remote backends the scheduler runs several calls at once; a second partial must
    not wait inside the engine for the one fast model (holding a scheduler thread that a
    final could use): it is skipped at once, and the fast model takes the next one."""
    import threading

    from qwen3_asr_server.engines.base import EngineBusyError, TranscribeRequest

    plain = create_engine(dual_settings(tiny_qwen_dir))
    assert isinstance(plain, DualEngine)
    started, release = threading.Event(), threading.Event()

    class Holding(Recording):
        def transcribe(self, request, should_stop=None):  # type: ignore[no-untyped-def]
            started.set()
            release.wait(30)
            return super().transcribe(request, should_stop)

    engine = DualEngine(plain.main, Holding(plain.fast))  # type: ignore[arg-type]
    engine.load()
    try:
        audio = load("sentence_02.wav")
        partial = TranscribeRequest(audio, "en", partial=True)
        first = threading.Thread(target=engine.transcribe, args=(partial,))
        first.start()
        assert started.wait(30)
        with pytest.raises(EngineBusyError):  # at once: before, it waited for the first
            engine.transcribe(partial)
        release.set()
        first.join(60)
        assert engine.transcribe(partial).text  # free again
    finally:
        release.set()
        engine.unload()
