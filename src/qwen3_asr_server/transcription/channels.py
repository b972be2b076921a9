"""Multichannel uploads (issue 44): a call recorded with one speaker per channel. Each
channel is transcribed on its own, cut at its own pauses (a stretch where it is silent is
never decoded), after the faint echo of the other side is silenced (`audio/channels.py`);
then the channels' segments are merged into one timeline by start time. Segments and words
carry their channel; a segment's speaker is the channel's name."""

from __future__ import annotations

import asyncio

from ..audio.channels import without_echo
from ..audio.decode import Audio
from ..errors import BadRequestError
from ..text import join_texts
from ..transcript import Segment, TokenUsage, Transcript
from .service import Options, Transcriber


def channel_names(names: list[str] | None, count: int) -> list[str]:
    """`channel_names[]` as given (one per channel), or `channel 0`, `channel 1`, ..."""
    if not names:
        return [f"channel {i}" for i in range(count)]
    names = [n.strip() for n in names]
    if len(names) != count or not all(names):
        raise BadRequestError(
            f"channel_names[] has {len(names)} names for {count} channels: give one "
            "non-empty name per channel, in channel order.",
            param="channel_names",
        )
    return names


async def transcribe_channels(
    transcriber: Transcriber, tracks: list[Audio], options: Options, names: list[str]
) -> Transcript:
    cleaned = await asyncio.to_thread(without_echo, [t.samples for t in tracks])
    audios = [Audio(samples, tracks[0].source_rate) for samples in cleaned]
    results = await asyncio.gather(*(transcriber.transcribe(a, options) for a in audios))
    return merge_channels(list(results), names)


def merge_channels(results: list[Transcript], names: list[str]) -> Transcript:
    """One transcript in time order: every segment tagged with its channel and name."""
    segments: list[Segment] = []
    for channel, result in enumerate(results):
        for segment in result.segments:
            segment.channel, segment.speaker = channel, names[channel]
            for word in segment.words:
                word.channel = channel
            segments.append(segment)
    segments.sort(key=lambda s: (s.start, s.channel or 0))
    languages = list(dict.fromkeys(code for r in results for code in r.languages))
    usages = [r.usage for r in results]
    sources = {r.word_source for r in results if r.word_source}
    return Transcript(
        text=join_texts([s.text for s in segments]),
        language=next((r.language for r in results if r.language), None),
        duration=max(r.duration for r in results),
        segments=segments,
        engine_seconds=sum(r.engine_seconds for r in results),
        job_seconds=max(r.job_seconds for r in results),
        word_source="estimate" if "estimate" in sources else min(sources, default=None),
        languages=languages,
        logprobs=None,  # tokens of interleaved channels have no one order
        usage=None if None in usages else sum((u for u in usages if u), TokenUsage()),
    )
