"""Translation through any OpenAI-compatible chat endpoint, with the reply validated."""

from __future__ import annotations

import json
import re
from typing import Any

from loguru import logger

from ..config import Settings
from ..errors import NotConfiguredError, UpstreamError
from ..logging import redact_url

FENCE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)
TARGET_NAMES = {"zh": "Simplified Chinese", "yue": "Cantonese (Traditional Chinese characters)"}


def strip_fences(text: str) -> str:
    """Remove one surrounding markdown code fence, if the model added one."""
    match = FENCE.match(text)
    return (match.group(1) if match else text).strip()


def parse_lines(reply: str, count: int) -> list[str] | None:
    """The model's JSON array of `count` strings, or None if it is anything else."""
    try:
        value = json.loads(strip_fences(reply))
    except (ValueError, RecursionError):  # nested past the parser's limit
        return None
    if isinstance(value, dict) and len(value) == 1:  # {"translations": [...]}
        value = next(iter(value.values()))
    if not isinstance(value, list) or len(value) != count:
        return None
    if not all(isinstance(v, str) for v in value):
        return None
    return [v.strip() for v in value]


class Translator:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: Any = None

    @property
    def configured(self) -> bool:
        return bool(self.settings.translate_base_url and self.settings.translate_model)

    def require(self) -> None:
        if not self.configured:
            raise NotConfiguredError(
                "Translation is not configured. Set TRANSLATE_BASE_URL (an OpenAI-compatible "
                "endpoint), TRANSLATE_MODEL and, if needed, TRANSLATE_API_KEY. "
                "Transcription works without them."
            )

    def _openai(self) -> Any:
        if self._client is None:
            try:
                from openai import AsyncOpenAI
            except ImportError as exc:
                raise NotConfiguredError(
                    "Translation needs the openai package: "
                    "pip install 'qwen3-asr-server[translate]'."
                ) from exc
            self._client = AsyncOpenAI(
                base_url=self.settings.translate_base_url,
                api_key=self.settings.translate_api_key or "not-needed",
                timeout=self.settings.translate_timeout,
                max_retries=1,
            )
        return self._client

    async def _chat(self, system: str, user: str, temperature: float) -> str:
        try:
            response = await self._openai().chat.completions.create(
                model=self.settings.translate_model,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                temperature=temperature,
            )
        except Exception as exc:
            where = redact_url(self.settings.translate_base_url or "")
            raise UpstreamError(
                f"The translation model at {where} failed: {type(exc).__name__}: {str(exc)[:300]}"
            ) from exc
        content = response.choices[0].message.content if response.choices else None
        return str(content or "")

    async def text(self, text: str, target: str) -> str:
        if not text.strip():
            return ""
        system = (
            f"You are a professional translator. Translate the user's text into {target}. "
            "Keep names and numbers. Reply with the translation only, no notes."
        )
        temperature = self.settings.translate_temperature
        return strip_fences(await self._chat(system, text, temperature))

    async def lines(self, lines: list[str], target: str) -> list[str]:
        """Translate each line; exactly one translation per line, or 502."""
        if not lines:
            return []
        system = (
            f"You are a professional subtitle translator. Translate each string of the JSON "
            f"array the user sends into {target}. Reply with only a JSON array of exactly "
            f"{len(lines)} strings, one per input string, in the same order."
        )
        user = json.dumps(lines, ensure_ascii=False)
        for attempt in (1, 2):
            reply = await self._chat(system, user, self.settings.translate_srt_temperature)
            parsed = parse_lines(reply, len(lines))
            if parsed is not None:
                return parsed
            logger.warning("translation reply {} did not match {} lines", attempt, len(lines))
        raise UpstreamError(
            f"The translation model did not return {len(lines)} translated lines (tried twice)."
        )


def target_name(code: str, name: str | None) -> str:
    return TARGET_NAMES.get(code, name or code)
