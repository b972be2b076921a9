"""A small picklable description of a local engine: what `create_engine` decided from the
settings, which a worker child builds again without the whole Settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .base import Engine


@dataclass(frozen=True)
class EngineSpec:
    kind: Literal["qwen", "whisper"]
    model_id: str
    options: dict[str, Any] = field(default_factory=dict)  # the engine's keyword arguments

    def build(self) -> Engine:
        """The engine, constructed (cheap: nothing heavy is imported until `load()`)."""
        if self.kind == "whisper":
            from .whisper.engine import WhisperEngine

            return WhisperEngine(self.model_id, **self.options)
        from .qwen.engine import QwenEngine

        return QwenEngine(self.model_id, **self.options)
