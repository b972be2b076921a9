"""Limits on a Qwen3-ASR decode: a token budget per row, and a stop once every caller of
the job has gone. The qwen_asr SDK calls the model's `generate` itself, so the limits go in
by wrapping it (`GenerationGuard`). torch and transformers are imported only inside calls.
"""

from __future__ import annotations

from typing import Any

from .base import ShouldStop, never_stop

# The SDK's hard-coded end-of-sequence ids (<|im_end|>, <|endoftext|>).
EOS_IDS = (151645, 151643)


def token_budget(seconds: float, max_new_tokens: int) -> int:
    """Tokens a decode of `seconds` of audio may generate: speech rarely exceeds ~8 tokens
    per second, so this stops a decode that never emits an end token (noise, a broken
    checkpoint) long before MAX_NEW_TOKENS."""
    return max(1, min(max_new_tokens, 32 + int(12 * seconds)))


class GenerationGuard:
    """Wraps the model's `generate` so that each call stops, per row, at that row's token
    budget, and stops altogether once `should_stop()` says every caller has gone (checked
    every generated token, i.e. within one decode step). The SDK calls `generate` itself, so
    this is where a stopping criterion can go in."""

    def __init__(self, model: Any, pad_token_id: int | None) -> None:
        self._generate = model.generate
        self._pad = pad_token_id
        self._budgets: list[int] = []
        self._should_stop: ShouldStop = never_stop
        self._hit: set[int] = set()
        self._offset = 0
        model.generate = self._guarded

    def limits(self, budgets: list[int], should_stop: ShouldStop) -> Limits:
        return Limits(self, budgets, should_stop)

    def _guarded(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        guard = self
        rows = int(kwargs["input_ids"].shape[0])
        prompt = int(kwargs["input_ids"].shape[1])
        first = self._offset  # the SDK may split one call into several sub-batches
        self._offset += rows
        budgets = torch.tensor(self._budgets[first : first + rows], dtype=torch.long)
        eos = torch.tensor(EOS_IDS)

        class Stop(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **_: Any) -> Any:
                generated = input_ids[:, prompt:]
                done = generated.shape[1] >= budgets.to(input_ids.device)
                ended = torch.isin(generated, eos.to(input_ids.device)).any(dim=1)
                for row in torch.nonzero(done & ~ended).flatten().tolist():
                    guard._hit.add(first + int(row))
                if guard._should_stop():
                    return torch.ones_like(done)
                return done

        criteria = StoppingCriteriaList([Stop(), *(kwargs.pop("stopping_criteria", None) or [])])
        if self._pad is not None:
            kwargs.setdefault("pad_token_id", self._pad)
        return self._generate(*args, stopping_criteria=criteria, **kwargs)


class Limits:
    def __init__(self, guard: GenerationGuard, budgets: list[int], should_stop: ShouldStop):
        self._guard = guard
        self._budgets = budgets
        self._should_stop = should_stop

    def __enter__(self) -> set[int]:
        self._guard._budgets = self._budgets
        self._guard._should_stop = self._should_stop
        self._guard._hit = set()
        self._guard._offset = 0
        return self._guard._hit

    def __exit__(self, *_: Any) -> None:
        self._guard._should_stop = never_stop
