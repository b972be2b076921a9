"""LocalAgreement-2: the prefix two consecutive hypotheses agree on is stable."""

from __future__ import annotations

from ..text import join_texts, split_words


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
        if agreed > len(self._stable):
            self._stable = words[:agreed]
        self._previous = words
        return join_texts(self._stable)

    @property
    def stable(self) -> str:
        return join_texts(self._stable)
