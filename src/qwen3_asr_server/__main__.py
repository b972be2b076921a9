"""`python -m qwen3_asr_server`: run uvicorn with the app factory, settings from env/.env."""

from __future__ import annotations

import uvicorn

from .app import create_app
from .config import Settings
from .serve import Server


def main() -> None:
    settings = Settings()
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,  # our InterceptHandler routes uvicorn's logs through loguru
        access_log=True,
        ws_max_size=4 * settings.ws_max_frame_bytes,  # beyond: the protocol closes (1009)
    )
    Server(config).run()


if __name__ == "__main__":
    main()
