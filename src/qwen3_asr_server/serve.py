"""uvicorn.Server that finalizes streaming sessions before closing their sockets.

uvicorn closes WebSocket connections before it runs the app's lifespan shutdown, so a final
produced there could only be logged. This server asks the app first.
"""

from __future__ import annotations

import socket
from typing import Any

import uvicorn


class Server(uvicorn.Server):
    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        ctx: Any = getattr(getattr(self.config.app, "state", None), "ctx", None)
        if ctx is not None:
            await ctx.sessions.close_all()  # open utterances get their finals, then close
        await super().shutdown(sockets)
