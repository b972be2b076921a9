"""`python -m qwen3_asr_server`: run uvicorn with the app factory, settings from env/.env."""

from __future__ import annotations

import os
import sys

import uvicorn
from pydantic import ValidationError

from .app import create_app
from .config import Settings
from .serve import Server


def main() -> None:
    try:
        settings = Settings()
    except ValidationError as exc:  # a bad setting: say which and how, no traceback
        for error in exc.errors():
            name = "_".join(str(part) for part in error["loc"]).upper()
            where = f"{name}: " if name else ""
            message = error["msg"].removeprefix("Value error, ")
            print(f"qwen3-asr-server: {where}{message}", file=sys.stderr)
        sys.exit(2)
    if settings.pytorch_cuda_alloc_conf:  # torch reads it from the environment
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", settings.pytorch_cuda_alloc_conf)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,  # our InterceptHandler routes uvicorn's logs through loguru
        access_log=True,
        ws_max_size=4 * settings.ws_max_frame_bytes,  # beyond: the protocol closes (1009)
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )
    Server(config).run()


if __name__ == "__main__":
    main()
