"""What a faster-whisper decode gives beyond its text, for the 2026 OpenAI fields:

- candidate languages (`languages[]`): whisper's own language detection, restricted to the
  candidates (the most likely of them);
- keywords (`keywords[]`): faster-whisper's `hotwords`, which share the decoder's prompt with
  the request's prompt (trimmed so that both fit);
- per-token log probabilities (`include[]=logprobs`): faster-whisper keeps none from its beam
  search, so each text token of the final transcript is scored in one teacher-forced pass of
  the decoder over its audio (CTranslate2's `align`, the pass whisper's word probabilities
  come from): log P(token | audio, the tokens before it), without the prompt or hotwords.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...audio.pcm import SAMPLE_RATE
from ...transcript import Segment, TokenLogprob
from ..qwen.tokens import byte_decoder

WINDOW = 30 * SAMPLE_RATE  # whisper's encoder window
HOP = 160  # feature frames are 10 ms
# The decoder's prompt holds at most 223 tokens; hotwords and the prompt each get that much,
# so together they could leave no room for text. Characters are ~4 per token.
PROMPT_CHARS = 880


def hotwords(keywords: tuple[str, ...]) -> str | None:
    return ", ".join(keywords) or None


def fitted_prompt(prompt: str | None, keywords: tuple[str, ...]) -> str | None:
    """The end of the prompt (whisper reads the last tokens) that fits beside the hotwords."""
    if not prompt:
        return None
    room = max(0, PROMPT_CHARS - len(hotwords(keywords) or ""))
    return prompt[-room:] if room else None


def pick_language(model: Any, audio: np.ndarray, candidates: tuple[str, ...]) -> str:
    """The candidate whisper finds most likely in the first 30 s."""
    _, _, probs = model.detect_language(audio=audio[:WINDOW])
    scores = {code: p for code, p in probs if code in candidates}
    return max(candidates, key=lambda code: scores.get(code, 0.0))


def token_logprobs(
    model: Any, audio: np.ndarray, segments: list[Segment], language: str | None
) -> list[TokenLogprob]:
    """Each text token of `segments`, scored on the audio of its 30 s window."""
    from faster_whisper.tokenizer import Tokenizer

    tokenizer = Tokenizer(
        model.hf_tokenizer,
        model.model.is_multilingual,
        task="transcribe",
        language=language or "en",
    )
    out: list[TokenLogprob] = []
    for start, end, tokens in windows(segments, tokenizer.eot):
        piece = audio[start:end]
        features = model.feature_extractor(piece)[:, : WINDOW // HOP]
        padded = np.zeros((features.shape[0], WINDOW // HOP), dtype=np.float32)
        padded[:, : features.shape[1]] = features
        encoded = model.encode(padded)
        result = model.model.align(encoded, tokenizer.sot_sequence, [tokens], len(piece) // HOP)[0]
        for token, prob in zip(tokens, result.text_token_probs, strict=False):
            raw = token_bytes(model.hf_tokenizer, token)
            logprob = float(np.log(max(prob, 1e-12)))
            out.append(
                TokenLogprob(raw.decode("utf-8", errors="replace"), min(0.0, logprob), tuple(raw))
            )
    return out


def windows(segments: list[Segment], eot: int) -> list[tuple[int, int, list[int]]]:
    """Consecutive segments grouped into ≤ 30 s windows: (start, end sample, text tokens)."""
    out: list[tuple[int, int, list[int]]] = []
    for s in segments:
        tokens = [t for t in s.tokens if t < eot]  # timestamp and special tokens are above
        a, b = int(s.start * SAMPLE_RATE), int(s.end * SAMPLE_RATE)
        if out and b - out[-1][0] <= WINDOW:
            out[-1] = (out[-1][0], b, out[-1][2] + tokens)
        else:
            out.append((a, max(b, a + 1), tokens))
    return [w for w in out if w[2]]


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    piece = tokenizer.id_to_token(token_id)
    if piece is None:
        return b""
    decoder = byte_decoder()
    try:
        return bytes(decoder[c] for c in piece)
    except KeyError:
        return piece.encode("utf-8")
