"""A small OpenAI-compatible chat server with deterministic replies, for translation tests.

Replies: each string is "<TARGET-TAG>:" + the string upper-cased. `mode` makes it misbehave:
fenced (```json fences), short_once (one item missing on the first call), short (always),
garbage (not JSON), deep (JSON nested past the parser's recursion limit), error (HTTP 500).
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def tag(system: str) -> str:
    return "ZH" if "Chinese" in system else "EN"


def create_fake_llm() -> FastAPI:
    app = FastAPI()
    app.state.mode = "ok"
    app.state.calls = []

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        app.state.calls.append(body)
        mode = app.state.mode
        if mode == "error":
            return JSONResponse({"error": {"message": "model crashed"}}, status_code=500)
        system = body["messages"][0]["content"]
        user = body["messages"][1]["content"]
        if "JSON array" in system:
            items = [f"{tag(system)}:{s.upper()}" for s in json.loads(user)]
            if mode == "short" or (mode == "short_once" and len(app.state.calls) == 1):
                items = items[:-1]
            content = json.dumps(items, ensure_ascii=False)
        else:
            content = f"{tag(system)}:{user.upper()}"
        if mode == "fenced":
            content = f"```json\n{content}\n```"
        if mode == "garbage":
            content = "Sure! Here is your translation: ..."
        if mode == "deep":
            content = "[" * 100_000 + "]" * 100_000
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
        }

    return app
