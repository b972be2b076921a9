"""Regenerate the committed speech fixtures in tests/data/speech with espeak-ng.

    apt-get install espeak-ng && python scripts/make_speech_fixtures.py [--names]

`--names` writes only the rare-name clips (`names_*.wav`, `names.json`: each clip's text and
the keywords that name what is rare in it), which bench/keywords.py measures keywords with.

Writes 16 kHz mono 16-bit WAVs and `transcripts.json`. `make test` does not need espeak-ng:
the WAVs are committed. Output is deterministic for a given espeak-ng version.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "speech"
RATE = 16000
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back when you get home tonight.",
    "The weather today is cold and windy with some rain.",
    "She bought three apples and two oranges at the market.",
    "Our meeting starts at nine in the morning on Monday.",
    "The train to the city leaves every twenty minutes.",
    "He forgot his keys on the kitchen table again.",
    "Learning a new language takes time and patience.",
    "The children played football in the park after school.",
    "Turn left at the next corner and walk straight ahead.",
    "This server turns speech into text very quickly.",
    "My favorite color is blue and my sister likes green.",
]


# Sentences with names and terms a small model rarely spells right, and the keywords for them.
NAMES = [
    ("Please send the report to Siobhan Nakamura before Friday.", ["Siobhan Nakamura"]),
    ("We deployed the new cluster with Kubernetes and Terraform.", ["Kubernetes", "Terraform"]),
    ("Doctor Oyelaran will see you in room twelve.", ["Oyelaran"]),
    ("The Qwen model runs on the Ampere servers.", ["Qwen", "Ampere"]),
    ("Call Xiomara at the Hradec Kralove office.", ["Xiomara", "Hradec Kralove"]),
    ("Grzegorz fixed the bug in the Postgres replica.", ["Grzegorz", "Postgres"]),
]


def names() -> None:
    table = {}
    for i, (sentence, keywords) in enumerate(NAMES, start=1):
        name = f"names_{i:02d}.wav"
        write(name, np.concatenate([silence(0.2), speak(sentence), silence(0.2)]))
        table[name] = {"text": sentence, "keywords": keywords}
    (OUT / "names.json").write_text(json.dumps(table, indent=2) + "\n")
    print(f"wrote {len(table)} name clips to {OUT}")


def speak(text: str, voice: str = "en-us", speed: int = 150) -> np.ndarray:
    wav = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(speed), "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    samples, rate = sf.read(io.BytesIO(wav), dtype="float32")
    return soxr.resample(samples, rate, RATE).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype=np.float32)


def write(name: str, samples: np.ndarray) -> None:
    sf.write(OUT / name, np.clip(samples, -1, 1), RATE, subtype="PCM_16")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    transcripts: dict[str, str] = {}
    clips = []
    for i, sentence in enumerate(SENTENCES, start=1):
        clip = speak(sentence)
        clips.append(clip)
        name = f"sentence_{i:02d}.wav"
        write(name, np.concatenate([silence(0.2), clip, silence(0.2)]))
        transcripts[name] = sentence

    three = [clips[0], silence(1.0), clips[1], silence(1.0), clips[2]]
    write("three_sentences.wav", np.concatenate([silence(0.3), *three, silence(0.3)]))
    transcripts["three_sentences.wav"] = " ".join(SENTENCES[:3])

    parts, words, total, i = [], [], 0.0, 0
    while total < 120.0:
        clip = clips[i % len(clips)]
        parts += [clip, silence(0.6)]
        words.append(SENTENCES[i % len(SENTENCES)])
        total += len(clip) / RATE + 0.6
        i += 1
    write("long_2min.wav", np.concatenate(parts))
    transcripts["long_2min.wav"] = " ".join(words)

    write("silence.wav", silence(5.0))
    noise = np.random.default_rng(1234).normal(0, 0.05, 5 * RATE).astype(np.float32)
    write("noise.wav", noise)
    transcripts["silence.wav"] = ""
    transcripts["noise.wav"] = ""
    (OUT / "transcripts.json").write_text(json.dumps(transcripts, indent=2) + "\n")
    print(f"wrote {len(transcripts)} clips to {OUT}")


if __name__ == "__main__":
    import sys

    names() if "--names" in sys.argv[1:] else main()
