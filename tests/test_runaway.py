"""A decode that never emits an end token (the tiny checkpoint never does; real Qwen does on
noise) is bounded by its token budget and stopped once its callers have gone, so the
requests after a burst of timed-out uploads are served within their own timeout."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from audio_files import wav_bytes
from qwen3_asr_server.app import create_app
from qwen3_asr_server.engines.qwen.guard import token_budget
from server import live_server


def test_token_budget_grows_with_audio_and_is_capped() -> None:
    assert token_budget(0.0, 1024) == 32
    assert token_budget(10.0, 1024) == 152
    assert token_budget(300.0, 1024) == 1024


@pytest.mark.slow
def test_after_a_burst_of_timed_out_uploads_the_next_request_is_served(qwen_settings) -> None:  # type: ignore[no-untyped-def]
    settings = qwen_settings(
        max_new_tokens=5000,  # without a budget, 120 s of audio would decode 5000 tokens
        segment_max_seconds=300,  # one engine call per upload
        request_timeout=1.5,
        max_batch_size=1,
        preload=True,  # a load longer than REQUEST_TIMEOUT would answer 503 model_loading
    )
    with live_server(create_app(settings)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        client.audio.transcriptions.create(model="m", file=("w.wav", wav_bytes(0.5)))  # load
        # A budget of 3632 tokens: ~23 s on this checkpoint (measured; 120 s of audio was
        # 3.3 s, and on a busy machine one upload finished before its 1.5 s timeout fired),
        # 15x the timeout: the caller has gone long before, and its decode is stopped.
        long = wav_bytes(300)

        def upload(_: int) -> int:
            try:
                client.audio.transcriptions.create(model="m", file=("l.wav", long))
            except openai.APIStatusError as exc:
                return exc.status_code
            return 200

        with ThreadPoolExecutor(3) as pool:
            statuses = list(pool.map(upload, range(3)))
        assert statuses == [504, 504, 504]
        started = time.monotonic()
        result = client.audio.transcriptions.create(model="m", file=("s.wav", wav_bytes(1.0)))
        assert isinstance(result.text, str)
        assert time.monotonic() - started < settings.request_timeout
        assert srv.ctx.scheduler.depth == 0
