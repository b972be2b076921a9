"""WS /v1/listen (issue 52) driven by the real deepgram-sdk 7.16 (sync and async clients),
its environment pointed at a real uvicorn serving whisper-tiny.en. Every message the SDK
receives is re-validated against the SDK's own types with their field sets compared (the
SDK parses leniently: a missing field would pass unnoticed otherwise)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import threading
import time
import typing
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pydantic
import pytest
import soundfile as sf
import soxr
from deepgram import AsyncDeepgramClient, DeepgramClient
from deepgram.core.api_error import ApiError
from deepgram.core.events import EventType
from deepgram.environment import DeepgramClientEnvironment
from deepgram.listen.v1.types import (
    ListenV1Configure,
    ListenV1ConfigureFailure,
    ListenV1Error,
    ListenV1Metadata,
    ListenV1Results,
    ListenV1SpeechStarted,
    ListenV1UtteranceEnd,
)
from deepgram.types import ListenV1Response
from loguru import logger
from starlette.datastructures import QueryParams
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from calls import AGENT, CUSTOMER, call, call_tracks, clip, reference
from helpers import whisper_settings
from qwen3_asr_server.api.deepgram import live
from qwen3_asr_server.api.deepgram.query import ListenQuery, keyword, parse_query
from qwen3_asr_server.api.deepgram.wire import Wire
from qwen3_asr_server.app import create_app
from qwen3_asr_server.audio import g711
from qwen3_asr_server.errors import InferenceError
from qwen3_asr_server.logging import DENIAL_NOISE
from qwen3_asr_server.streaming.config import Heard
from qwen3_asr_server.streaming.events import Final, FinalFailed, SpeechStarted
from qwen3_asr_server.streaming.session import StreamSession
from qwen3_asr_server.text import letter_index
from server import LiveServer, live_server
from speech import transcripts
from streaming_client import load, pcm16
from test_session_speakers import Voices
from test_session_speakers import session as voice_session
from wer import wer

pytestmark = pytest.mark.slow
KEY = "dg-test-key"
SDK_TYPES: dict[str, type[pydantic.BaseModel]] = {
    "Results": ListenV1Results,
    "Metadata": ListenV1Metadata,
    "SpeechStarted": ListenV1SpeechStarted,
    "UtteranceEnd": ListenV1UtteranceEnd,
    "Error": ListenV1Error,
    "ConfigureFailure": ListenV1ConfigureFailure,
}
# Deepgram's docs show them; the SDK's types lack them
EXTRA = {
    "Metadata": {"models", "model_info"},
    "Response.results.channels.alternatives.words": {"punctuated_word"},
}
ALSO_REQUIRED = {"Results": {"is_final", "speech_final", "from_finalize"}}  # LiveKit reads them


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    # (a diarized final waits up to 5 s for its speaker on these 2 cores)
    settings = whisper_settings(api_key=KEY, deepgram_idle_timeout_s=3.0, ws_speaker_wait_s=5.0)
    with live_server(create_app(settings)) as srv:
        yield srv


def environment(srv: LiveServer) -> DeepgramClientEnvironment:
    ws = srv.url.replace("http://", "ws://")
    return DeepgramClientEnvironment(base=srv.url, production=ws, agent=ws, agent_rest=srv.url)


def model_in(annotation: Any) -> type[pydantic.BaseModel] | None:
    """The SDK model inside a field's annotation (Optional[X], List[X]), if any."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (found := model_in(arg)) is not None:
            return found
    return None


def check_fields(cls: type[pydantic.BaseModel], data: dict[str, Any], where: str) -> None:
    fields = cls.model_fields
    unknown = set(data) - set(fields) - EXTRA.get(where, set())
    assert not unknown, f"{where}: fields the SDK does not know: {unknown}"
    required = {n for n, f in fields.items() if f.is_required()} | ALSO_REQUIRED.get(where, set())
    assert not required - set(data), f"{where}: missing {required - set(data)}"
    for name, value in data.items():
        sub = model_in(fields[name].annotation) if name in fields else None
        for item in (value if isinstance(value, list) else [value]) if sub else []:
            check_fields(sub, item, f"{where}.{name}")  # type: ignore[arg-type]


def strict(raw: str | bytes) -> dict[str, Any]:
    """A raw server message checked against the SDK's type for it: every required field
    there, no field it does not know, every value of its type."""
    data: dict[str, Any] = json.loads(raw)
    cls = SDK_TYPES[data["type"]]
    check_fields(cls, data, data["type"])
    cls.model_validate(data)
    return data


class Tap:
    """The SDK socket's connection (sync or async), every raw message kept for `strict`."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.raw: list[Any] = []

    def __iter__(self) -> Iterator[Any]:
        for message in self.ws:
            self.raw.append(message)
            yield message

    async def __aiter__(self) -> Any:  # (the async client's connection)
        async for message in self.ws:
            self.raw.append(message)
            yield message

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ws, name)


class Listener:
    """Reads the SDK's parsed messages on a thread (the SDK's own iteration)."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.tap = socket._websocket = Tap(socket._websocket)
        self.messages: list[Any] = []
        self.closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for message in self.socket:
                self.messages.append(message)
        except Exception:
            pass
        finally:
            self.closed.set()

    def of(self, cls: type) -> list[Any]:
        return [m for m in self.messages if isinstance(m, cls)]

    def finals(self) -> list[Any]:
        return [m for m in self.of(ListenV1Results) if m.is_final]

    def wait(self, predicate: Any, timeout: float = 90.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return bool(predicate())

    def checked(self) -> list[dict[str, Any]]:
        return [strict(raw) for raw in self.tap.raw]


def text(results: list[Any]) -> str:
    return " ".join(r.channel.alternatives[0].transcript for r in results).strip()


def send(socket: Any, data: bytes, step: int, pace_s: float = 0.0) -> None:
    for i in range(0, len(data), step):
        socket.send_media(data[i : i + step])
        if pace_s:
            time.sleep(pace_s)  # (the pace of a live source, not a wait for an event)


def test_live_linear16_interim_vad_events_utterance_end_finalize_close(server: LiveServer) -> None:
    """Interim results, SpeechStarted, speech_final at the end of speech, UtteranceEnd, a
    Finalize answered with from_finalize, CloseStream -> Metadata and a normal close."""
    speech = load("three_sentences.wav")
    first = pcm16(np.concatenate([speech, np.zeros(24000, np.float32)]))
    tail = pcm16(load("sentence_01.wav")[:-4800])  # too little silence left to end it
    client = DeepgramClient(api_key=KEY, environment=environment(server))
    query = {"interim_results": "true", "vad_events": "true", "utterance_end_ms": "1000"}
    with client.listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=16000, language="en-US", **query
    ) as socket:
        heard = Listener(socket)
        send(socket, first, 3200, 0.05)  # 100 ms messages at twice real time
        assert heard.wait(lambda: any(u.last_word_end > 11 for u in heard.of(ListenV1UtteranceEnd)))
        send(socket, tail, 3200)
        socket.send_finalize()
        assert heard.wait(lambda: any(r.from_finalize for r in heard.finals()))
        socket.send_close_stream()
        assert heard.wait(heard.closed.is_set)
    raw = heard.checked()
    assert heard.tap.ws.close_code == 1000
    interim = [r for r in heard.of(ListenV1Results) if not r.is_final]
    assert interim and all(not r.speech_final for r in interim)
    assert heard.of(ListenV1SpeechStarted)
    spoken = [r for r in heard.finals() if r.speech_final]
    assert len(spoken) == 3 and all(not r.from_finalize for r in spoken)  # one a sentence
    assert wer([transcripts()["three_sentences.wav"]], [text(spoken)]) <= 0.3
    ended = heard.of(ListenV1UtteranceEnd)  # the sentences' pauses are 1 s long too
    assert all(u.channel == [0, 1] for u in ended)
    assert [round(u.last_word_end, 3) for u in ended] == [
        round(r.start + r.duration, 3) for r in spoken
    ]
    finalized = [r for r in heard.finals() if r.from_finalize]
    assert len(finalized) == 1 and not finalized[0].speech_final
    assert wer([transcripts()["sentence_01.wav"]], [text(finalized)]) <= 0.3
    last = finalized[-1]
    assert 14 <= last.start <= 15.5 and last.start + last.duration <= 19.5
    words = last.channel.alternatives[0].words
    assert words and all(
        last.start <= w.start < w.end <= last.start + last.duration + 1e-3 for w in words
    )
    assert isinstance(heard.messages[-1], ListenV1Metadata)
    meta = heard.messages[-1]
    assert meta.sha256 == hashlib.sha256(first + tail).hexdigest()
    assert meta.duration == pytest.approx((len(first) + len(tail)) / 32000, abs=0.01)
    assert meta.channels == 1 and meta.transaction_key == "deprecated"
    assert {r.metadata.request_id for r in heard.of(ListenV1Results)} == {meta.request_id}
    info = raw[-1]["model_info"][raw[-1]["models"][0]]
    assert info["name"] == "whisper-tiny.en"
    assert [m["type"] for m in raw].count("Metadata") == 1


def test_live_mulaw_8k_with_the_async_client(server: LiveServer) -> None:
    """G.711 μ-law at 8 kHz, the async client with its event handlers: Finalize, then
    CloseStream; endpointing=false: the only final answers the Finalize."""
    speech = soxr.resample(load("sentence_02.wav"), 16000, 8000).astype(np.float32)
    data = g711.encode(np.concatenate([speech, np.zeros(8000, np.float32)]), "mulaw")
    messages: list[Any] = []

    async def run() -> int | None:
        client = AsyncDeepgramClient(api_key=KEY, environment=environment(server))
        async with client.listen.v1.connect(
            model="nova-3", encoding="mulaw", sample_rate=8000, endpointing="false"
        ) as socket:
            socket.on(EventType.MESSAGE, messages.append)
            tap = socket._websocket = Tap(socket._websocket)
            listening = asyncio.create_task(socket.start_listening())
            for i in range(0, len(data), 1600):
                await socket.send_media(data[i : i + 1600])
            await socket.send_finalize()
            async with asyncio.timeout(90):
                while not any(getattr(m, "from_finalize", False) for m in messages):
                    await asyncio.sleep(0.02)
            await socket.send_close_stream()
            async with asyncio.timeout(60):
                await listening
            for raw in tap.raw:
                strict(raw)
            return int(tap.ws.close_code)

    assert asyncio.run(run()) == 1000
    finals = [m for m in messages if isinstance(m, ListenV1Results) and m.is_final]
    assert finals and all(r.from_finalize and not r.speech_final for r in finals)
    assert wer([transcripts()["sentence_02.wav"]], [text(finals)]) <= 0.3
    meta = messages[-1]
    assert isinstance(meta, ListenV1Metadata)
    assert meta.duration == pytest.approx(len(data) / 8000, abs=0.01)


def test_multichannel_stereo_call_keeps_each_side_on_its_channel(server: LiveServer) -> None:
    """multichannel=true, channels=2: each channel's finals carry channel_index [c, 2] and
    that side's words."""
    tracks, _ = call_tracks()
    data = pcm16(np.ascontiguousarray(tracks.T).reshape(-1))
    client = DeepgramClient(api_key=KEY, environment=environment(server))
    with client.listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=16000, channels=2, multichannel="true"
    ) as socket:
        heard = Listener(socket)
        send(socket, data, 6400)
        socket.send_close_stream()
        assert heard.wait(heard.closed.is_set, timeout=180)
    heard.checked()
    finals = heard.finals()
    assert {tuple(r.channel_index) for r in finals} == {(0, 2), (1, 2)}
    for c, side in enumerate((AGENT, CUSTOMER)):
        said = text([r for r in finals if r.channel_index == [c, 2]])
        assert wer([reference(side)], [said]) <= 0.35, (c, said)
    meta = heard.messages[-1]
    assert isinstance(meta, ListenV1Metadata) and meta.channels == 2


# The SDK means to raise ApiError, but with websockets >= 14 the handshake's InvalidStatus
# passes through it (its compat import catches the legacy InvalidStatusCode only).
REFUSED = (ApiError, InvalidStatus)


def status_of(exc: BaseException) -> int | None:
    if isinstance(exc, InvalidStatus):
        return exc.response.status_code
    return getattr(exc, "status_code", None)


def refused(srv: LiveServer, query: str, headers: dict[str, str] | None = None) -> Any:
    url = srv.url.replace("http://", "ws://") + "/v1/listen" + query
    with pytest.raises(InvalidStatus) as caught:
        connect(
            url,
            additional_headers={"Authorization": f"Token {KEY}"} if headers is None else headers,
        )
    return caught.value.response


@pytest.mark.parametrize(
    ("query", "status", "says"),
    [
        ("?encoding=opus", 400, "encoding 'opus'"),
        ("?encoding=linear16&sample_rate=abc", 400, "sample_rate"),
        ("?encoding=linear16&sample_rate=100", 400, "sample_rate"),
        ("?encoding=linear16&utterance_end_ms=10", 400, "utterance_end_ms"),
    ],
)
def test_a_query_we_cannot_serve_is_refused_at_the_handshake(
    server: LiveServer, query: str, status: int, says: str
) -> None:
    response = refused(server, query)
    assert response.status_code == status
    body = json.loads(response.body)
    assert set(body) == {"err_code", "err_msg", "request_id"} and says in body["err_msg"]
    assert response.headers["dg-error"] and response.headers["dg-request-id"] == body["request_id"]
    client = DeepgramClient(api_key=KEY, environment=environment(server))
    with pytest.raises(REFUSED) as sdk, client.listen.v1.connect(model="nova-3", encoding="opus"):
        pass
    assert status_of(sdk.value) == 400


def test_keys_token_bearer_subprotocol_and_a_wrong_one(server: LiveServer) -> None:
    """...and a refused handshake logs no ERROR: uvicorn's websockets-sansio logs one after
    every denial response (Kludex/uvicorn#3138); ours is kept at DEBUG."""
    noise: list[tuple[str, str]] = []
    sink = logger.add(lambda m: noise.append((m.record["level"].name, m.record["message"])))
    try:
        for headers in ({"Authorization": "Token nope"}, {}):
            response = refused(server, "?encoding=linear16", headers)
            assert response.status_code == 401 and json.loads(response.body)["err_code"]
        deadline = time.monotonic() + 30  # uvicorn logs once the route has returned
        while sum(DENIAL_NOISE in text for _, text in noise) < 2:
            assert time.monotonic() < deadline, noise
            time.sleep(0.05)
    finally:
        logger.remove(sink)
    assert [level for level, text in noise if DENIAL_NOISE in text] == ["DEBUG", "DEBUG"]
    assert not [n for n in noise if n[0] in ("ERROR", "CRITICAL")], noise
    client = DeepgramClient(api_key="wrong", environment=environment(server))
    with pytest.raises(REFUSED) as sdk, client.listen.v1.connect(model="nova-3"):
        pass
    assert status_of(sdk.value) == 401
    url = server.url.replace("http://", "ws://") + "/v1/listen"
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(json.dumps({"type": "CloseStream"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "Metadata"
    for scheme in ("token", "Token"):  # (echoed as sent, or a browser fails: issue 58 §6.8)
        with connect(url, subprotocols=[scheme, KEY]) as ws:  # type: ignore[list-item]
            assert ws.subprotocol == scheme
            ws.send(json.dumps({"type": "CloseStream"}))
            assert json.loads(ws.recv(timeout=30))["type"] == "Metadata"


def test_bad_text_frames_get_an_error_and_the_stream_goes_on(server: LiveServer) -> None:
    """Not JSON, an unknown type: an Error each (SchemaError, the message echoed), the
    stream goes on; audio after CloseStream is not read, the close is clean."""
    client = DeepgramClient(api_key=KEY, environment=environment(server))
    with client.listen.v1.connect(model="nova-3", encoding="linear16") as socket:
        heard = Listener(socket)
        heard.tap.ws.send("not json")
        heard.tap.ws.send('{"type": "Dance"}')
        socket.send_keep_alive()
        assert heard.wait(lambda: len(heard.of(ListenV1Error)) == 2)
        send(socket, pcm16(load("sentence_03.wav")), 3200)
        socket.send_finalize()
        assert heard.wait(lambda: any(r.from_finalize for r in heard.finals()))
        socket.send_close_stream()
        with contextlib.suppress(Exception):  # (the server may have closed already)
            send(socket, pcm16(load("sentence_04.wav")), 3200)  # after CloseStream
        assert heard.wait(heard.closed.is_set)
    heard.checked()
    errors = heard.of(ListenV1Error)
    assert [e.variant for e in errors] == ["SchemaError", "SchemaError"]
    assert errors[0].message == "not json" and "Dance" in (errors[1].message or "")
    assert wer([transcripts()["sentence_03.wav"]], [text(heard.finals())]) <= 0.3
    assert isinstance(heard.messages[-1], ListenV1Metadata)
    assert heard.tap.ws.close_code == 1000
    assert server.get("/health").json()["status"] == "ok"


def test_a_stream_idle_past_the_timeout_is_closed_net_0001(server: LiveServer) -> None:
    """KeepAlives hold it open; then nothing for DEEPGRAM_IDLE_TIMEOUT_S (3 s here): Metadata,
    then close 1011 NET-0001. A Finalize with nothing buffered: an empty from_finalize final."""
    client = DeepgramClient(api_key=KEY, environment=environment(server))
    with client.listen.v1.connect(model="nova-3", encoding="linear16") as socket:
        heard = Listener(socket)
        started = time.monotonic()
        while time.monotonic() - started < 4.5:  # longer than the timeout, kept alive
            socket.send_keep_alive()
            assert not heard.wait(heard.closed.is_set, timeout=1.0)
        socket.send_finalize()
        assert heard.wait(heard.closed.is_set, timeout=30)
    heard.checked()
    (empty,) = heard.finals()
    assert empty.from_finalize and empty.channel.alternatives[0].transcript == ""
    assert isinstance(heard.messages[-1], ListenV1Metadata)
    assert (heard.tap.ws.close_code, heard.tap.ws.close_reason) == (1011, "NET-0001")


def test_diarize_gives_each_word_its_speaker_number(server: LiveServer) -> None:
    """Two voices one after the other, diarize=true: every word of the first's final has
    speaker 0, of the second's speaker 1 (our live speakers A and B)."""
    gap = np.zeros(16000, np.float32)
    audio = pcm16(np.concatenate([clip("meeting:0"), gap, clip("meeting:1"), gap]))
    client = DeepgramClient(api_key=KEY, environment=environment(server))
    with client.listen.v1.connect(model="nova-3", encoding="linear16", diarize="true") as socket:
        heard = Listener(socket)
        send(socket, audio, 3200, 0.05)
        socket.send_close_stream()
        assert heard.wait(heard.closed.is_set, timeout=120)
    heard.checked()
    spoken = [r for r in heard.finals() if r.channel.alternatives[0].transcript]
    speakers = [{w.speaker for w in r.channel.alternatives[0].words} for r in spoken]
    assert speakers == [{0}, {1}], speakers


@pytest.mark.parametrize("heard", ["nothing", "a failure"])
def test_an_utterance_heard_as_nothing_or_failed_still_ends_with_speech_final(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch, heard: str
) -> None:
    """vad_events=true (LiveKit always asks it): voice detection opens an utterance and its
    silence closes it, but the model hears nothing in it (a cough: Whisper hears words in
    any noise Silero takes for speech, so the final's text is emptied here), or its final
    fails. It still ends with an empty is_final/speech_final Results after its
    SpeechStarted (after the Error, when it failed): LiveKit learns the end of speech from
    nothing else. A raw websocket: the accepted handshake carries `dg-request-id`."""
    final_text = StreamSession._final_text

    async def hushed(self: StreamSession, audio: np.ndarray) -> Heard:
        said = await final_text(self, audio)
        if heard == "a failure":
            raise InferenceError("the model could not be reached")
        return replace(said, text="")

    monkeypatch.setattr(StreamSession, "_final_text", hushed)
    audio = pcm16(np.concatenate([load("sentence_02.wav"), np.zeros(16000, np.float32)]))
    url = server.url.replace("http://", "ws://") + "/v1/listen?encoding=linear16"
    url += "&sample_rate=16000&vad_events=true&endpointing=300"
    messages: list[dict[str, Any]] = []
    with connect(url, additional_headers={"Authorization": f"Token {KEY}"}) as ws:
        request_id = ws.response.headers["dg-request-id"]
        for i in range(0, len(audio), 3200):
            ws.send(audio[i : i + 3200])
            time.sleep(0.05)  # (the pace of a live source)
        deadline = time.monotonic() + 60
        while not any(m.get("speech_final") for m in messages) and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                messages.append(strict(ws.recv(timeout=1)))
            ws.send(json.dumps({"type": "KeepAlive"}))
        ws.send(json.dumps({"type": "CloseStream"}))
        with contextlib.suppress(Exception):
            while True:
                messages.append(strict(ws.recv(timeout=30)))
    kinds = [m["type"] for m in messages]
    expected = ["SpeechStarted", "Results", "Metadata"]
    assert kinds == (expected if heard == "nothing" else [*expected[:1], "Error", *expected[1:]])
    ended = messages[-2]
    assert ended["is_final"] and ended["speech_final"] and not ended["from_finalize"]
    assert ended["channel"]["alternatives"][0] == {"transcript": "", "confidence": 0.0, "words": []}
    assert 0 <= ended["start"] < messages[0]["timestamp"] + 0.5 and 2.5 < ended["duration"] < 5
    assert messages[-1]["request_id"] == ended["metadata"]["request_id"] == request_id


def wire_for(**query: Any) -> Wire:
    return Wire(ListenQuery(**query), "rid", "whisper-tiny.en", "whisper", 1)


def flags(out: list[tuple[dict[str, Any], bool]]) -> list[tuple[str, bool, bool, bool]]:
    """(transcript, is_final, speech_final, from_finalize) of each Results."""
    keys = ("is_final", "speech_final", "from_finalize")
    return [
        (r["channel"]["alternatives"][0]["transcript"], *(bool(r[k]) for k in keys))
        for r, _ in out
        if r["type"] == "Results"
    ]


def test_a_final_split_at_a_change_of_speaker_ends_speech_only_on_its_last_part() -> None:
    """diarize: one utterance's final in three parts (A, B, A); only the last has
    speech_final, and from_finalize when it answers a Finalize (the core's `more` marks the
    parts that are not last). An empty middle part is not sent; an empty last part is."""
    wire = wire_for(diarize=True)
    part = Final(1, "hello there", "silence", (), 1.0, start=0.0, end=1.0, speaker="A")
    parts = [
        replace(part, more=True),
        replace(part, text="", start=1.0, end=1.5, speaker="B", more=True),
        replace(part, text="yes", start=1.5, end=2.0, speaker="B", more=True),
        replace(part, text="ok", start=2.0, end=2.5, answers=("flush",)),
    ]
    outs = [wire.event(0, p, 2.5) for p in parts]
    assert [flags(out) for out in outs] == [
        [("hello there", True, False, False)],
        [],
        [("yes", True, False, False)],
        [("ok", True, True, True)],
    ]
    said = [r for out in outs for r, _ in out]
    assert [{w["speaker"] for w in r["channel"]["alternatives"][0]["words"]} for r in said] == [
        {0},
        {1},
        {0},
    ]
    # a split final committed by a Finalize: from_finalize on its last part only
    flushed = [replace(p, reason="flush", answers=()) for p in parts]
    assert [flags(wire.event(0, p, 2.5)) for p in flushed] == [
        [("hello there", True, False, False)],
        [],
        [("yes", True, False, False)],
        [("ok", True, False, True)],
    ]
    # its last part heard as nothing: still the end of speech
    assert flags(wire.event(0, replace(part, text="", start=3.0, end=3.5), 3.5)) == [
        ("", True, True, False)
    ]


async def test_the_core_marks_every_part_of_a_split_final_but_the_last() -> None:
    """The session core (fake voices, as tests/test_session_speakers.py) splits a flushed
    final at its change of voice: the first part has `more`, so on the wire only the last
    answers the Finalize."""
    voices, events = Voices(), []
    s = voice_session(voices, events, flush_silence_ms=0)
    first, second = np.full(4 * 16000, 0.1, np.float32), np.full(4 * 16000, -0.1, np.float32)
    await s.feed(np.concatenate([first, second]))
    await s.flush()
    deadline = time.monotonic() + 30
    while len([e for e in events if isinstance(e, Final)]) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    await s.close("test")
    a, b = (e for e in events if isinstance(e, Final))
    assert (a.speaker, b.speaker, a.more, b.more) == ("A", "B", True, False)
    wire = wire_for(diarize=True)
    sent = [flags(wire.event(0, e, 8.0)) for e in (a, b)]
    assert [[r[1:] for r in out] for out in sent] == [
        [(True, False, False)],
        [(True, False, True)],
    ]


def test_a_failed_final_ended_by_silence_still_ends_its_speech() -> None:
    """The final of an utterance voice detection closed failed: the Error, then an empty
    is_final/speech_final Results (from_finalize too when it answers a Finalize). An empty
    final at max_length (speech goes on) is not sent."""
    wire = wire_for(vad_events=True)
    failed = FinalFailed(1, "silence", (), 1.0, InferenceError("boom"), start=0.5, end=1.5)
    out = wire.event(0, failed, 1.5)
    assert [r["type"] for r, _ in out] == ["Error", "Results"]
    assert flags(out) == [("", True, True, False)]
    assert flags(wire.event(0, replace(failed, answers=("flush",)), 1.5)) == [
        ("", True, True, True)
    ]
    assert flags(wire.event(0, replace(failed, reason="flush"), 1.5)) == [("", True, False, True)]
    assert wire.event(0, replace(failed, reason="max_length"), 1.5)[1:] == []
    assert wire.event(0, Final(2, "", "max_length", (), 1.0), 2.0) == []
    for raw, _ in out:
        strict(json.dumps(raw))


def test_keywords_boost_and_speaker_numbers() -> None:
    assert [keyword(k) for k in ("Qwen:2", "Qwen", "a:b", "x:-1.5")] == ["Qwen", "Qwen", "a:b", "x"]
    assert [letter_index(s) for s in ("A", "B", "Z", "AA", "alice", None)] == [
        0,
        1,
        25,
        26,
        None,
        None,
    ]


def test_keyterms_keep_their_colons_and_values_beyond_our_limits_are_cut() -> None:
    """Keyterms have no boosts (`keyterm=10:30` stays `10:30`); a `keywords` boost is dropped.
    `utterance_end_ms` above 5000 counts as 5000; keywords past our limits (decoding.py) are
    left out and logged at INFO, never refused (Deepgram takes them)."""
    said: list[tuple[str, str]] = []
    sink = logger.add(lambda m: said.append((m.record["level"].name, m.record["message"])))
    try:
        many = "&".join(f"keyterm=term{i}" for i in range(150))
        query = parse_query(
            QueryParams(f"keyterm=10:30&keywords=Qwen:2&utterance_end_ms=9000&{many}")
        )
        long = parse_query(QueryParams("keyterm=" + "x" * 300 + "&keyterm=ok"))
    finally:
        logger.remove(sink)
    assert query.keywords[:3] == ["Qwen", "10:30", "term0"] and len(query.keywords) == 100
    assert query.utterance_end_ms == 5000
    assert long.keywords == ["ok"]
    assert [level for level, message in said if "beyond our limits" in message] == ["INFO"] * 2


def test_a_query_deepgram_takes_beyond_our_limits_opens_the_stream(server: LiveServer) -> None:
    many = "".join(f"&keyterm=term{i}" for i in range(150)) + "&keyterm=" + "x" * 300
    query = "?encoding=linear16&utterance_end_ms=10000" + many
    messages, code, _ = exchange(server, query, [json.dumps({"type": "CloseStream"})])
    assert [m["type"] for m in messages] == ["Metadata"] and code == 1000


def ws_url(srv: LiveServer, query: str = "") -> str:
    return srv.url.replace("http://", "ws://") + "/v1/listen" + query


def exchange(
    srv: LiveServer, query: str, frames: list[bytes | str], timeout: float = 60
) -> tuple[list[dict[str, Any]], int | None, str | None]:
    """Frames sent in order on a raw websocket, then every message until the server closes
    (each checked against the SDK's type), and the close code and reason."""
    messages: list[dict[str, Any]] = []
    headers = {"Authorization": f"Token {KEY}"}
    with connect(ws_url(srv, query), additional_headers=headers) as ws:
        for frame in frames:
            ws.send(frame)
        deadline = time.monotonic() + timeout
        with contextlib.suppress(ConnectionClosed):
            while time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    messages.append(strict(ws.recv(timeout=1)))
        return messages, ws.close_code, ws.close_reason


def wav_bytes(audio: np.ndarray, rate: int, subtype: str = "PCM_16", kind: str = "WAV") -> bytes:
    out = io.BytesIO()
    sf.write(out, audio, rate, subtype=subtype, format=kind)
    return out.getvalue()


def test_a_wav_stream_without_encoding_is_read_from_its_header(server: LiveServer) -> None:
    """No `encoding` (Deepgram's advice for containers): the SDK streams a stereo 24 kHz WAV
    file; its header sets rate and channels (mixed into one transcript) and is not audio."""
    speech = soxr.resample(load("sentence_01.wav"), 16000, 24000).astype(np.float32)
    stereo = np.stack([speech, speech], axis=1)
    wav = wav_bytes(np.concatenate([stereo, np.zeros((24000, 2), np.float32)]), 24000)
    client = DeepgramClient(api_key=KEY, environment=environment(server))
    with client.listen.v1.connect(model="nova-3") as socket:
        heard = Listener(socket)
        send(socket, wav, 9600)
        socket.send_close_stream()
        assert heard.wait(heard.closed.is_set)
    heard.checked()
    assert wer([transcripts()["sentence_01.wav"]], [text(heard.finals())]) <= 0.3
    meta = heard.messages[-1]
    assert isinstance(meta, ListenV1Metadata) and meta.channels == 2
    assert meta.duration == pytest.approx(len(stereo) / 24000 + 1, abs=0.01)
    assert meta.sha256 == hashlib.sha256(wav).hexdigest()
    assert heard.tap.ws.close_code == 1000


def test_audio_we_cannot_decode_live_gets_an_error_and_data_0000(server: LiveServer) -> None:
    """No `encoding`: a compressed container (Ogg, FLAC, MP3, WebM) or a WAV whose format
    or rate we cannot stream gets an Error, then close 1008 `DATA-0000`."""
    speech = load("sentence_02.wav")[:16000]
    webm = bytes.fromhex("1a45dfa3a34286810142f7810142f2810442f381084282847765626d")
    cases = {
        "Ogg": wav_bytes(speech, 16000, "VORBIS", "OGG"),
        "FLAC": wav_bytes(speech, 16000, "PCM_16", "FLAC"),
        "MP3": wav_bytes(speech, 16000, "MPEG_LAYER_III", "MP3"),  # (frames, no ID3 tag)
        "WebM": webm + bytes(4000),
        "32-bit": wav_bytes(speech, 16000, "FLOAT"),
        "sample_rate": wav_bytes(speech, 96000),
        "fmt": b"RIFF\0\0\0\0WAVEfmt \x02\0\0\0\x01\0",  # (under 16 bytes: issue 58 §6.4)
    }
    for name, data in cases.items():
        messages, code, reason = exchange(server, "?model=nova-3", [data[:4096]], timeout=20)
        assert [m["type"] for m in messages] == ["Error", "Metadata"], (name, messages)
        assert name in messages[0]["description"], (name, messages[0])
        assert (code, reason) == (1008, "DATA-0000"), name
    # with an encoding, the bytes are what it says (nothing sniffed)
    messages, code, _ = exchange(server, "?encoding=linear16", [cases["Ogg"][:4096], b""])
    assert [m["type"] for m in messages][-1:] == ["Metadata"] and code == 1000
    assert "Error" not in [m["type"] for m in messages]


def test_configure_gets_configure_failure_and_the_stream_goes_on(server: LiveServer) -> None:
    """deepgram-sdk's send_configure: a ConfigureFailure (we do not change keyterms
    mid-stream), then the stream goes on."""
    client = DeepgramClient(api_key=KEY, environment=environment(server))
    with client.listen.v1.connect(model="nova-3", encoding="linear16") as socket:
        heard = Listener(socket)
        socket.send_configure(ListenV1Configure(keyterms=["Qwen"]))
        assert heard.wait(lambda: bool(heard.of(ListenV1ConfigureFailure)), timeout=30)
        send(socket, pcm16(load("sentence_03.wav")), 3200)
        socket.send_close_stream()
        assert heard.wait(heard.closed.is_set)
    raw = heard.checked()
    (failed,) = heard.of(ListenV1ConfigureFailure)
    assert failed.code == "CONFIGURE_KEYTERMS_NOT_SUPPORTED" and "query" in failed.description
    assert failed.request_id == raw[-1]["request_id"]
    assert not heard.of(ListenV1Error)
    assert wer([transcripts()["sentence_03.wav"]], [text(heard.finals())]) <= 0.3
    assert heard.tap.ws.close_code == 1000


def test_an_empty_binary_frame_closes_the_stream_as_close_stream_does(server: LiveServer) -> None:
    """Deepgram's older close signal: the buffered audio finalised, Metadata, close 1000."""
    audio = pcm16(load("sentence_04.wav"))
    frames: list[bytes | str] = [audio[i : i + 3200] for i in range(0, len(audio), 3200)]
    messages, code, _ = exchange(server, "?encoding=linear16", [*frames, b""])
    assert [m["type"] for m in messages][-1] == "Metadata" and code == 1000
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    said = " ".join(m["channel"]["alternatives"][0]["transcript"] for m in finals)
    assert wer([transcripts()["sentence_04.wav"]], [said]) <= 0.3


def test_a_text_frame_over_4_kib_gets_an_error_and_the_stream_goes_on(server: LiveServer) -> None:
    padded = json.dumps({"type": "KeepAlive", "pad": "x" * 5000})
    frames: list[bytes | str] = [padded, json.dumps({"type": "CloseStream"})]
    messages, code, _ = exchange(server, "?encoding=linear16", frames)
    assert [m["type"] for m in messages] == ["Error", "Metadata"] and code == 1000
    assert "4096 bytes" in messages[0]["description"]


def test_audio_past_ws_max_session_s_closes_1008_data_0000() -> None:
    """The stream's audio limit: an Error, Metadata, then Deepgram's documented 1008
    `DATA-0000` (there is no DATA-0001)."""
    settings = whisper_settings(api_key=KEY, ws_max_session_s=1.0)
    with live_server(create_app(settings)) as srv:
        audio = pcm16(load("sentence_05.wav"))
        messages, code, reason = exchange(srv, "?encoding=linear16", [audio[:16000], audio])
    kinds = [m["type"] for m in messages]
    assert kinds[0] == "Error" and kinds[-1] == "Metadata", kinds
    assert messages[0]["variant"] == "LimitError"  # (not SchemaError: issue 58 §6.9)
    meta = messages[-1]  # the refused frame counts in neither (issue 58 §6.9)
    assert meta["sha256"] == hashlib.sha256(audio[:16000]).hexdigest()
    assert meta["duration"] == pytest.approx(0.5, abs=0.01)
    assert (code, reason) == (1008, "DATA-0000")


def test_a_final_that_comes_after_its_gap_was_heard_is_followed_by_utterance_end() -> None:
    """All the audio sent (the stream at 5 s), the final of speech ending at 3 s comes late
    (a busy engine): its UtteranceEnd follows at once, since no more audio may come to
    trigger it (the client waits on it, as the real-server test does); not while another
    utterance is open."""
    wire = wire_for(utterance_end_ms=1000)
    wire.event(0, SpeechStarted(1, 500), 0.5)
    out = wire.event(0, Final(1, "hello", "silence", (), 2.5, start=0.5, end=3.0), 5.0)
    assert [m["type"] for m, _ in out] == ["Results", "UtteranceEnd"]
    assert out[1][0]["last_word_end"] == 3.0
    wire.event(0, SpeechStarted(2, 6000), 6.0)
    wire.event(0, SpeechStarted(3, 9000), 9.0)
    out = wire.event(0, Final(2, "again", "silence", (), 2.0, start=6.0, end=8.0), 10.0)
    assert [m["type"] for m, _ in out] == ["Results"]  # utterance 3 is being spoken


def test_a_failed_final_forgets_its_utterance_start() -> None:
    wire = wire_for()
    wire.event(0, SpeechStarted(1, 500), 0.5)
    failed = FinalFailed(1, "silence", (), 1.0, InferenceError("boom"), start=0.5, end=1.5)
    wire.event(0, failed, 1.5)
    assert wire.lanes[0].started == {}


def post(
    srv: LiveServer, body: bytes, query: str = "", kind: str = "audio/wav", key: str = KEY
) -> httpx.Response:
    headers = {"Authorization": f"Token {key}", "Content-Type": kind}
    return httpx.post(srv.url + "/v1/listen" + query, content=body, headers=headers, timeout=120)


def test_prerecorded_file_with_utterances_and_paragraphs(server: LiveServer) -> None:
    """The raw body (a WAV), the sync client's transcribe_file: one channel, its words with
    times inside the audio, utterances (one a pause-cut segment) and paragraphs; the raw
    body checked against the SDK's ListenV1Response."""
    wav = speech_file("three_sentences.wav")
    client = DeepgramClient(api_key=KEY, environment=environment(server))
    response = client.listen.v1.media.transcribe_file(
        request=wav, model="nova-3", utterances=True, paragraphs=True, language="en"
    )
    assert isinstance(response, ListenV1Response)
    (channel,) = response.results.channels
    assert channel.alternatives is not None
    best: Any = channel.alternatives[0]
    assert wer([transcripts()["three_sentences.wav"]], [best.transcript]) <= 0.3
    assert best.words and all(0 <= w.start <= w.end <= 12.7 for w in best.words)
    assert response.results.utterances and best.paragraphs.paragraphs
    assert response.metadata.sha256 == hashlib.sha256(wav).hexdigest()
    assert response.metadata.channels == 1 and abs(response.metadata.duration - 12.656) < 0.01
    raw = post(server, wav, "?utterances=true&paragraphs=true&model=nova-3")
    assert raw.status_code == 200, raw.text
    data = raw.json()
    check_fields(ListenV1Response, data, "Response")
    ListenV1Response.model_validate(data)


def test_prerecorded_multichannel_call_with_the_async_client(server: LiveServer) -> None:
    stereo, _ = call()

    async def run() -> Any:
        client = AsyncDeepgramClient(api_key=KEY, environment=environment(server))
        return await client.listen.v1.media.transcribe_file(
            request=stereo, model="nova-3", multichannel=True
        )

    response = asyncio.run(run())
    assert len(response.results.channels) == 2
    for c, side in enumerate((AGENT, CUSTOMER)):
        said = response.results.channels[c].alternatives[0].transcript
        assert wer([reference(side)], [said]) <= 0.35, (c, said)
    assert response.metadata.channels == 2


def test_prerecorded_refusals_are_deepgram_errors(server: LiveServer) -> None:
    """A URL body (this server fetches none), a wrong key, an empty body, undecodable bytes."""
    client = DeepgramClient(api_key=KEY, environment=environment(server))
    with pytest.raises(ApiError) as sdk:
        client.listen.v1.media.transcribe_url(url="https://example.com/a.wav", model="nova-3")
    assert sdk.value.status_code == 400
    for answer, status in (
        (post(server, b'{"url": "https://example.com/a.wav"}', kind="application/json"), 400),
        (post(server, b"RIFF", key="wrong"), 401),
        (post(server, b""), 400),
        (post(server, b"not audio at all" * 100, kind="application/octet-stream"), 400),
    ):
        assert answer.status_code == status, answer.text
        body = answer.json()
        assert set(body) == {"err_code", "err_msg", "request_id"}, body
        assert body["request_id"] == answer.headers["x-request-id"]


def speech_file(name: str) -> bytes:
    return (Path(__file__).parent / "data" / "speech" / name).read_bytes()


def test_endpointing_false_keeps_voice_detection_and_ends_nothing_at_silence(
    server: LiveServer,
) -> None:
    """endpointing=false with vad_events (LiveKit's endpointing_ms=0): silence before the
    speech gets no SpeechStarted and no final, the speech one SpeechStarted; a pause ends
    nothing: the only final answers the Finalize (issue 58 §6.2)."""
    speech = load("sentence_02.wav")
    silence = np.zeros(32000, np.float32)
    audio = pcm16(np.concatenate([silence, speech, silence]))
    frames: list[bytes | str] = [audio[i : i + 6400] for i in range(0, len(audio), 6400)]
    frames += [json.dumps({"type": "Finalize"}), json.dumps({"type": "CloseStream"})]
    query = "?encoding=linear16&sample_rate=16000&endpointing=false&vad_events=true"
    messages, code, _ = exchange(server, query, frames, timeout=90)
    started = [m for m in messages if m["type"] == "SpeechStarted"]
    assert len(started) == 1 and started[0]["timestamp"] >= 1.5, started
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    assert finals and all(r["from_finalize"] and not r["speech_final"] for r in finals)
    said = " ".join(r["channel"]["alternatives"][0]["transcript"] for r in finals)
    assert wer([transcripts()["sentence_02.wav"]], [said]) <= 0.4  # (whisper-tiny.en)
    assert finals[0]["start"] >= 1.5 and code == 1000


def test_a_fault_of_ours_on_a_message_is_an_error_and_1011(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected error while a message is handled: an Error (InternalError), Metadata,
    then 1011 NET-0000, never a clean 1000 (issue 58 §6.4)."""

    async def broken(self: Any, data: bytes) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(live.Stream, "audio", broken)
    messages, code, reason = exchange(server, "?encoding=linear16", [bytes(3200)], timeout=30)
    assert [m["type"] for m in messages] == ["Error", "Metadata"], messages
    assert (
        messages[0]["variant"] == "InternalError" and "RuntimeError" in messages[0]["description"]
    )
    assert (code, reason) == (1011, "NET-0000")


def test_prerecorded_diarize_with_multichannel_diarizes_each_channel(server: LiveServer) -> None:
    """diarize=true&multichannel=true: each channel diarized, its speakers numbered from 0
    (Deepgram's per-channel numbering): two voices on channel 0, one on channel 1 (issue 58
    §6.3; every word was speaker 0)."""
    gap = np.zeros(16000, np.float32)
    left = np.concatenate([clip("meeting:0"), gap, clip("meeting:1"), gap])
    right = np.zeros_like(left)
    right[: len(clip("meeting:7"))] = clip("meeting:7")
    answer = post(
        server, wav_bytes(np.stack([left, right], axis=1), 16000), "?diarize=true&multichannel=true"
    )
    assert answer.status_code == 200, answer.text
    channels = answer.json()["results"]["channels"]
    speakers = [[w["speaker"] for w in c["alternatives"][0]["words"]] for c in channels]
    first = speakers[0]
    assert first and first[0] == 0 and set(first) == {0, 1}, speakers
    assert first == sorted(first), speakers  # (the first voice, then the second)
    assert speakers[1] and set(speakers[1]) == {0}, speakers


def test_a_shutdown_sends_the_finals_then_metadata_before_1012() -> None:
    """The server shuts down mid-utterance: the open utterance's final, then Metadata, then
    uvicorn's 1012 (issue 58 §6.7: no Metadata came)."""
    messages: list[dict[str, Any]] = []
    with live_server(create_app(whisper_settings(api_key=KEY))) as srv:
        url = ws_url(srv, "?encoding=linear16&sample_rate=16000&vad_events=true")
        with connect(url, additional_headers={"Authorization": f"Token {KEY}"}) as ws:
            ws.send(pcm16(load("sentence_02.wav")))  # (no silence after: the utterance is open)
            messages.append(strict(ws.recv(timeout=60)))
            assert messages[0]["type"] == "SpeechStarted"
            stopping = threading.Thread(target=srv.stop)
            stopping.start()
            with contextlib.suppress(ConnectionClosed):
                while True:
                    messages.append(strict(ws.recv(timeout=60)))
            stopping.join(60)
            code = ws.close_code
    kinds = [m["type"] for m in messages]
    assert kinds[-1] == "Metadata" and kinds.count("Metadata") == 1, kinds
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    said = " ".join(r["channel"]["alternatives"][0]["transcript"] for r in finals)
    assert wer([transcripts()["sentence_02.wav"]], [said]) <= 0.4, said
    assert code == 1012


def test_a_frame_over_ws_max_frame_bytes_is_a_limit_error_counted_nowhere(
    server: LiveServer,
) -> None:
    """A binary frame over WS_MAX_FRAME_BYTES (1 MiB): an Error with variant LimitError (not
    SchemaError, which is a text message that could not be parsed), the stream goes on; the
    frame counts in neither Metadata's sha256 nor its duration (issue 58 §6.9)."""
    big, small = bytes(1_100_000), bytes(3200)
    close = json.dumps({"type": "CloseStream"})
    messages, code, _ = exchange(server, "?encoding=linear16", [small, big, close])
    assert [m["type"] for m in messages] == ["Error", "Metadata"], messages
    assert messages[0]["variant"] == "LimitError"
    assert messages[1]["sha256"] == hashlib.sha256(small).hexdigest()
    assert messages[1]["duration"] == pytest.approx(0.1, abs=0.01) and code == 1000


def test_prerecorded_raw_audio_follows_encoding_sample_rate_and_channels(
    server: LiveServer,
) -> None:
    """A body with no container is read as the query's encoding, sample_rate and channels
    (Deepgram's raw audio); a WAV body keeps its own header's (issue 58 §4)."""
    speech = load("sentence_02.wav")
    narrow = soxr.resample(speech, 16000, 8000).astype(np.float32)
    mulaw = g711.encode(narrow, "mulaw")
    answer = post(server, mulaw, "?encoding=mulaw&sample_rate=8000", "application/octet-stream")
    assert answer.status_code == 200, answer.text
    data = answer.json()
    said = data["results"]["channels"][0]["alternatives"][0]["transcript"]
    assert wer([transcripts()["sentence_02.wav"]], [said]) <= 0.3, said
    assert data["metadata"]["duration"] == pytest.approx(len(mulaw) / 8000, abs=0.01)
    assert data["metadata"]["sha256"] == hashlib.sha256(mulaw).hexdigest()
    stereo = pcm16(np.stack([speech, np.zeros_like(speech)], axis=1).reshape(-1))
    query = "?encoding=linear16&sample_rate=16000&channels=2&multichannel=true"
    answer = post(server, stereo, query, "audio/l16")
    assert answer.status_code == 200, answer.text
    channels = answer.json()["results"]["channels"]
    said = [c["alternatives"][0]["transcript"] for c in channels]
    assert len(said) == 2 and wer([transcripts()["sentence_02.wav"]], [said[0]]) <= 0.3, said
    assert answer.json()["metadata"]["duration"] == pytest.approx(len(speech) / 16000, abs=0.01)
    wav = wav_bytes(speech, 16000)  # (its header is read, not taken for audio at 8 kHz)
    answer = post(server, wav, "?encoding=linear16&sample_rate=8000")
    assert answer.json()["metadata"]["duration"] == pytest.approx(len(speech) / 16000, abs=0.01)
