"""What the WebSocket endpoints share: auth, the bounded outbox, session wiring."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi import WebSocket
from loguru import logger
from starlette.routing import get_route_path

from ...engines.base import TranscribeRequest
from ...errors import AuthError
from ...streaming.agreement import Draft
from ...streaming.channels import ChannelGroup
from ...streaming.events import Emit
from ...streaming.ingest import PcmIngest
from ...streaming.registry import SessionLimitError
from ...streaming.session import CLIENT_GONE, AudioSource, Heard, StreamConfig, StreamSession
from ..deps import AppContext, check_api_key
from ..secret_store import REALTIME_PATH, SCOPE_KEY

KEY_SUBPROTOCOL = "openai-insecure-api-key."


def any_key_ok(ctx: AppContext, tokens: list[str]) -> bool:
    """One of `tokens` is API_KEY (or no key is set); compared in constant time."""
    expected = ctx.settings.api_key
    if not expected:
        return True
    for token in tokens:
        try:
            check_api_key(expected, "Bearer " + token)
        except AuthError:
            continue
        return True
    return False


def websocket_api_key_ok(ctx: AppContext, websocket: WebSocket) -> bool:
    """Any one of: a bearer header; the `api_key` query parameter; or, as the OpenAI JS SDK
    sends it from browsers (which cannot set headers), the subprotocol
    `openai-insecure-api-key.<key>`. On /v1/realtime only, an unexpired client secret
    (`ek_…`, POST /v1/realtime/client_secrets) in any of these places opens it too; what it
    grants is kept in the scope (`secret_store.granted_secret`)."""
    offered: list[str] = list(websocket.scope.get("subprotocols") or [])
    keys = [p.removeprefix(KEY_SUBPROTOCOL) for p in offered if p.startswith(KEY_SUBPROTOCOL)]
    query_key = websocket.query_params.get("api_key")
    header = websocket.headers.get("authorization") or ""
    scheme, _, bearer = header.partition(" ")
    tokens = [bearer.strip()] if scheme.lower() == "bearer" else []
    tokens = [key for key in [*tokens, query_key, *keys] if key]
    if get_route_path(websocket.scope) == REALTIME_PATH:
        for token in tokens:
            granted = ctx.client_secrets.lookup(token)
            if granted is not None:
                websocket.scope[SCOPE_KEY] = granted
                return True
    return any_key_ok(ctx, tokens)


def choose_subprotocol(websocket: WebSocket) -> str | None:
    """The subprotocol to echo when accepting: `realtime` if offered, else the first offered
    one, never one that carries a key. A browser that offered subprotocols fails the
    handshake when none is echoed."""
    offered: list[str] = list(websocket.scope.get("subprotocols") or [])
    usable = [p for p in offered if not p.startswith(KEY_SUBPROTOCOL)]
    if "realtime" in usable:
        return "realtime"
    return usable[0] if usable else None


class Outbox:
    """Events for one client, sent by one task. Bounded: when the client does not read,
    partials are dropped (a newer one supersedes them) and finals wait a little, then the
    session is closed as too slow. Server memory never grows with a slow reader."""

    def __init__(self, websocket: WebSocket, size: int, final_wait: float = 10.0) -> None:
        self._ws = websocket
        self._queue: asyncio.Queue[str | None] = asyncio.Queue(size)
        self._final_wait = final_wait
        self._task = asyncio.create_task(self._send_loop())
        self.dead = False
        self.dropped = 0

    async def put(self, message: dict[str, Any], droppable: bool = False) -> None:
        if self.dead:
            logger.debug("client gone, not sent: {}", message)
            return
        text = json.dumps(message, ensure_ascii=False)
        if droppable:
            try:
                self._queue.put_nowait(text)
            except asyncio.QueueFull:
                self.dropped += 1
            return
        try:
            await asyncio.wait_for(self._queue.put(text), self._final_wait)
        except TimeoutError:  # the connection loop sees `dead` and closes the session
            self.dead = True
            logger.warning("client does not read its messages; closing the session")
            logger.debug("not sent: {}", message)

    async def _send_loop(self) -> None:
        while True:
            text = await self._queue.get()
            if text is None:
                return
            try:
                await self._ws.send_text(text)
            except Exception:
                self.dead = True
                return
            finally:
                self._queue.task_done()

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait (bounded) until everything queued has been sent."""
        if not self.dead:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), timeout)

    async def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (bounded wait), then stop."""
        if not self.dead:
            try:
                await asyncio.wait_for(self._queue.put(None), timeout)
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except TimeoutError:
                pass
        self._task.cancel()


def route_of(websocket: WebSocket) -> str:
    """The route template a stream came by: the `route` label of its metrics, as on HTTP's."""
    return getattr(websocket.scope.get("route"), "path", None) or get_route_path(websocket.scope)


def message_bytes(received: MutableMapping[str, Any]) -> int:
    """A received message's size in bytes, as WS_MAX_FRAME_BYTES counts it: a text message's
    UTF-8 length, not its length in characters (up to 4 bytes each)."""
    data, text = received.get("bytes"), received.get("text")
    if data is not None:
        return len(data)
    if not text or text.isascii():
        return len(text or "")
    return len(text.encode("utf-8", "surrogatepass"))


def new_session(ctx: AppContext, config: StreamConfig, emit: Emit, route: str) -> StreamSession:
    """Partials are fast drafts on whisper (a short encoder window); only their confident
    words become stable, so Realtime API deltas, which clients append, rarely disagree with
    the final (4% of delta words against 16% with full-window partials, LEARNING_LOG.md).
    Every partial and final is decoded with the session's template (`config.decoding`:
    language, candidates, prompt, keywords, and logprobs when the session asks: Realtime
    deltas carry the tokens of the partial they came from). Its finals' latency is observed
    under `route` (`route_of`)."""

    async def transcribe(
        audio: AudioSource, decoding: TranscribeRequest, partial: bool
    ) -> str | Draft | Heard:
        result = await ctx.transcriber.transcribe_realtime(
            audio,
            decoding,
            partial=partial,
            draft=partial,
            background=session.client_gone,
        )
        logprobs = tuple(result.logprobs) if result.logprobs is not None else None
        if partial:
            if result.word_probs is not None:
                return Draft(result.word_probs, logprobs)
            return Heard(result.text, logprobs=logprobs) if logprobs is not None else result.text
        return Heard(result.text, result.language, logprobs, result.usage)

    metrics = ctx.metrics
    observe = metrics.final_latency.labels(route).observe
    lag = metrics.stream_lag.observe
    session = StreamSession(config, transcribe, emit, ctx.vad, observe, lag, ctx.voices)
    return session


def base_config(
    ctx: AppContext, use_vad: bool, decoding: TranscribeRequest | None = None
) -> StreamConfig:
    """The stream config of a new session on either endpoint, from the WS_* settings (the
    prefix padding is StreamConfig's: no setting, a Realtime session.update sets it)."""
    s = ctx.settings
    return StreamConfig(
        use_vad=use_vad,
        decoding=decoding or TranscribeRequest(),
        vad_threshold=s.ws_vad_threshold,
        end_silence_ms=s.ws_end_silence_ms,
        partial_interval_s=s.ws_partial_interval,
        window_max_s=s.ws_window_max_s,
        max_utterance_s=s.ws_max_utterance_s,
        flush_silence_ms=s.ws_flush_silence_ms,
        max_pending_s=s.ws_max_pending_s,
        speaker_wait_s=s.ws_speaker_wait_s,
    )


async def register(
    ctx: AppContext,
    session: StreamSession | ChannelGroup,
    outbox: Outbox,
    route: str,
    drain: Callable[[], Awaitable[None]] | None = None,
) -> str | None:
    """Add the session to the bounded registry (a ChannelGroup takes a seat per channel),
    counted under `route`; on refusal, release it and say why. `drain` (default: the
    outbox's) runs at shutdown once the session's last final is out."""
    try:
        ctx.sessions.add(session, drain or outbox.drain, route)
    except SessionLimitError as exc:
        await session.close("rejected")
        await outbox.close()
        return str(exc)
    return None


Message = MutableMapping[str, Any]
Handler = Callable[[Message], Awaitable[str | None]]


@dataclass(frozen=True)
class Ending:
    """How a protocol ends its sessions (the defaults: ours and Realtime's). `idle_s`: the
    idle timeout (None: WS_IDLE_TIMEOUT); `farewell`: sent after the last final, while the
    client still reads (given the reason); `close_code`: the close frame's code and reason
    for an ending reason."""

    idle_s: float | None = None
    farewell: Callable[[str], Awaitable[None]] | None = None
    close_code: Callable[[str], tuple[int, str]] | None = None


async def serve_session(
    ctx: AppContext,
    websocket: WebSocket,
    session: StreamSession | ChannelGroup,
    outbox: Outbox,
    handle: Handler,
    idle_error: dict[str, Any] | None,
    ingest: PcmIngest,
    ending: Ending | None = None,
) -> None:
    """The receive loop every endpoint shares. `handle` gets each message and returns a
    reason to end the session, or None. However the loop ends (disconnect, idle, limit, slow
    client, a broken socket), the session is closed, so its buffered audio is transcribed
    (what the ingest's resampler held included)."""
    ending = ending or Ending()
    reason = "disconnect"
    ahead: asyncio.Task[Message] | None = None  # the next message, read while one is handled
    try:
        while not outbox.dead:
            if ahead is None:
                ahead = asyncio.ensure_future(websocket.receive())
            try:  # (a timer per message, not wait_for's task per message)
                async with asyncio.timeout(ending.idle_s or ctx.settings.ws_idle_timeout):
                    received = await ahead
            except TimeoutError:
                if idle_error is not None:
                    await outbox.put(idle_error)
                reason = "idle"
                break
            if received["type"] == "websocket.disconnect":
                break
            # One message read ahead (no more: back-pressure holds the rest in the socket),
            # so a client that leaves while the session waits for room is seen at once.
            ahead = asyncio.ensure_future(websocket.receive())
            ahead.add_done_callback(functools.partial(_seen_leaving, session))
            ended = await handle(received)
            if ended:
                reason = ended
                break
        if outbox.dead:
            reason = "slow_client"
    except Exception as exc:  # a broken socket must not lose the buffered audio
        logger.opt(exception=exc).warning("websocket loop ended")
    finally:
        if ahead is not None and not ahead.done():
            ahead.cancel()
        await release(ctx, websocket, session, outbox, reason, ingest, ending)


def _seen_leaving(session: StreamSession | ChannelGroup, ahead: asyncio.Task[Message]) -> None:
    """The message read ahead says the client has gone (or the socket broke): a feed
    waiting for room must not hold the session (its seat, its finals' priority)."""
    if ahead.cancelled():
        return
    if ahead.exception() is not None or ahead.result()["type"] == "websocket.disconnect":
        session.client_left()


async def release(
    ctx: AppContext,
    websocket: WebSocket,
    session: StreamSession | ChannelGroup,
    outbox: Outbox,
    reason: str,
    ingest: PcmIngest | None = None,
    ending: Ending | None = None,
) -> None:
    """End a registered session: its buffered audio transcribed, its finals sent, its
    tasks done, the socket closed and, whatever fails, its seat given back. The session
    counts toward WS_MAX_SESSIONS until its last final is delivered or dropped: audio it
    received is still transcribed even if the client is gone; a client that has left gives
    its seat back now, while that audio is still transcribed (registry.leave)."""
    ending = ending or Ending()
    try:
        if reason in CLIENT_GONE:
            ctx.sessions.leave(session)
        if ingest is not None:
            with contextlib.suppress(Exception):
                await ingest.drain(session)
        await session.close(reason)
        if ending.farewell is not None and reason not in CLIENT_GONE:
            with contextlib.suppress(Exception):
                await ending.farewell(reason)
        await outbox.close()
        code, why = ending.close_code(reason) if ending.close_code else (1000, "")
        with contextlib.suppress(Exception):
            await websocket.close(code, why)
    finally:
        ctx.sessions.remove(session)
