"""Limits and records on a Qwen3-ASR decode: a token budget per row, a stop once every
caller of the job has gone, and (when asked) each generated token's log probability, the
prompt's token counts, and a restriction of the language header to candidate languages.
The qwen_asr SDK calls the model's `generate` itself, so all of this goes in by wrapping it
(`GenerationGuard`). torch and transformers are imported only inside calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...audio.pcm import SAMPLE_RATE
from ...text import language_name
from ..base import ShouldStop, TranscribeRequest, never_stop
from .tokens import RowRecord, header_ids

# The SDK's hard-coded end-of-sequence ids (<|im_end|>, <|endoftext|>).
EOS_IDS = (151645, 151643)


def token_budget(seconds: float, max_new_tokens: int) -> int:
    """Tokens a decode of `seconds` of audio may generate: speech rarely exceeds ~8 tokens
    per second, so this stops a decode that never emits an end token (noise, a broken
    checkpoint) long before MAX_NEW_TOKENS."""
    return max(1, min(max_new_tokens, 32 + int(12 * seconds)))


@dataclass
class RowSpec:
    """One row's limits and wishes."""

    budget: int
    headers: list[list[int]] | None = None  # allowed header token ids (candidate languages)
    logprobs: bool = False


@dataclass
class CallState:
    rows: list[RowSpec]
    should_stop: ShouldStop
    hit: set[int] = field(default_factory=set)  # rows cut at their budget
    records: list[RowRecord] = field(default_factory=list)
    offset: int = 0  # the SDK may split one call into several sub-batches


class GenerationGuard:
    """Wraps the model's `generate` so that each call stops, per row, at that row's token
    budget, and stops altogether once `should_stop()` says every caller has gone (checked
    every generated token, i.e. within one decode step). The SDK calls `generate` itself, so
    this is where a stopping criterion and logits processors can go in."""

    def __init__(self, model: Any, pad_token_id: int | None, audio_token_id: int) -> None:
        self._generate = model.generate
        self._pad = pad_token_id
        self._audio_token = audio_token_id
        self._state = CallState([], never_stop)
        model.generate = self._guarded

    def limits(self, rows: list[RowSpec], should_stop: ShouldStop) -> Limits:
        return Limits(self, CallState(rows, should_stop))

    def _guarded(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

        state = self._state
        input_ids = kwargs["input_ids"]
        rows, prompt = int(input_ids.shape[0]), int(input_ids.shape[1])
        first = state.offset
        state.offset += rows
        specs = state.rows[first : first + rows]
        mask = kwargs.get("attention_mask")
        records = [
            RowRecord(
                input_tokens=int(mask[r].sum()) if mask is not None else prompt,
                audio_tokens=int((input_ids[r] == self._audio_token).sum()),
            )
            for r in range(rows)
        ]
        state.records.extend(records)
        budgets = torch.tensor([s.budget for s in specs], dtype=torch.long)
        eos = torch.tensor(EOS_IDS)
        wants_logprobs = any(s.logprobs for s in specs)
        last: list[Any] = [None]  # this step's log-softmax, for the chosen tokens

        class Stop(StoppingCriteria):
            def __call__(self, ids: Any, scores: Any, **_: Any) -> Any:
                generated = ids[:, prompt:]
                if last[0] is not None:
                    chosen = last[0].gather(1, ids[:, -1:]).squeeze(1).tolist()
                    for r, value in enumerate(chosen):
                        records[r].logprobs.append(value)
                done = generated.shape[1] >= budgets.to(ids.device)
                ended = torch.isin(generated, eos.to(ids.device)).any(dim=1)
                for row in torch.nonzero(done & ~ended).flatten().tolist():
                    state.hit.add(first + int(row))
                if state.should_stop():
                    return torch.ones_like(done)
                return done

        def record(ids: Any, scores: Any) -> Any:
            scores = restrict(ids[:, prompt:], scores, specs)
            if wants_logprobs:
                last[0] = torch.log_softmax(scores.float(), dim=-1)
            return scores

        extra: dict[str, Any] = {}
        if wants_logprobs or any(s.headers for s in specs):
            processors = LogitsProcessorList([record])
            processors.extend(kwargs.pop("logits_processor", None) or [])
            extra["logits_processor"] = processors
        criteria = StoppingCriteriaList([Stop(), *(kwargs.pop("stopping_criteria", None) or [])])
        if self._pad is not None:
            kwargs.setdefault("pad_token_id", self._pad)
        out = self._generate(*args, stopping_criteria=criteria, **extra, **kwargs)
        sequences = out.sequences if hasattr(out, "sequences") else out
        for r, row in enumerate(sequences[:, prompt:].tolist()):
            ends = [i for i, t in enumerate(row) if t in EOS_IDS]
            records[r].generated = row[: ends[0] + 1] if ends else row
        return out


def restrict(generated: Any, scores: Any, specs: list[RowSpec]) -> Any:
    """Rows with candidate headers may only continue one of them; after the header (or
    once it no longer matches any) the row is free."""
    import torch

    for r, spec in enumerate(specs):
        if not spec.headers:
            continue
        done = generated[r].tolist()
        allowed = {
            h[len(done)] for h in spec.headers if len(done) < len(h) and h[: len(done)] == done
        }
        if allowed:
            keep = torch.full_like(scores[r], float("-inf"))
            index = torch.tensor(sorted(allowed), device=scores.device)
            keep[index] = scores[r][index]
            scores[r] = keep
    return scores


class Limits:
    def __init__(self, guard: GenerationGuard, state: CallState) -> None:
        self._guard = guard
        self.state = state

    def __enter__(self) -> CallState:
        self._guard._state = self.state
        return self.state

    def __exit__(self, *_: Any) -> None:
        self._guard._state = CallState([], never_stop)


def row_spec(request: TranscribeRequest, tokenizer: Any, max_new_tokens: int) -> RowSpec:
    """A row's token budget, candidate language headers and wish for logprobs."""
    budget = token_budget(len(request.audio) / SAMPLE_RATE, max_new_tokens)
    names = [language_name(c) or c for c in request.languages] if not request.language else []
    headers = header_ids(tokenizer, names) if names else None
    return RowSpec(budget, headers, request.logprobs)
