from wer import normalize, wer


def test_normalize_numbers_and_punctuation() -> None:
    assert normalize("Every 20 minutes, at 9!") == "every twenty minutes at nine"
    assert normalize("Round-fark") == "round fark"
    assert normalize("It's 105.") == "its one hundred five"


def test_wer_counts_errors() -> None:
    assert wer(["the cat sat"], ["the cat sat"]) == 0.0
    assert wer(["the cat sat"], ["the dog sat"]) == 1 / 3
