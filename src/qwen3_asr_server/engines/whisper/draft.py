"""Fast drafts for streaming partials on the whisper engine.

faster-whisper always encodes 30 s of audio (3000 mel frames), padding a 3 s partial with
27 s of silence: on 2 CPU cores that encoder pass is ~80% of a short call (~380 of ~480 ms
for tiny.en). CTranslate2's encoder also takes fewer frames; encoding the audio plus 1 s
costs ~55 ms for 3 s. Whisper was trained on 30 s windows, so the shorter context costs some
accuracy (WER 0.216 against 0.180 on the 13 committed espeak-ng clips, same decoding): good
enough for a partial that the final replaces, not for the final itself.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...audio.pcm import SAMPLE_RATE

FRAMES_PER_SECOND = 100
MARGIN_S = 0.5  # silence after the audio: room for the last word, little for inventions
MAX_DRAFT_S = 28.0  # beyond this the full 30 s window costs the same
# Token budget: speech runs at ~3-4 tokens per second. Without it a draft of the first
# 0.3 s of an utterance can loop to the model's 448 tokens (~3 s on 2 cores).
BASE_TOKENS, TOKENS_PER_SECOND = 6, 6


def draft_words(model: Any, audio: np.ndarray, language: str) -> list[tuple[str, float]]:
    """Greedy words of ≤ 28 s of audio, encoded with a window just longer than the audio,
    each with the lowest probability of its tokens (a word starts at a token that begins
    with a space)."""
    import ctranslate2
    from faster_whisper.tokenizer import Tokenizer

    features = model.feature_extractor(audio)
    frames = min(
        3000, math.ceil((len(audio) / SAMPLE_RATE + MARGIN_S) * 10) * FRAMES_PER_SECOND // 10
    )
    window = np.zeros((features.shape[0], frames), dtype=np.float32)
    used = min(frames, features.shape[1])
    window[:, :used] = features[:, :used]
    encoded = model.model.encode(ctranslate2.StorageView.from_array(window[None]), to_cpu=False)
    tokenizer = Tokenizer(
        model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language=language
    )
    prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
    budget = len(prompt) + BASE_TOKENS + int(TOKENS_PER_SECOND * len(audio) / SAMPLE_RATE)
    result = model.model.generate(
        encoded,
        [prompt],
        beam_size=1,
        max_length=min(budget, model.max_length),
        suppress_blank=True,
        return_logits_vocab=True,
    )[0]
    groups: list[tuple[list[int], float]] = []
    for tid, logits in zip(result.sequences_ids[0], result.logits[0], strict=False):
        probability = token_probability(np.asarray(logits), tid)
        if groups and not str(tokenizer.decode([tid])).startswith(" "):
            ids, lowest = groups[-1]
            groups[-1] = ([*ids, tid], min(lowest, probability))
        else:
            groups.append(([tid], probability))
    words = [(str(tokenizer.decode(ids)).strip(), p) for ids, p in groups]
    return [(word, p) for word, p in words if word]


def token_probability(logits: np.ndarray, token: int) -> float:
    """Softmax probability of `token` from one step's scores over the vocabulary."""
    scores = logits.astype(np.float64)
    scores -= scores.max()
    return float(np.exp(scores[token]) / np.exp(scores).sum())
