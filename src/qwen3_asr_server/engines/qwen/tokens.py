"""What a Qwen3-ASR decode's tokens say beyond its text: per-token log probabilities (the
text tokens only, after the `language X<asr_text>` header), token counts for `usage`, and
the header token ids that restrict language detection to candidate languages.

The tokenizer is byte-level BPE (GPT-2's byte map): a token's bytes come from inverting
that map, so a token that holds part of a UTF-8 character still has its exact bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from ...transcript import TokenLogprob, TokenUsage

ASR_TEXT = "<asr_text>"  # the end of the header the model writes: `language English<asr_text>`
NO_SPEECH = "None"  # the model's language name for audio without speech


@dataclass
class RowRecord:
    """What the generation guard saw of one row (one request) of a decode."""

    input_tokens: int = 0
    audio_tokens: int = 0
    generated: list[int] = field(default_factory=list)  # up to and with the end token
    logprobs: list[float] = field(default_factory=list)  # one per generated token, if asked


@cache
def byte_decoder() -> dict[str, int]:
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if piece is None:  # an id past the vocabulary (padded embeddings): no text
        return b""
    if token_id in tokenizer.added_tokens_decoder:  # special and added tokens: their text
        return str(piece).encode("utf-8")
    decoder = byte_decoder()
    try:
        return bytes(decoder[c] for c in piece)
    except KeyError:
        return str(piece).encode("utf-8")


def header_ids(tokenizer: Any, names: list[str]) -> list[list[int]]:
    """The token ids of `language {name}<asr_text>` for each candidate (and for no speech)."""
    texts = [f"language {name}{ASR_TEXT}" for name in [*names, NO_SPEECH]]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def text_logprobs(
    tokenizer: Any, record: RowRecord, end_ids: tuple[int, ...]
) -> list[TokenLogprob]:
    """The text tokens' log probabilities: after the header's `<asr_text>` (when the model
    wrote one), before the end token."""
    ids = record.generated
    start = 0
    marker = tokenizer.convert_tokens_to_ids(ASR_TEXT)
    if marker in ids:
        start = ids.index(marker) + 1
    out = []
    special = set(tokenizer.all_special_ids)  # dropped from the text (skip_special_tokens)
    for i in range(start, min(len(ids), len(record.logprobs))):
        if ids[i] in end_ids:
            break
        if ids[i] in special:
            continue
        raw = token_bytes(tokenizer, ids[i])
        text = raw.decode("utf-8", errors="replace")
        out.append(TokenLogprob(text, min(0.0, float(record.logprobs[i])), tuple(raw)))
    return out


def usage(record: RowRecord) -> TokenUsage:
    """Input: the prompt's tokens (audio positions, the chat template, the context); output:
    every generated token, the language header and the end token included."""
    return TokenUsage(
        audio_tokens=record.audio_tokens,
        text_tokens=max(0, record.input_tokens - record.audio_tokens),
        output_tokens=len(record.generated),
    )
