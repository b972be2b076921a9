"""Response bodies: json, text, verbose_json, srt, vtt."""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from typing import Any

from ..text import language_name
from ..transcript import Segment, TokenLogprob, TokenUsage, Transcript

# verbose_json's `language` is a required string in OpenAI's schema; this is what it says
# when no language was detected (e.g. an upload of silence with language=auto).
UNKNOWN_LANGUAGE = "unknown"


def language_label(code: str | None) -> str | None:
    """OpenAI reports the language as a lower-case English name (`english`)."""
    name = language_name(code)
    return (name or code or "").lower() or None


def seed_language(code: str | None) -> str | None:
    """The seed server reported the language as Qwen's capitalised name (`English`)."""
    return language_name(code) or code or None


def compression_ratio(text: str) -> float:
    """Whisper's measure of repetitive text: bytes / zlib-compressed bytes (0 when empty)."""
    data = text.encode("utf-8")
    return round(len(data) / len(zlib.compress(data)), 3) if data else 0.0


def usage_body(usage: TokenUsage | None, duration: float) -> dict[str, Any]:
    """OpenAI's `usage`: tokens where the engine counted them (Qwen), else seconds of audio."""
    if usage is None:
        return {"type": "duration", "seconds": math.ceil(duration)}
    return {"type": "tokens", **token_usage_body(usage)}


WHISPER_AUDIO_TOKENS_PER_S = 50  # whisper's encoder: 1,500 positions per 30 s window


def done_usage(
    usage: TokenUsage | None, segments: list[Segment], duration: float
) -> dict[str, Any] | None:
    """A stream's `transcript.text.done` `usage` (the SDK's type has tokens only): the
    engine's count (Qwen); else, when the segments carry the tokens whisper wrote, whisper's:
    its encoder's 50 positions a second of audio in, those tokens out. None when neither
    (a remote backend that sent no tokens)."""
    if usage is None:
        written = sum(len(s.tokens) for s in segments)
        if not written:
            return None
        usage = TokenUsage(
            audio_tokens=math.ceil(duration * WHISPER_AUDIO_TOKENS_PER_S), output_tokens=written
        )
    return {"type": "tokens", **token_usage_body(usage)}


def token_usage_body(usage: TokenUsage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "input_token_details": {
            "audio_tokens": usage.audio_tokens,
            "text_tokens": usage.text_tokens,
        },
    }


def languages_body(codes: list[str]) -> list[dict[str, str]]:
    """OpenAI's `languages`: the detected ones, in order of speech time."""
    return [{"code": code} for code in codes]


def logprobs_body(logprobs: list[TokenLogprob] | None) -> list[dict[str, Any]]:
    return [
        {"token": t.token, "bytes": list(t.bytes), "logprob": round(t.logprob, 6)}
        for t in logprobs or []
    ]


def json_body(result: Transcript, *, logprobs: bool = False) -> dict[str, Any]:
    """OpenAI's json body (`languages` detected, `usage`, `logprobs` when asked for) plus the
    seed's `language` (capitalised name) and `duration`."""
    body: dict[str, Any] = {
        "text": result.text,
        "language": seed_language(result.language),
        "languages": languages_body(result.languages),
        "duration": round(result.duration, 3),
        "usage": usage_body(result.usage, result.duration),
    }
    if logprobs:
        body["logprobs"] = logprobs_body(result.logprobs)
    return body


def _segment(i: int, s: Segment, temperature: float | None) -> dict[str, Any]:
    """OpenAI's schema requires avg_logprob, compression_ratio and no_speech_prob as numbers.
    Where the engine has none (Qwen), compression_ratio is computed from the text as whisper
    does, no_speech_prob comes from the VAD (`vad.fill_no_speech_probs`, filled by the route),
    and avg_logprob is 0.0: "no evidence of a problem", which is what clients that filter on
    it (avg_logprob < -1) should read."""
    ratio = s.compression_ratio if s.compression_ratio is not None else compression_ratio(s.text)
    return (
        {
            "id": i,
            "seek": round(s.start * 100),  # 10 ms frames, as whisper counts them
            "start": round(s.start, 3),
            "end": round(s.end, 3),
            "text": s.text,
            "tokens": s.tokens,
            "temperature": temperature if temperature is not None else 0.0,
            "avg_logprob": s.avg_logprob if s.avg_logprob is not None else 0.0,
            "compression_ratio": ratio,
            "no_speech_prob": s.no_speech_prob if s.no_speech_prob is not None else 0.0,
        }
        | ({"speaker": s.speaker} if s.speaker else {})
        | _channel(s.channel)
    )


def verbose_json_body(
    result: Transcript, *, words: bool, temperature: float | None, task: str = "transcribe"
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": task,
        "language": language_label(result.language) or UNKNOWN_LANGUAGE,
        "duration": round(result.duration, 3),
        "text": result.text,
        "segments": [_segment(i, s, temperature) for i, s in enumerate(result.segments)],
        "usage": {"type": "duration", "seconds": math.ceil(result.duration)},
    }
    if words:
        body["words"] = words_body(result.segments)
        # Not in OpenAI's schema (extra fields are allowed): how the word times were made.
        body["word_timestamps"] = result.word_source or "estimate"
    return body


def words_body(segments: list[Segment]) -> list[dict[str, Any]]:
    return [
        {"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)} | _channel(w.channel)
        for s in segments
        for w in s.words
    ]


def _channel(channel: int | None) -> dict[str, Any]:
    """Multichannel uploads: the channel (not in OpenAI's schema; extra fields are allowed)."""
    return {} if channel is None else {"channel": channel}


def timestamp(seconds: float, sep: str) -> str:
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{sep}{ms:03d}"


def cues(segments: list[Segment], vtt: bool = False) -> list[tuple[float, float, str]]:
    """Non-empty (start, end, text) cues in time order; a segment's speaker is a VTT voice
    tag (`<v A>`) or an SRT prefix (`[A] `). One speaker's (or channel's) cues never
    overlap; those of different speakers may, as their speech does (an interjection keeps
    its own times, not a 1 ms cue after the turn it interrupts)."""
    out: list[tuple[float, float, str]] = []
    ends: dict[tuple[str | None, int | None], float] = {}  # each voice's last cue end
    for s in segments:
        text = "\n".join(" ".join(ln.split()) for ln in s.text.splitlines() if ln.strip())
        if not text:
            continue
        if s.speaker:
            text = f"<v {s.speaker}>{text}" if vtt else f"[{s.speaker}] {text}"
        voice = (s.speaker, s.channel)
        start = max(s.start, ends.get(voice, s.start))
        end = max(s.end, start + 0.001)
        ends[voice] = end
        out.append((start, end, text))
    return sorted(out, key=lambda cue: cue[0])


def to_srt(segments: list[Segment]) -> str:
    blocks = [
        f"{i}\n{timestamp(a, ',')} --> {timestamp(b, ',')}\n{text}\n"
        for i, (a, b, text) in enumerate(cues(segments), start=1)
    ]
    return "\n".join(blocks)


def to_vtt(segments: list[Segment]) -> str:
    blocks = [
        f"{timestamp(a, '.')} --> {timestamp(b, '.')}\n{text}\n"
        for a, b, text in cues(segments, vtt=True)
    ]
    return "WEBVTT\n\n" + "\n".join(blocks)


def diarized_json_body(result: Transcript) -> dict[str, Any]:
    """OpenAI's `diarized_json` (TranscriptionDiarized): one segment per speaker turn."""
    return {
        "task": "transcribe",
        "duration": round(result.duration, 3),
        "text": result.text,
        "segments": [diarized_segment_body(i, s) for i, s in enumerate(result.segments)],
        "usage": usage_body(result.usage, result.duration),
    }


def diarized_segment_body(i: int, s: Segment) -> dict[str, Any]:
    return {
        "type": "transcript.text.segment",
        "id": f"seg_{i}",
        "start": round(s.start, 3),
        "end": round(s.end, 3),
        "speaker": s.speaker or "A",
        "text": s.text,
    }


@dataclass(frozen=True)
class BodyWishes:
    """What shapes a transcription's body beyond its format (the upload form's fields)."""

    words: bool = False  # verbose_json words
    temperature: float | None = None
    logprobs: bool = False  # json only
    seed_words: bool = False  # the seed's return_timestamps on json


def render(result: Transcript, response_format: str, wishes: BodyWishes) -> tuple[bytes, str]:
    """The body of a transcription in `response_format` and its media type: what the route
    answers and what `transcribe` writes, byte for byte."""
    if response_format == "text":
        return result.text.encode(), "text/plain"
    if response_format == "srt":
        return to_srt(result.segments).encode(), "text/plain"
    if response_format == "vtt":
        return to_vtt(result.segments).encode(), "text/vtt"
    if response_format == "diarized_json":
        body = diarized_json_body(result)
    elif response_format == "verbose_json":
        body = verbose_json_body(result, words=wishes.words, temperature=wishes.temperature)
    else:
        body = json_body(result, logprobs=wishes.logprobs)
        if wishes.seed_words:
            body["words"] = words_body(result.segments)
    # as Starlette's JSONResponse renders it
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode(), "application/json"
