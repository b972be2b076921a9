"""The SDK's decode path (QWEN_DECODE=generate): transformers' `generate` on padded batches
of similar-length items, with our limits wrapped around it (`qwen_guard.py`)."""

from __future__ import annotations

from typing import Any

from loguru import logger

from ..audio.pcm import SAMPLE_RATE
from ..text import language_name
from .base import JobCancelledError, ShouldStop, TranscribeRequest
from .qwen_guard import GenerationGuard, RowSpec
from .qwen_rows import context, padded
from .qwen_tokens import RowRecord


def generate(
    model: Any,
    guard: GenerationGuard,
    requests: list[TranscribeRequest],
    rows: list[RowSpec],
    should_stop: ShouldStop,
) -> tuple[list[Any], list[RowRecord]]:
    """The SDK's results (text, language) and each row's record, in one `generate` call."""
    model.max_new_tokens = max(row.budget for row in rows)
    with guard.limits(rows, should_stop) as state:
        # Never a string: the SDK treats strings as paths, URLs (fetched!) or base64.
        results: list[Any] = model.transcribe(
            audio=[(padded(r.audio), SAMPLE_RATE) for r in requests],
            context=[context(r.prompt, r.keywords) for r in requests],
            language=[language_name(r.language) for r in requests],
        )
    if should_stop():
        raise JobCancelledError("every caller of this job has gone")
    for index in sorted(state.hit):
        warn_budget(requests[index], rows[index].budget)
    records = state.records if len(state.records) == len(requests) else []
    return results, records or [RowRecord() for _ in requests]


def duration_groups(lengths: list[int]) -> list[list[int]]:
    """Indices grouped by similar length (the longest ≤ twice the shortest, or 2 s more)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups:
            shortest = lengths[groups[-1][0]]
            if lengths[i] <= max(2 * shortest, shortest + 2 * SAMPLE_RATE):
                groups[-1].append(i)
                continue
        groups.append([i])
    return groups


def warn_budget(request: TranscribeRequest, budget: int) -> None:
    logger.warning(
        "the decode of {:.1f} s of audio hit its budget of {} tokens without an end token "
        "(noise, or a broken checkpoint?); its text is cut there",
        len(request.audio) / SAMPLE_RATE,
        budget,
    )
