"""A stand-in for `vllm serve Qwen/Qwen3-ASR-1.7B`: the routes the remote engine uses, with
vLLM's transcription request schema, answering at once. Run as its own process:

    python tests/vllm_standin.py PORT [--api-key KEY] [--basic USER:PASS] [--delay SECONDS]
        [--gate]

Every form the front sends is validated against `TranscriptionRequest` below: the fields,
types and defaults of vLLM's own `TranscriptionRequest(OpenAIBaseModel)` (read from
vllm/entrypoints/openai/protocol.py of the releases that serve Qwen3-ASR, 0.15.x: file,
model, language, prompt, response_format, timestamp_granularities[], stream and its two
usage flags, vllm_xargs, to_language, then the sampling fields temperature, top_p, top_k,
min_p, seed, frequency_penalty, repetition_penalty, presence_penalty,
max_completion_tokens). One difference: vLLM's OpenAIBaseModel accepts unknown fields and
only logs that it ignores them; here they are refused, so a field the front sends that
vLLM would silently drop fails the test. The file must be a 16 kHz mono WAV.
`GET /seen` lists what arrived (for tests and bench/scale.py).
With `--basic` the routes want HTTP Basic auth instead of the bearer key (a backend behind a
proxy that checks a password).
With `--delay` each answer takes that long, and a client that disconnects meanwhile is
recorded (`disconnected`), as vLLM aborts such a request. With `--gate` no answer leaves
before `POST /open`. `GET /inflight` says how many requests it holds now and at most so far.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import time
from typing import Any, Literal

import soundfile as sf
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MODEL = "Qwen/Qwen3-ASR-1.7B"
AudioResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]


class TranscriptionRequest(BaseModel):
    """vLLM's fields (the multipart form), with their types, defaults and ranges."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model: str | None = None
    language: str | None = None
    prompt: str = ""
    response_format: AudioResponseFormat = "json"
    timestamp_granularities: list[Literal["word", "segment"]] = Field(
        default_factory=list, alias="timestamp_granularities[]"
    )
    stream: bool | None = False
    stream_include_usage: bool | None = False
    stream_continuous_usage_stats: bool | None = False
    vllm_xargs: dict[str, str | int | float] | None = None
    to_language: str | None = None
    temperature: float = Field(default=0.0)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = None
    presence_penalty: float | None = 0.0
    max_completion_tokens: int | None = None


def error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    """vLLM's ErrorResponse."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


def create_app(
    api_key: str | None = None, delay: float = 0.0, basic: str | None = None, gate: bool = False
) -> FastAPI:
    app = FastAPI()
    seen: list[dict[str, Any]] = []
    opened = asyncio.Event()
    if not gate:
        opened.set()
    inflight = {"now": 0, "max": 0}

    def authorized(request: Request) -> bool:
        got = request.headers.get("authorization")
        if basic:
            return got == "Basic " + base64.b64encode(basic.encode()).decode()
        return not api_key or got == f"Bearer {api_key}"

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        if not authorized(request):
            return error(401, "Unauthorized", "Unauthorized")
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "vllm"}]}

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Any:
        if not authorized(request):
            return error(401, "Unauthorized", "Unauthorized")
        form = await request.form()
        fields = {k: v for k, v in form.multi_items() if k != "file"}
        upload = form.get("file")
        record: dict[str, Any] = {"fields": fields, "problems": []}
        seen.append(record)
        try:
            parsed = TranscriptionRequest.model_validate(fields)
        except ValidationError as exc:
            record["problems"].append(str(exc))
            return error(400, str(exc))
        if parsed.model not in (None, MODEL):
            record["problems"].append(f"model {parsed.model}")
            return error(404, f"The model `{parsed.model}` does not exist.", "NotFoundError")
        if upload is None or isinstance(upload, str):
            record["problems"].append("no file")
            return error(400, "file is required")
        data = await upload.read()
        info = sf.info(io.BytesIO(data))
        record.update(sample_rate=info.samplerate, channels=info.channels, seconds=info.duration)
        if info.samplerate != 16000 or info.channels != 1:
            record["problems"].append(f"{info.samplerate} Hz x {info.channels}")
        inflight["now"] += 1
        inflight["max"] = max(inflight["max"], inflight["now"])
        try:
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline or not opened.is_set():
                if await request.is_disconnected():
                    record["disconnected"] = time.time()
                    return Response(status_code=499)
                await asyncio.sleep(0.02)
        finally:
            inflight["now"] -= 1
        return {
            "text": f"stand-in heard {info.duration:.2f} seconds",
            "usage": {"type": "duration", "seconds": round(info.duration)},
        }

    @app.get("/seen")
    async def seen_requests() -> list[dict[str, Any]]:
        return seen

    @app.get("/inflight")
    async def held() -> dict[str, int]:
        return inflight

    @app.post("/open")
    async def open_gate() -> dict[str, int]:
        opened.set()
        return inflight

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--api-key")
    parser.add_argument("--basic", help="USER:PASS the routes want as HTTP Basic auth")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--gate", action="store_true", help="hold every answer until POST /open")
    args = parser.parse_args()
    app = create_app(args.api_key, args.delay, args.basic, args.gate)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
