"""StreamSession: PCM frames -> VAD -> turns -> partials and finals.

One per connection; sessions share nothing but the VAD model's read-only ONNX session and
the scheduler. Transport-agnostic: adapters feed 16 kHz float32 audio and receive typed
events (`events.py`) through `emit`. Where turns start and end is the TurnDetector's
(`turns.py`, synchronous); this module runs the inference those turns call for.

- VAD runs per message on the VAD model's threads, never on the event loop, batched with
  the other sessions' frames (`audio/vad.py`'s VADBatcher).
- Partials re-decode the open utterance (its last `window_max_s`) at partial priority
  (after finals, before uploads) after every `partial_interval_s` of new speech. A session
  has at most one partial waiting or running, and the audio is taken when the job starts,
  so a partial that waited under load decodes the newest audio: the cadence adapts to the
  load instead of queueing stale work.
- Finals run in order on a per-session task (`finals.py`); committing an utterance cancels
  its queued partial, so a partial never delays a final. The final's transcription starts
  turns.EARLY_FINAL_MS before the end-of-utterance silence is complete (dropped if speech
  resumes), so its latency overlaps the silence wait. Silence costs no other inference.
- A final is produced on end of speech, maximum length (cut at the quietest point), flush,
  reset and close (disconnect, shutdown); it is never dropped. An idle timeout (server VAD,
  `idle_timeout_ms` of audio without speech) commits an empty item, whose final is empty.
- Audio waiting for its final is bounded (`max_pending_s`): past it, `feed()` waits until
  finals catch up, so the transport stops reading the client (back-pressure), or until the
  client leaves (`client_left`: the transport reads one message ahead to see it).
- A client that has left no longer waits for its finals: those still queued are joined into
  as few as the utterance limit allows (`Finals.merge`); a shutdown whose time is up stops
  them (`abandon`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from loguru import logger

from ..audio.pcm import SAMPLE_RATE
from ..audio.vad import FRAME, SileroModel
from ..errors import ServiceError
from .agreement import MIN_WORD_PROB, Draft, LocalAgreement, held_back
from .config import AudioSource, Heard, StreamConfig, Transcribe
from .events import Committed, Emit, Partial, SpeechStarted, SpeechStopped, TimedOut
from .finals import Finals, PendingFinal
from .speakers import KnownVoice, Prints, VoiceSource, follow
from .turns import (
    EarlyFinalPoint,
    IdleTimeout,
    MaxLengthCut,
    PartialDue,
    SpeechResumed,
    TurnDetector,
    TurnEnded,
    TurnEvent,
    TurnStarted,
)
from .utterance import Utterance

# close() reasons after which no client waits for the finals: they run at upload priority
CLIENT_GONE = frozenset({"disconnect", "slow_client"})
__all__ = ["AudioSource", "Heard", "StreamConfig", "StreamSession", "Transcribe"]


class StreamSession:
    channels = 1  # a seat in the registry; a multichannel stream is a ChannelGroup of these

    def __init__(
        self,
        config: StreamConfig,
        transcribe: Transcribe,
        emit: Emit,
        vad: SileroModel | None,
        observe_final: Callable[[float], None] | None = None,
        observe_lag: Callable[[float], None] | None = None,
        voices: VoiceSource | None = None,
    ) -> None:
        self.config = config
        self._voices = voices  # the shared voice fingerprints (live speakers)
        self._observe_lag = observe_lag  # audio received -> through voice detection (metrics)
        self._feeding_since: float | None = None  # monotonic arrival of the audio in feed()
        self._transcribe = transcribe
        self._emit = emit
        self._vad_model = vad
        self._vad = vad.stream() if vad is not None else None
        self.turns = TurnDetector(config)
        self._agreement = LocalAgreement()
        self._partial: asyncio.Task[None] | None = None
        # Early final: once the silence is most of the way to ending the utterance, its
        # transcription starts; if the silence holds, that result is the final.
        self._early: asyncio.Task[Heard] | None = None
        self._early_len = 0
        self._early_prints: asyncio.Task[Prints] | None = None  # its voice fingerprints
        self._finals = Finals(
            self._final_text, emit, lambda: self.config.max_pending_s * SAMPLE_RATE, observe_final
        )
        self._speakers()
        self.samples_in = 0  # total audio received, in samples
        self._closing: asyncio.Future[None] | None = None
        self.closed = False
        # The client has left: no one waits for the remaining finals in real time.
        self.client_gone = False

    # -- input -------------------------------------------------------------------------
    def configure(self, **changes: Any) -> None:
        self.config = replace(self.config, **changes)
        self.turns.config = self.config
        self._speakers()

    def _speakers(self) -> None:
        self._finals.labels = follow(self._finals.labels, self._voices, self.config)

    def know(self, known: list[KnownVoice]) -> None:
        """Known speakers by voice (live speakers on)."""
        if self._finals.labels is not None:
            self._finals.labels.know(known)

    @property
    def pending_seconds(self) -> float:
        """Audio committed and waiting for its final."""
        return self._finals.pending / SAMPLE_RATE

    @property
    def lag(self) -> float:
        """How far behind real time the session is: seconds since the audio being processed
        now arrived (waiting for room, voice detection, turns), 0 when it is idle."""
        since = self._feeding_since
        return 0.0 if since is None else time.monotonic() - since

    async def feed(self, samples: np.ndarray) -> None:
        """Audio at 16 kHz, any length; processed in whole VAD frames. Waits while more
        than `max_pending_s` of audio waits for its finals (back-pressure)."""
        arrived = self._feeding_since = time.monotonic()
        try:
            await self._feed(samples)
        finally:
            self._feeding_since = None
            if self._observe_lag is not None:
                self._observe_lag(time.monotonic() - arrived)

    async def _feed(self, samples: np.ndarray) -> None:
        while not self.closed and not self._finals.room.is_set():
            await self._finals.room.wait()
        if self.closed:
            return
        self.samples_in += len(samples)
        frames = self.turns.frames(samples)
        if not len(frames):
            return
        speech = await self._speech(frames)
        for n, i in enumerate(range(0, len(frames), FRAME)):
            for event in self.turns.step(frames[i : i + FRAME], bool(speech[n])):
                await self._on_turn(event)

    async def _speech(self, frames: np.ndarray) -> np.ndarray:
        """Speech or not, per frame; the VAD runs on its own threads, off the event loop,
        batched with every other session's frames."""
        cfg = self.config
        if not (cfg.use_vad and self._vad is not None and self._vad_model is not None):
            return np.ones(len(frames) // FRAME, dtype=bool)
        probs = await self._vad_model.batcher.probs(self._vad, frames)
        result: np.ndarray = probs >= cfg.vad_threshold
        return result

    async def flush(self, reason: str = "flush") -> int | None:
        """Commit everything buffered (padded with silence so trailing words land)."""
        self.turns.pad_leftover()
        return await self._commit(reason, *self.turns.take(), self.config.flush_silence_ms)

    def answer_pending(self, action: str) -> bool:
        """A flush found nothing buffered: the final still pending (voice detection closed
        its utterance) answers it, sent even when its text is empty (its event carries
        `answers`). False when no final is pending: nothing at all was buffered."""
        return self._finals.answer_pending(action)

    async def reset(self) -> int | None:
        """Finalize what is buffered, then start clean (VAD state, agreement)."""
        item = await self.flush("reset")
        if self._vad is not None:
            self._vad.reset()
        self.turns.reset()
        return item

    def clear(self) -> None:
        """Discard the open utterance without a final (OpenAI's input_audio_buffer.clear)."""
        self._cancel_partial()
        self._cancel_early()  # its text belongs to the cleared audio
        self.turns.clear()
        self._agreement.reset()

    def client_left(self) -> None:
        """The transport saw the client leave, maybe while `feed()` waits for room: that
        wait ends (the audio being fed is kept), so the transport can release the session."""
        self.client_gone = True
        self._finals.unbound()

    async def close(self, reason: str) -> None:
        """Finalize what is buffered and wait for every final to be emitted. Safe to call
        from two places at once (a disconnect and the server's shutdown): both wait."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close(reason))
        closing = self._closing
        await asyncio.wait([closing])  # (returns, not raises, once it is abandoned)
        if not closing.cancelled() and (error := closing.exception()) is not None:
            raise error

    async def _close(self, reason: str) -> None:
        self.client_gone = reason in CLIENT_GONE
        await self.flush(reason)
        if self.client_gone:
            self._finals.merge(int(self.config.max_utterance_s * SAMPLE_RATE), reason)
        self.closed = True
        self._finals.room.set()  # a feed() waiting for room returns (and drops its audio)
        await self._finals.close()
        if self._finals.labels is not None:
            self._finals.labels.close()

    def abandon(self) -> tuple[int, float]:
        """Stop transcribing now (a shutdown's time is up): the finals not emitted and the
        seconds of audio in them, the open utterance not yet committed counted as one;
        `close()` returns at once from now on."""
        self.closed = True
        self._cancel_partial()
        self._cancel_early()
        finals, seconds = self._finals.abandon()
        if self._finals.labels is not None:
            self._finals.labels.close()
        if buffered := self.turns.buffered:
            finals, seconds = finals + 1, seconds + buffered / SAMPLE_RATE
        self.turns.clear()
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_future()
            self._closing.set_result(None)
        else:
            self._closing.cancel()
        return finals, seconds

    # -- turns ---------------------------------------------------------------------------
    async def _on_turn(self, event: TurnEvent) -> None:
        match event:
            case TurnStarted(utt):
                self._agreement.reset()
                await self._emit(SpeechStarted(utt.id, self.turns.ms(utt.start_sample)))
            case SpeechResumed():
                self._cancel_early()  # the early transcription is stale
            # Only at the live edge: with a final still pending (a client sending faster than
            # real time, or a busy server) an early start gains nothing, and would queue every
            # utterance's final at once, at real-time priority, even after the client has left.
            case EarlyFinalPoint(utt) if self._early is None and self._finals.last is None:
                self._cancel_partial()  # the final matters more than one more partial
                self._early_len = utt.length
                self._early = asyncio.create_task(self._final_text(utt.audio.copy()))
                if self._finals.labels is not None:  # its speaker, as early
                    self._early_prints = self._finals.labels.fingerprint(utt.audio.copy())
            case TurnEnded(utt, at_ms):
                await self._emit(SpeechStopped(utt.id, at_ms))
                await self._commit("silence", *self.turns.take())
            case MaxLengthCut(head, padded):
                await self._commit("max_length", head, padded)
                self._agreement.reset()  # the next utterance's stable text starts empty
            case IdleTimeout(number, start_ms, end_ms):
                await self._emit(TimedOut(number, start_ms, end_ms))
                await self._commit("idle_timeout", Utterance(number, 0, self.turns.pos), 0)
            case PartialDue(utt) if self._partial is None and self._early is None:
                self.turns.partial_started()  # (no partial while a final is transcribed)
                self._partial = asyncio.create_task(self._run_partial(utt))

    async def _commit(
        self, reason: str, utt: Utterance | None, padded: int, pad_ms: int = 0
    ) -> int | None:
        """Queue the final of `utt` (taken from the detector; `padded` of its samples are
        padding), with `pad_ms` of silence appended so trailing words land."""
        self._cancel_partial()
        early = prints = None
        if reason == "silence":  # the silence held: the early transcription is the final
            early, self._early = self._early, None
            prints, self._early_prints = self._early_prints, None
        self._cancel_early()  # any other commit: the early transcription is stale
        if utt is None or (utt.length == 0 and reason != "idle_timeout"):
            return None
        audio = utt.audio[: self._early_len] if early is not None else utt.audio
        seconds = (len(audio) - min(padded, len(audio))) / SAMPLE_RATE
        if pad_ms:
            audio = np.concatenate([audio, np.zeros(pad_ms * SAMPLE_RATE // 1000, np.float32)])
        now = time.monotonic()
        item = PendingFinal(utt, audio, reason, early, now, seconds, start=utt.start_sample)
        item.prints = prints if early is not None else None
        await self._finals.put(item)
        await self._emit(Committed(utt.id, reason))
        return utt.id

    # -- inference ---------------------------------------------------------------------
    def _cancel_early(self) -> None:
        if self._early is not None:
            self._early.cancel()
            self._early = None
        if self._early_prints is not None:
            self._early_prints.cancel()
            self._early_prints = None

    def _cancel_partial(self) -> None:
        if self._partial is not None:
            self._partial.cancel()  # removes the job from the queue if it has not started
            self._partial = None

    async def _final_text(self, audio: np.ndarray) -> Heard:
        if not len(audio):  # an idle timeout's empty item
            return Heard("", self.config.language)
        result = await self._transcribe(audio, self.config.decoding, False)
        if isinstance(result, Draft):
            return Heard(result.confident_text(0.0))
        return result if isinstance(result, Heard) else Heard(result)

    async def _run_partial(self, utt: Utterance) -> None:
        window_s = self.config.window_max_s
        hypothesis: str | Draft | Heard | None = None
        try:  # the window is taken when the job starts: the newest audio, not stale audio
            hypothesis = await self._transcribe(
                lambda: utt.tail(window_s), self.config.decoding, True
            )
        except ServiceError as exc:  # queue full / timeout: skip this partial, keep going
            logger.debug("partial skipped: {}", exc.message)
        except Exception as exc:
            logger.opt(exception=exc).warning("partial failed")
        finally:
            if self._partial is asyncio.current_task():
                self._partial = None
        if hypothesis is None or self.turns.utterance is not utt:
            return  # the utterance was committed meanwhile: its final will say it all
        logprobs = None if isinstance(hypothesis, str) else hypothesis.logprobs
        if isinstance(hypothesis, Draft):
            # Only confident words become stable or are shown, except in the utterance's
            # first partial: it shows the whole draft, as early as possible.
            text = hypothesis.confident_text(MIN_WORD_PROB)
            shown = text if utt.partials else hypothesis.confident_text(0.0)
        else:
            text = shown = hypothesis if isinstance(hypothesis, str) else hypothesis.text
        stable = self._agreement.update(text)
        shown = held_back(shown, stable)
        if not shown or (shown, stable) == utt.shown:
            return  # nothing (confident) to add: the last partial stands
        utt.partials += 1
        utt.shown = (shown, stable)
        await self._emit(Partial(utt.id, shown, stable, logprobs))
