"""GET / and /ui: the browser page (static files in ../web), and the language list it offers.

The page loads without a key; it calls the API like any other client, with the key the user
enters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from ..text import QWEN_LANGUAGES

WEB_DIR = Path(__file__).resolve().parent.parent / "web"

router = APIRouter(include_in_schema=False)


@router.get("/")
@router.get("/ui")
async def index() -> FileResponse:
    return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/ui/languages.json")
async def languages() -> dict[str, Any]:
    return {"languages": [{"code": c, "name": n} for c, n in QWEN_LANGUAGES.items()]}


def install_ui(app: FastAPI) -> None:
    """The page's router and its static files under /ui/static."""
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=WEB_DIR), name="ui-static")
