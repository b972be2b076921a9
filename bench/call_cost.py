"""What a two-sided call costs with multichannel=true (issue 44), against its speech alone.

    .venv/bin/python bench/call_cost.py [--minutes 10] [--model whisper-tiny.en]

Builds a stereo call from the speech fixtures: turns taking each other (a pause of 0.4 to
1.6 s, sometimes a cut-in), each side's -25 dB echo on the other channel. Runs it through
the server's pipeline in this process (multichannel: echo gate, each channel cut at its own
pauses, merged), and then the same speech with no silence and no echo, each side as one
mono track. Prints the engine seconds of both and their ratio (the goal: ≤ 1.15), and
each channel's WER in the call.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import time

from common import ROOT  # noqa: F401  (puts tests/ on the path)

import numpy as np
import soundfile as sf

import speech
from qwen3_asr_server.audio.channels import decode_channels
from qwen3_asr_server.audio.decode import Audio
from qwen3_asr_server.cli.transcribe_backends import Calls, Local
from qwen3_asr_server.config import Settings
from qwen3_asr_server.transcription.channels import transcribe_channels
from qwen3_asr_server.transcription.service import Options
from streaming_client import load
from wer import wer

RATE = 16000


def build_call(minutes: float, seed: int = 0) -> tuple[bytes, list[np.ndarray], list[str]]:
    """The stereo WAV, each side's speech alone (its clips end to end), and each side's
    text (its sentences heard whole in the call)."""
    rng = np.random.default_rng(seed)
    texts = speech.sentences()
    names = sorted(texts)
    clips = [load(name) for name in names]
    total = int(minutes * 60 * RATE)
    tracks = np.zeros((2, total + 10 * RATE), np.float32)
    alone: list[list[np.ndarray]] = [[], []]
    said: list[list[str]] = [[], []]
    at, side = int(0.5 * RATE), 0
    while at < total:
        k = int(rng.integers(len(clips)))
        clip = clips[k]
        tracks[side, at : at + len(clip)] += clip
        alone[side].append(clip)
        if at + len(clip) <= total:
            said[side].append(texts[names[k]])
        cut_in = rng.random() < 0.2  # the other side starts 0.3 s before this turn ends
        gap = -0.3 if cut_in else rng.uniform(0.4, 1.6)
        at += len(clip) + int(gap * RATE)
        side = 1 - side
    tracks = tracks[:, :total]
    tracks = tracks + 10 ** (-25 / 20) * tracks[::-1]
    buf = io.BytesIO()
    sf.write(buf, tracks.T, RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue(), [np.concatenate(a) for a in alone], [" ".join(t) for t in said]


async def measure(
    settings: Settings, wav: bytes, alone: list[np.ndarray], said: list[str]
) -> dict[str, float]:
    async with Local(settings, Calls()) as local:
        options = Options(local.transcriber.decoding())
        tracks = decode_channels(io.BytesIO(wav))
        await local.transcriber.transcribe(Audio(alone[0][: RATE * 3], RATE), options)  # load
        started = time.perf_counter()
        call = await transcribe_channels(local.transcriber, tracks, options, ["a", "b"])
        call_wall = time.perf_counter() - started
        speech_engine = 0.0
        started = time.perf_counter()
        for samples in alone:
            result = await local.transcriber.transcribe(Audio(samples, RATE), options)
            speech_engine += result.engine_seconds
        speech_wall = time.perf_counter() - started
    return {
        "call_engine": call.engine_seconds,
        "speech_engine": speech_engine,
        "call_wall": call_wall,
        "speech_wall": speech_wall,
        "speech_s": sum(len(a) for a in alone) / RATE,
        **{
            f"wer_{c}": wer([said[c]], [" ".join(s.text for s in call.segments if s.channel == c)])
            for c in (0, 1)
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--model", default="whisper-tiny.en")
    args = parser.parse_args()
    wav, alone, said = build_call(args.minutes)
    settings = Settings(_env_file=None, model_id=args.model, idle_timeout=0)  # type: ignore[call-arg]
    r = asyncio.run(measure(settings, wav, alone, said))
    print(
        f"a {args.minutes:g}-minute two-sided call ({r['speech_s']:.0f} s of speech), {args.model}:"
    )
    print("| | engine s | wall s |")
    print("|---|---|---|")
    print(f"| multichannel call | {r['call_engine']:.1f} | {r['call_wall']:.1f} |")
    print(f"| its speech alone | {r['speech_engine']:.1f} | {r['speech_wall']:.1f} |")
    engine, wall = r["call_engine"] / r["speech_engine"], r["call_wall"] / r["speech_wall"]
    print(f"| ratio | {engine:.2f} | {wall:.2f} |")
    print(f"each channel's WER in the call: {r['wer_0']:.3f} / {r['wer_1']:.3f}")


if __name__ == "__main__":
    main()
