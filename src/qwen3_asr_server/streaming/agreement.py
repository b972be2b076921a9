"""Partial stability: LocalAgreement-2 (the prefix two consecutive hypotheses agree on is
stable) over the confident part of each draft."""

from __future__ import annotations

from dataclasses import dataclass

from ..text import collapse_repetitions, join_texts, split_words
from ..transcript import TokenLogprob

# A partial's words stop before the first word whose least likely token is below this
# (except in an utterance's first partial, which comes as early as possible). Measured with
# bench/streaming.py on the 12 committed sentences (whisper tiny.en drafts): partial words
# later revised 29% -> 13% at 0.3, 8% at 0.35, 5% at 0.4, with fewer words shown.
MIN_WORD_PROB = 0.35


@dataclass(frozen=True)
class Draft:
    """A partial hypothesis with each word's lowest token probability."""

    words: list[tuple[str, float]]
    logprobs: tuple[TokenLogprob, ...] | None = None  # the decode's tokens, when asked

    def confident_text(self, min_prob: float) -> str:
        """The words up to the first one below `min_prob`, and up to a restart: a draft of
        cut-off audio often begins the sentence again ("Please call me... Please call")."""
        keys = [_key(word) for word, _ in self.words]
        kept: list[str] = []
        for i, (word, probability) in enumerate(self.words):
            restart = 0 < i < len(keys) - 1 and keys[i : i + 2] == keys[:2]
            if probability < min_prob or restart:
                break
            kept.append(word)
            if word.endswith(("...", "…")):
                break
        return collapse_repetitions(join_texts(kept))


def _key(word: str) -> str:
    return word.lower().strip(".,!?;:…。，！？、\"'")


class LocalAgreement:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._previous: list[str] = []
        self._stable: list[str] = []

    def update(self, hypothesis: str) -> str:
        """Feed the newest hypothesis of the open utterance; return the stable prefix.

        Stable text only grows within an utterance: a word, once agreed, stays.
        """
        words = split_words(hypothesis)
        agreed = 0
        for a, b in zip(self._previous, words, strict=False):
            if _key(a) != _key(b):
                break
            agreed += 1
        # Grow only when both hypotheses also agree with what is already stable: a later
        # pair that agrees on a different start ("A quick brown" after stable "The quick")
        # must not replace it; clients were already told those words will not change.
        fixed = len(self._stable)
        if agreed > fixed and [_key(w) for w in words[:fixed]] == [_key(w) for w in self._stable]:
            self._stable = self._stable + words[fixed:agreed]
        self._previous = words
        return join_texts(self._stable)

    @property
    def stable(self) -> str:
        return join_texts(self._stable)


def held_back(text: str, stable: str) -> str:
    """The stable words, then the hypothesis's words after them without its last word,
    which the audio usually cuts in the middle (the next partial or the final brings it).
    A one-word hypothesis stays whole (the first partial comes as early as before). The
    result always starts with the stable text."""
    words, fixed = split_words(text), split_words(stable)
    tail = words[len(fixed) : -1 if len(words) >= 2 else None]
    return join_texts(fixed + tail)
