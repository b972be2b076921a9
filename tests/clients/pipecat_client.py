"""Pipecat's DeepgramSTTService against a running server's /v1/listen, in a real pipeline run
by Pipecat's own test runner (`pipecat.tests.utils.run_test`: a Pipeline, a PipelineWorker, a
WorkerRunner): its Silero VAD, then the STT service, fed 20 ms frames at a transport's pace.
The VAD's stop makes the service send Finalize; the EndFrame sends CloseStream and drops the
socket at once. MODE `wait` leaves time for the last final, `drop` ends in mid-sentence.
Prints one JSON object with what it got.

Run with the separate venv `make clients` builds (Pipecat's pins clash with ours):
tests/clients/.venv-pipecat/bin/python pipecat_client.py BASE_URL API_KEY WAV MODE
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import wave

from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import (
    ErrorFrame,
    InputAudioRawFrame,
    InterimTranscriptionFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.audio.vad_processor import VADProcessor
from pipecat.services.deepgram.stt import DeepgramSTTService
from pipecat.tests.utils import SleepFrame, run_test

FRAME = 640  # 20 ms of 16 kHz s16 mono


async def main() -> None:
    url, key, path, mode = sys.argv[1:5]
    with wave.open(path) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        pcm = w.readframes(w.getnframes())
    if mode == "wait":  # 0.5 s before the speech, 1 s after; the Finalize's answer lands
        audio, tail = bytes(16000) + pcm + bytes(32000), 3.0
    else:  # "drop": 2 s of the sentence and the EndFrame at once, the utterance still open
        audio, tail = bytes(16000) + pcm[: 2 * 32000], 0.0
    frames: list = []
    for i in range(0, len(audio), FRAME):
        chunk = audio[i : i + FRAME]
        frames += [
            InputAudioRawFrame(audio=chunk, sample_rate=16000, num_channels=1),
            SleepFrame(sleep=0.02),
        ]
    frames.append(SleepFrame(sleep=tail))  # then the EndFrame: CloseStream, the socket dropped
    stt = DeepgramSTTService(api_key=key, base_url=url, sample_rate=16000)
    pipeline = Pipeline([VADProcessor(vad_analyzer=SileroVADAnalyzer()), stt])
    started = time.monotonic()
    # the service connects in setup(), before the StartFrame: 1 s is tight on busy cores
    down, up = await run_test(pipeline, frames_to_send=frames, start_timeout=30)
    print(
        json.dumps(
            {
                "finals": [
                    {"text": f.text, "finalized": f.finalized}
                    for f in down
                    if isinstance(f, TranscriptionFrame)
                ],
                "interims": sum(isinstance(f, InterimTranscriptionFrame) for f in down),
                "vad_starts": sum(isinstance(f, VADUserStartedSpeakingFrame) for f in down),
                "vad_stops": sum(isinstance(f, VADUserStoppedSpeakingFrame) for f in down),
                "errors": [f.error for f in (*down, *up) if isinstance(f, ErrorFrame)],
                "seconds": round(time.monotonic() - started, 3),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
