"""POST /v1/listen's body: a transcript (`transcript.Transcript`, word times asked for) in
Deepgram's pre-recorded shape: `metadata` and `results.channels[].alternatives[]`
(`transcript`, `confidence`, `words`, and `paragraphs` when asked), `results.utterances` when
asked. With `multichannel`, one channel entry per channel. An utterance is one of our
segments (cut at pauses); a paragraph is one too, its sentences cut at `.`, `?` and `!`."""

from __future__ import annotations

import datetime
import re
import uuid
from typing import Any

from ...text import letter_index
from ...transcript import Segment, Transcript, Word
from . import messages as m
from .query import FileQuery

ENDS_SENTENCE = re.compile(r"[.?!…]['\")\]]*$")


def created_now() -> str:
    """Deepgram's `created`: now, UTC, to the millisecond (`2026-01-02T03:04:05.678Z`)."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
    return now.replace("+00:00", "Z")


def word_body(word: Word, speaker: int | None, diarize: bool) -> dict[str, Any]:
    shown = word.word.strip()
    body: dict[str, Any] = {
        "word": re.sub(r"[^\w'-]", "", shown).lower() or shown.lower(),
        "start": round(word.start, 3),
        "end": round(word.end, 3),
        "confidence": round(word.probability, 4) if word.probability is not None else 1.0,
        "punctuated_word": shown,
    }
    if diarize:
        body["speaker"] = speaker if speaker is not None else 0
    return body


def segment_words(segment: Segment, diarize: bool) -> list[dict[str, Any]]:
    speaker = letter_index(segment.speaker)
    return [word_body(w, speaker, diarize) for w in segment.words if w.word.strip()]


def confidence(words: list[dict[str, Any]]) -> float:
    return round(sum(w["confidence"] for w in words) / len(words), 4) if words else 0.0


def sentences(words: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The words cut into sentences at their closing punctuation."""
    groups: list[list[dict[str, Any]]] = [[]]
    for word in words:
        groups[-1].append(word)
        if ENDS_SENTENCE.search(word["punctuated_word"]):
            groups.append([])
    return [
        {
            "text": " ".join(w["punctuated_word"] for w in group),
            "start": group[0]["start"],
            "end": group[-1]["end"],
        }
        for group in groups
        if group
    ]


def paragraphs(segments: list[Segment], diarize: bool) -> dict[str, Any]:
    items = []
    for segment in segments:
        words = segment_words(segment, diarize)
        if not words:
            continue
        item: dict[str, Any] = {
            "sentences": sentences(words),
            "num_words": len(words),
            "start": words[0]["start"],
            "end": words[-1]["end"],
        }
        if diarize:
            item["speaker"] = words[0]["speaker"]
        items.append(item)
    text = "\n\n".join(" ".join(s["text"] for s in p["sentences"]) for p in items)
    return {"transcript": text, "paragraphs": items}


def alternative(segments: list[Segment], query: FileQuery) -> dict[str, Any]:
    words = [w for s in segments for w in segment_words(s, query.diarize)]
    text = " ".join(s.text.strip() for s in segments if s.text.strip())
    body: dict[str, Any] = {"transcript": text, "confidence": confidence(words), "words": words}
    if query.paragraphs:
        body["paragraphs"] = paragraphs(segments, query.diarize)
    return body


def utterances(result: Transcript, query: FileQuery) -> list[dict[str, Any]]:
    out = []
    for segment in result.segments:
        words = segment_words(segment, query.diarize)
        if not words:
            continue
        item: dict[str, Any] = {
            "start": round(segment.start, 3),
            "end": round(segment.end, 3),
            "confidence": confidence(words),
            "channel": segment.channel or 0,
            "transcript": segment.text.strip(),
            "words": words,
            "id": str(uuid.uuid4()),
        }
        if query.diarize:
            item["speaker"] = words[0]["speaker"]
        out.append(item)
    return out


def file_body(result: Transcript, query: FileQuery, metadata: m.Metadata) -> dict[str, Any]:
    """`metadata` as built by the route (request id, sha256, model, channels): the live
    `Metadata` message's fields, without its `type`."""
    channels = metadata.channels
    if query.multichannel:
        lanes = [[s for s in result.segments if (s.channel or 0) == c] for c in range(channels)]
    else:
        lanes = [result.segments]
    entries = []
    for segments in lanes:
        entry: dict[str, Any] = {"alternatives": [alternative(segments, query)]}
        if result.language:
            entry["detected_language"] = result.language
        entries.append(entry)
    results: dict[str, Any] = {"channels": entries}
    if query.utterances:
        results["utterances"] = utterances(result, query)
    shown = metadata.model_dump(mode="json", exclude={"type"}, exclude_none=True)
    return {"metadata": shown, "results": results}
