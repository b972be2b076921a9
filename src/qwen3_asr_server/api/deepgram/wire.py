"""Stream events -> WS /v1/listen's messages (`messages.py`), one `Wire` per stream.

- A partial is an interim `Results` (`is_final: false`), with `interim_results` only.
- A final is `is_final: true`; `speech_final: true` when voice detection ended it (the
  endpointing silence); `from_finalize: true` when it answers a `Finalize`. A Finalize with
  nothing buffered is answered by an empty final at the stream's end. An utterance ended by
  silence always ends with a `speech_final` final, empty when it was heard as nothing (a
  cough) or its transcription failed (after the `Error`): LiveKit learns that speech ended
  only from `speech_final` (or `UtteranceEnd`). A final split at a change of speaker
  (`diarize`) is several finals: only its last part has `speech_final`/`from_finalize`.
- `start`/`duration`: where the audio lies in the stream (the session core's sample counts).
  Our finals have no word times: a final's words are spread evenly over its span, and every
  confidence is 1.0 (docs/DEEPGRAM.md).
- `SpeechStarted` with `vad_events`; `UtteranceEnd` with `utterance_end_ms`, once that much
  stream time has passed after the last final's end with no speech since.
- With `diarize`, each word's `speaker` is the live speaker's letter as a number (A = 0).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ...streaming.events import Final, FinalFailed, Partial, SpeechStarted, StreamEvent
from ...text import letter_index
from . import messages as m
from .query import ListenQuery

Out = list[tuple[dict[str, Any], bool]]  # (message, droppable)


def words(text: str, start: float, end: float, speaker: int | None) -> list[m.Word]:
    """The transcript's words spread evenly over [start, end]."""
    spoken = text.split()
    if not spoken:
        return []
    step = max(end - start, 0.0) / len(spoken)
    out = []
    for i, shown in enumerate(spoken):
        bare = re.sub(r"[^\w'-]", "", shown).lower() or shown.lower()
        out.append(
            m.Word(
                word=bare,
                start=round(start + i * step, 3),
                end=round(start + (i + 1) * step, 3),
                confidence=1.0,
                punctuated_word=shown,
                speaker=speaker,
            )
        )
    return out


def model_identity(model_id: str, arch: str) -> tuple[str, m.ModelInfo]:
    """The served model as Deepgram names one: a UUID (derived from its id) and its info."""
    model_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, "qwen3-asr-server:" + model_id))
    return model_uuid, m.ModelInfo(name=model_id, version="1", arch=arch)


@dataclass
class Lane:
    """What one channel's messages need to remember."""

    started: dict[int, float] = field(default_factory=dict)  # utterance -> start (s)
    last_end: float = 0.0  # where the last final ended (s)
    word_end: float | None = None  # the last final's end, its UtteranceEnd not yet sent


class Wire:
    def __init__(
        self, query: ListenQuery, request_id: str, model_id: str, arch: str, lanes: int
    ) -> None:
        self.query = query
        self.request_id = request_id
        self.model_uuid, self.info = model_identity(model_id, arch)
        self.width = query.channels if query.multichannel else 1  # channel_index[1]
        self.lanes = [Lane() for _ in range(lanes)]

    def results(
        self,
        channel: int,
        text: str,
        span: tuple[float, float],
        final: tuple[bool, bool, bool] = (False, False, False),
        speaker: int | None = None,
    ) -> dict[str, Any]:
        """`final`: is_final, speech_final, from_finalize."""
        start, end = span
        is_final, speech_final, from_finalize = final
        return m.dump(
            m.Results(
                channel_index=[channel, self.width],
                start=round(start, 3),
                duration=round(max(end - start, 0.0), 3),
                is_final=is_final,
                speech_final=speech_final,
                from_finalize=from_finalize,
                channel=m.Channel(
                    alternatives=[
                        m.Alternative(
                            transcript=text,
                            confidence=1.0 if text else 0.0,
                            words=words(text, start, end, speaker),
                        )
                    ]
                ),
                metadata=m.ResultsMetadata(
                    request_id=self.request_id, model_info=self.info, model_uuid=self.model_uuid
                ),
            )
        )

    def event(self, channel: int, event: StreamEvent, position: float) -> Out:
        """One stream event of channel `channel` (`position`: its audio so far, in s)."""
        lane = self.lanes[channel]
        match event:
            case SpeechStarted():
                at = event.at_ms / 1000
                lane.started[event.utterance] = at
                out = self.utterance_end(channel, at) if lane.word_end is not None else []
                lane.word_end = None  # speech resumed: no UtteranceEnd before it is heard
                if self.query.vad_events:
                    speech = m.SpeechStarted(channel=[channel, self.width], timestamp=at)
                    out.append((m.dump(speech), False))
                return out
            case Partial() if self.query.interim_results:
                start = lane.started.get(event.utterance, lane.last_end)
                return [(self.results(channel, event.text, (start, position)), True)]
            case Final():  # (its gap may be heard already: a final that came late)
                out = self.final(channel, event)
                return out + self.utterance_end(channel, position, speaking=bool(lane.started))
            case FinalFailed():
                lane.started.pop(event.utterance, None)
                error = m.Error(variant="TranscriptionError", description=event.error.message)
                out = [(m.dump(error), False)]
                ended = event.reason == "silence"
                finalize = "flush" in (event.reason, *event.answers)
                if ended or finalize:  # (still the end of its speech, or a Finalize's answer)
                    span = (event.start, event.end)
                    flags = (True, ended, finalize)
                    out.append((self.results(channel, "", span, flags), False))
                return out
        return []

    def final(self, channel: int, event: Final) -> Out:
        lane = self.lanes[channel]
        lane.started.pop(event.utterance, None)
        lane.last_end = max(lane.last_end, event.end)
        last = not event.more  # (of a final split at a change of speaker)
        finalize = last and "flush" in (event.reason, *event.answers)
        ended = last and event.reason == "silence"
        if not event.text and not finalize and not ended:
            return []
        if event.text:
            lane.word_end = event.end
        speaker = letter_index(event.speaker) if self.query.diarize else None
        flags = (True, ended, finalize)
        message = self.results(channel, event.text, (event.start, event.end), flags, speaker)
        return [(message, False)]

    def finalized_nothing(self, channel: int, position: float) -> dict[str, Any]:
        """A Finalize with nothing buffered: an empty final at the stream's end."""
        return self.results(channel, "", (position, position), (True, False, True))

    def utterance_end(self, channel: int, now: float, speaking: bool = False) -> Out:
        """An UtteranceEnd once `utterance_end_ms` of stream time has passed since the last
        final's end (with none sent since), while no speech is open."""
        lane = self.lanes[channel]
        gap = self.query.utterance_end_ms
        if gap is None or lane.word_end is None or speaking or now - lane.word_end < gap / 1000:
            return []
        end, lane.word_end = lane.word_end, None
        message = m.UtteranceEnd(channel=[channel, self.width], last_word_end=round(end, 3))
        return [(m.dump(message), False)]

    def metadata(self, created: str, duration: float, sha256: str) -> dict[str, Any]:
        return m.dump(
            m.Metadata(
                request_id=self.request_id,
                sha256=sha256,
                created=created,
                duration=round(duration, 3),
                channels=self.query.channels,
                models=[self.model_uuid],
                model_info={self.model_uuid: self.info},
            )
        )


LIMIT = "LimitError"  # a frame over WS_MAX_FRAME_BYTES, audio past WS_MAX_SESSION_S


def error(
    description: str, sent: str | None = None, variant: str = "SchemaError"
) -> dict[str, Any]:
    """A client message we could not use (SchemaError: a text message that could not be
    parsed, `sent` echoed; LIMIT: one of our limits)."""
    return m.dump(m.Error(variant=variant, description=description, message=sent))


def configure_failure(request_id: str, asked: m.Configure) -> dict[str, Any]:
    """A `Configure` refused: a stream's keyterms and features are set by its query."""
    what = "keyterms" if asked.keyterms is not None else "features"
    description = (
        f"This server does not change a stream's {what} mid-stream: set keyterm/keywords "
        "(and the other options) in the query when opening the stream. The stream goes on "
        "as it was opened."
    )
    code = "CONFIGURE_KEYTERMS_NOT_SUPPORTED"
    return m.dump(m.ConfigureFailure(request_id=request_id, code=code, description=description))
