"""Cutting long audio at pauses: VAD (Silero ONNX) and energy fallback."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import soundfile as sf

import speech
from qwen3_asr_server.audio.pcm import quietest_point
from qwen3_asr_server.audio.segmentation import Segmenter
from qwen3_asr_server.audio.vad import SileroModel

RATE = 16000


def bursts(pattern: list[tuple[str, float]]) -> np.ndarray:
    """('tone'|'gap', seconds) pieces: loud noise bursts separated by silence."""
    rng = np.random.default_rng(0)
    parts = [
        (rng.normal(0, 0.3, int(s * RATE)) if kind == "tone" else np.zeros(int(s * RATE)))
        for kind, s in pattern
    ]
    return np.concatenate(parts).astype(np.float32)


def check_cover(spans: list, total: int, max_samples: int) -> None:
    assert spans[0].start == 0 and spans[-1].end == total
    for a, b in itertools.pairwise(spans):
        assert a.end == b.start  # contiguous: nothing lost, nothing repeated
    assert all(0 < s.end - s.start <= max_samples for s in spans)


def test_short_audio_is_one_span() -> None:
    spans = list(Segmenter(30).spans(np.zeros(RATE * 10, dtype=np.float32)))
    assert [(s.start, s.end) for s in spans] == [(0, RATE * 10)]


def test_energy_cut_lands_in_the_pause() -> None:
    # 24 s of sound, a 0.5 s pause at 24-24.5 s, then more sound: max 30 s, search 8 s.
    audio = bursts([("tone", 24), ("gap", 0.5), ("tone", 20)])
    spans = list(Segmenter(30, vad=None).spans(audio))
    check_cover(spans, len(audio), 30 * RATE)
    assert 24.0 <= spans[0].end_s <= 24.5


def test_no_pause_still_cuts_at_the_maximum() -> None:
    audio = bursts([("tone", 70)])
    spans = list(Segmenter(30, vad=None).spans(audio))
    check_cover(spans, len(audio), 30 * RATE)
    assert len(spans) == 3


def test_quietest_point_handles_tiny_windows() -> None:
    assert quietest_point(np.zeros(100, dtype=np.float32)) == 50


def test_vad_cuts_real_speech_between_sentences() -> None:
    """three_sentences.wav has 1 s pauses; with a 6 s maximum every cut must fall in a
    pause: the VAD must find them (speech probability low), not cut a word."""
    audio, _ = sf.read(speech.path("three_sentences.wav"), dtype="float32")
    segmenter = Segmenter(6.0, vad=SileroModel(), search_seconds=3.0)
    spans = list(segmenter.spans(audio))
    check_cover(spans, len(audio), 6 * RATE)
    stream = SileroModel().stream()
    probs = stream.probs(audio)
    for span in spans[:-1]:
        frame = span.end // 512
        around = probs[max(0, frame - 2) : frame + 3]
        assert float(around.max()) < 0.5, f"cut at {span.end_s:.2f} s is inside speech"


def test_vad_scores_speech_high_and_silence_low() -> None:
    audio, _ = sf.read(speech.path("sentence_02.wav"), dtype="float32")
    probs = SileroModel().stream().probs(audio)
    assert probs.max() > 0.8
    silence = SileroModel().stream().probs(np.zeros(RATE, dtype=np.float32))
    assert silence.max() < 0.2


def test_vad_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from qwen3_asr_server.audio.vad import SileroModel\n"
        "SileroModel().stream().probs(np.zeros(16000, dtype=np.float32))\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("vad", [False, True])
def test_long_fixture_is_cut_into_bounded_contiguous_spans(vad: bool) -> None:
    audio, _ = sf.read(speech.path("long_2min.wav"), dtype="float32")
    segmenter = Segmenter(30, vad=SileroModel() if vad else None)
    spans = list(segmenter.spans(audio))
    check_cover(spans, len(audio), 30 * RATE)
    assert len(spans) >= 4


def test_vad_cuts_at_the_last_pause_not_the_longest() -> None:
    """Segments as long as the maximum allows (fewer 30 s windows): a 1.5 s pause early in
    the search window loses to a 0.5 s pause near its end."""
    pieces, t, marks = [], 0.0, {}
    layout = [(1, 0.2), (2, 0.2), (3, 0.2), (4, 0.2), (5, 0.2), (6, 1.5), (7, 0.5), (8, 0.2)]
    for number, gap in layout:
        clip, _ = sf.read(speech.path(f"sentence_{number:02d}.wav"), dtype="float32")
        pieces += [clip, np.zeros(int(gap * RATE), np.float32)]
        t += len(clip) / RATE
        marks[number] = (t, t + gap)  # (end of sentence, start of the next)
        t += gap
    audio = np.concatenate(pieces)
    assert marks[6][0] > 22.5 and marks[7][1] < 30  # both pauses inside the search window
    cut = Segmenter(30, vad=SileroModel()).next_cut(audio, 0) / RATE
    assert marks[7][0] - 0.3 <= cut <= marks[7][1] + 0.3, (cut, marks[6], marks[7])
