"""Word error rate with the normalisation the accuracy tests state: lower case, no
punctuation, numbers written as words. The normalisation is the black-box suite's
(E2Etest/e2e_support.py), so both suites score alike."""

from __future__ import annotations

import jiwer
from e2e_support import normalize, number_words

__all__ = ["normalize", "number_words", "wer"]


def wer(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER over all pairs (errors summed, divided by reference words)."""
    refs = [normalize(r) for r in references]
    hyps = [normalize(h) for h in hypotheses]
    return float(jiwer.wer(refs, hyps))
