from __future__ import annotations

import pytest

from qwen3_asr_server.text import collapse_repetitions, language_code, parse_language


@pytest.mark.parametrize(
    ("given", "code"),
    [
        ("en", "en"),
        ("EN", "en"),
        ("en-US", "en"),
        ("English", "en"),
        ("chinese", "zh"),
        ("zh", "zh"),
        ("yue", "yue"),
        ("Cantonese", "yue"),
        ("auto", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_language(given: str | None, code: str | None) -> None:
    assert parse_language(given) == code


@pytest.mark.parametrize("bad", ["xx", "Klingon", "english please"])
def test_unknown_language_raises(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_language(bad)


def test_language_code_from_engine_output() -> None:
    assert language_code("English") == "en"
    assert language_code("en") == "en"
    assert language_code("") is None
    assert language_code("None") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("the the the the", "the"),
        ("and then the the the the the cat", "and then the cat"),
        ("Thank you. Thank you. Thank you. Thank you.", "Thank you."),
        ("very very good", "very very good"),  # two is speech, not a loop
        ("one two three", "one two three"),
        ("", ""),
    ],
)
def test_collapse_repetitions(text: str, expected: str) -> None:
    assert collapse_repetitions(text) == expected
