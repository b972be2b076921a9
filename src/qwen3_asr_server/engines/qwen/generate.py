"""The SDK's decode path (QWEN_DECODE=generate): transformers' `generate` on padded batches
of similar-length items, with our limits wrapped around it (`guard.py`)."""

from __future__ import annotations

from typing import Any

from loguru import logger

from ...audio.pcm import SAMPLE_RATE
from ...text import language_name
from ..base import JobCancelledError, ShouldStop, TranscribeRequest
from .guard import GenerationGuard, RowSpec
from .rows import PREFILL_SAMPLES, context, padded
from .tokens import RowRecord


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


def prefill_groups(lengths: list[int]) -> list[list[int]]:
    """Rows prefilled together: of similar length (`duration_groups`: little padding; for
    `generate`, a short row padded to a long one's length is what upstream's mixed-length
    bug, QwenLM/Qwen3-ASR#207, came from), and at most PREFILL_SAMPLES of padded audio per
    prefill (its activations: every position of every row, in every layer)."""
    groups: list[list[int]] = []
    for group in duration_groups(lengths):
        chunk: list[int] = []
        for i in group:  # shortest first
            if chunk and (len(chunk) + 1) * lengths[i] > PREFILL_SAMPLES:
                groups.append(chunk)
                chunk = []
            chunk.append(i)
        groups.append(chunk)
    return groups


def warn_budget(request: TranscribeRequest, budget: int) -> None:
    logger.warning(
        "the decode of {:.1f} s of audio hit its budget of {} tokens without an end token "
        "(noise, or a broken checkpoint?); its text is cut there",
        len(request.audio) / SAMPLE_RATE,
        budget,
    )
