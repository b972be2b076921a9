"""Word error rate with the normalisation the accuracy tests state: lower case, no
punctuation, numbers written as words."""

from __future__ import annotations

import re

import jiwer

ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    if n < 1000:
        rest = "" if n % 100 == 0 else " " + number_words(n % 100)
        return ONES[n // 100] + " hundred" + rest
    if n < 1_000_000:
        rest = "" if n % 1000 == 0 else " " + number_words(n % 1000)
        return number_words(n // 1000) + " thousand" + rest
    return str(n)


def normalize(text: str) -> str:
    text = text.lower().replace("-", " ")
    text = re.sub(r"\d+", lambda m: " " + number_words(int(m.group())) + " ", text)
    text = re.sub(r"[^\w\s']", " ", text).replace("'", "")
    return " ".join(text.split())


def wer(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER over all pairs (errors summed, divided by reference words)."""
    refs = [normalize(r) for r in references]
    hyps = [normalize(h) for h in hypotheses]
    return float(jiwer.wer(refs, hyps))
