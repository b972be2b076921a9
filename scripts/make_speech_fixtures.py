"""Regenerate the committed speech fixtures in tests/data/speech with espeak-ng.

    apt-get install espeak-ng && python scripts/make_speech_fixtures.py [--names|--speakers]

`--speakers` writes only the speaker clips: `meeting.wav` (three espeak-ng voices in
alternating turns with 0.7 s gaps and one 0.4 s overlap), `meeting.json` (who spoke when, and
what), and one 3-6 s reference clip per voice (`voice_*.wav`, other sentences), for the
diarization tests and bench/diarize.py.

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


VOICES = {"m3": "en+m3", "f4": "en+f4", "m1": "en-us+m1"}
TURNS = [
    ("m3", "Good morning everyone, thanks for joining the weekly planning meeting today."),
    ("f4", "Thanks. I want to start with the release schedule for the mobile application."),
    ("m1", "Before that, can we review the budget numbers from last quarter please?"),
    ("m3", "Sure, the budget came in about ten percent under what we had planned."),
    ("f4", "That is good news. It gives us room to hire another engineer this spring."),
    ("m1", "I agree, and we should also look at the testing infrastructure costs."),
    ("m3", "Let us write that down as an action item for next week."),
    ("f4", "Great. Then the release can move forward at the end of the month."),
]
REFERENCES = {
    "m3": "My favorite color is blue and my sister likes green.",
    "f4": "The children played football in the park after school.",
    "m1": "Turn left at the next corner and walk straight ahead.",
}
OVERLAP_BEFORE = 4  # this turn starts 0.4 s before the one before it ends


def speakers() -> None:
    truth, pos = [], int(0.3 * RATE)
    clips = [(voice, text, speak(text, VOICES[voice])) for voice, text in TURNS]
    total = pos + sum(len(c) + int(0.7 * RATE) for _, _, c in clips)
    mix = np.zeros(total, dtype=np.float32)
    for i, (voice, text, clip) in enumerate(clips):
        if i == OVERLAP_BEFORE:
            pos -= int(1.1 * RATE)  # back over the 0.7 s gap and 0.4 s of the last turn
        mix[pos : pos + len(clip)] += clip
        truth.append(
            {"speaker": voice, "start": pos / RATE, "end": (pos + len(clip)) / RATE, "text": text}
        )
        pos += len(clip) + int(0.7 * RATE)
    write("meeting.wav", 0.9 * mix[:pos] / max(1.0, float(np.abs(mix).max())))
    (OUT / "meeting.json").write_text(json.dumps(truth, indent=2) + "\n")
    for voice, text in REFERENCES.items():
        write(
            f"voice_{voice}.wav",
            np.concatenate([silence(0.2), speak(text, VOICES[voice]), silence(0.2)]),
        )
    print(
        f"wrote meeting.wav ({pos / RATE:.1f} s, {len(truth)} turns) and {len(REFERENCES)} voices"
    )


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

    if "--names" in sys.argv[1:]:
        names()
    elif "--speakers" in sys.argv[1:]:
        speakers()
    else:
        main()
