"""`python -m qwen3_asr_server`: run uvicorn with the app factory, settings from env/.env."""

from __future__ import annotations

import uvicorn

from .app import create_app
from .config import Settings


def main() -> None:
    settings = Settings()
    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,  # our InterceptHandler routes uvicorn's logs through loguru
        access_log=True,
        ws_max_size=4 * 1024 * 1024,
    )


if __name__ == "__main__":
    main()
