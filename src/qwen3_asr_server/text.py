"""Text helpers: language names and codes, and word-level repetition clean-up."""

from __future__ import annotations

# The 30 languages Qwen3-ASR can be forced to (qwen_asr.inference.utils.SUPPORTED_LANGUAGES),
# keyed by ISO-639-1 code where one exists.
QWEN_LANGUAGES: dict[str, str] = {
    "zh": "Chinese",
    "en": "English",
    "yue": "Cantonese",
    "ar": "Arabic",
    "de": "German",
    "fr": "French",
    "es": "Spanish",
    "pt": "Portuguese",
    "id": "Indonesian",
    "it": "Italian",
    "ko": "Korean",
    "ru": "Russian",
    "th": "Thai",
    "vi": "Vietnamese",
    "ja": "Japanese",
    "tr": "Turkish",
    "hi": "Hindi",
    "ms": "Malay",
    "nl": "Dutch",
    "sv": "Swedish",
    "da": "Danish",
    "fi": "Finnish",
    "pl": "Polish",
    "cs": "Czech",
    "fil": "Filipino",
    "fa": "Persian",
    "el": "Greek",
    "ro": "Romanian",
    "hu": "Hungarian",
    "mk": "Macedonian",
}
NAME_TO_CODE: dict[str, str] = {name.lower(): code for code, name in QWEN_LANGUAGES.items()}
# Other spellings users send.
ALIASES: dict[str, str] = {"tl": "fil", "tagalog": "fil", "mandarin": "zh", "farsi": "fa"}
AUTO = {"", "auto", "none", "detect"}


def parse_language(value: str | None) -> str | None:
    """Map an ISO-639-1 code, a language name or `auto` to an ISO code; None means auto.

    Raises ValueError for a language this table does not know.
    """
    if value is None:
        return None
    key = value.strip().lower().replace("_", "-")
    if key in AUTO:
        return None
    key = ALIASES.get(key, key)
    if key in QWEN_LANGUAGES:
        return key
    base = key.split("-")[0]  # en-US -> en
    if base in QWEN_LANGUAGES:
        return base
    if key in NAME_TO_CODE:
        return NAME_TO_CODE[key]
    raise ValueError(f"unknown language {value!r}")


def language_name(code: str | None) -> str | None:
    """ISO code -> Qwen's canonical name (`en` -> `English`)."""
    return QWEN_LANGUAGES.get(code) if code else None


def language_code(name: str | None) -> str | None:
    """Engine-reported language (`English`, `en`) -> ISO code, or None if unknown/empty."""
    if not name:
        return None
    key = name.strip().lower()
    if key in QWEN_LANGUAGES:
        return key
    return NAME_TO_CODE.get(key)


def collapse_repetitions(text: str, min_repeats: int = 4, max_ngram: int = 4) -> str:
    """Collapse a word n-gram repeated `min_repeats` or more times in a row to one copy.

    Catches decoder loops like "the the the the" or "thank you thank you thank you thank you"
    that survive the SDK's own (character-level, threshold 20) clean-up. Comparison ignores
    case and trailing punctuation; the first copy is kept as written.
    """
    words = text.split()
    if len(words) < min_repeats:
        return text
    changed = False
    for n in range(1, max_ngram + 1):
        keys = [w.lower().strip(".,!?;:…。，！？") for w in words]
        out: list[str] = []
        i = 0
        while i < len(words):
            gram = keys[i : i + n]
            reps = 1
            while len(gram) == n and keys[i + reps * n : i + (reps + 1) * n] == gram:
                reps += 1
            if len(gram) == n and reps >= min_repeats and any(gram):
                out.extend(words[i : i + n])
                i += reps * n
                changed = True
            else:
                out.append(words[i])
                i += 1
        words = out
    return " ".join(words) if changed else text


def is_cjk(char: str) -> bool:
    """Chinese, Japanese kana, Korean Hangul and their full-width punctuation."""
    code = ord(char)
    return (
        0x3000 <= code <= 0x30FF  # CJK punctuation, Hiragana, Katakana
        or 0x3400 <= code <= 0x4DBF  # CJK Extension A
        or 0x4E00 <= code <= 0x9FFF  # CJK Unified Ideographs
        or 0xAC00 <= code <= 0xD7AF  # Hangul syllables
        or 0xF900 <= code <= 0xFAFF  # CJK compatibility ideographs
        or 0xFF00 <= code <= 0xFFEF  # full-width forms
    )


def join_texts(parts: list[str]) -> str:
    """Join segment texts: a space between words, none between two CJK characters."""
    out = ""
    for part in parts:
        part = part.strip()
        if not part:
            continue
        if out and not (is_cjk(out[-1]) and is_cjk(part[0])):
            out += " "
        out += part
    return out


def split_words(text: str) -> list[str]:
    """Space-separated words; each CJK character is its own word."""
    words: list[str] = []
    for token in text.split():
        buf = ""
        for char in token:
            if is_cjk(char):
                if buf:
                    words.append(buf)
                    buf = ""
                words.append(char)
            else:
                buf += char
        if buf:
            words.append(buf)
    return words


MAX_LABEL_CHARS = 64  # a speaker's or channel's name: a voice tag, not a paragraph


def bad_label(name: str) -> bool:
    """Whether a name cannot label SRT and VTT cues (`[name] `, `<v name>`): longer than
    MAX_LABEL_CHARS, or holding <, >, [, ], a line break or `-->` (which would make a cue
    of its own). The rule of `known_speaker_names[]` and `channel_names[]`."""
    breaks = any(c in name for c in "<>[]\r\n\u2028\u2029")
    return breaks or "-->" in name or len(name.strip()) > MAX_LABEL_CHARS


def letter(index: int) -> str:
    """A speaker's letter: 0 -> A, 25 -> Z, 26 -> AA."""
    out = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        out = chr(ord("A") + rest) + out
    return out


def letter_index(label: str | None) -> int | None:
    """`letter`'s inverse: A, B, ..., Z, AA -> 0, 1, ..., 25, 26; None for anything else."""
    if not label or not label.isascii() or not label.isalpha() or not label.isupper():
        return None
    number = 0
    for char in label:
        number = number * 26 + (ord(char) - ord("A") + 1)
    return number - 1
