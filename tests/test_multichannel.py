"""Multichannel uploads (issue 44) on the whisper engine with real speech: a two-sided call
with one speaker per channel (turns with some overlap), and the same call with the other
side's -25 dB echo on each channel. Every word lands on its speaker's channel, the
channels merge into one timeline, and the OpenAI SDK parses every answer."""

from __future__ import annotations

import io
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import soxr

import speech
from calls import (
    AGENT,
    CUSTOMER,
    NAMES,
    RATE,
    alternating,
    call,
    call_tracks,
    clip,
    placed_call,
    reference,
    sentence,
)
from engines import Recording
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.audio.channels import EchoGate, without_echo
from qwen3_asr_server.engines import create_engine
from server import LiveServer, live_server
from wer import normalize, wer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings())) as srv:
        yield srv


def client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)


def mono_wer(srv: LiveServer, channel: int) -> float:
    """That voice alone: its clean channel of the call, uploaded as a mono file."""
    tracks, _ = sf.read(io.BytesIO(call()[0]), dtype="float32")
    buf = io.BytesIO()
    sf.write(buf, tracks[:, channel], RATE, format="WAV")
    text = client(srv).audio.transcriptions.create(model="m", file=("m.wav", buf.getvalue())).text
    return wer([reference((AGENT, CUSTOMER)[channel])], [text])


@pytest.mark.parametrize("echo_db", [None, 25.0])
def test_every_word_lands_on_its_channel(server: LiveServer, echo_db: float | None) -> None:
    audio, _ = call(echo_db)
    body = client(server).audio.transcriptions.create(
        model="whisper-1",
        file=("call.wav", audio),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
        extra_body={"multichannel": "true", "channel_names": NAMES},
    )
    segments: list[Any] = body.segments or []
    assert segments and all(s.speaker == NAMES[s.channel] for s in segments)  # type: ignore[attr-defined]
    assert [s.start for s in segments] == sorted(s.start for s in segments)  # one timeline
    words: list[Any] = body.words or []
    assert words and all(w.channel in (0, 1) for w in words)  # type: ignore[attr-defined]
    for channel, names in enumerate((AGENT, CUSTOMER)):
        text = " ".join(s.text for s in segments if s.channel == channel)  # type: ignore[attr-defined]
        assert wer([reference(names)], [text]) <= mono_wer(server, channel) + 0.05, (channel, text)
    first = normalize(segments[0].text).split()
    assert first[:2] == normalize(reference(AGENT[:1])).split()[:2]  # the agent spoke first


def test_diarized_json_names_each_channel_and_srt_vtt_label_cues(server: LiveServer) -> None:
    audio, _ = call(25.0)
    extra = {"multichannel": "true", "channel_names": NAMES}
    c = client(server)
    body = c.audio.transcriptions.create(
        model="whisper-1", file=("c.wav", audio), response_format="diarized_json", extra_body=extra
    )
    assert [s.speaker for s in body.segments][:2] == ["agent", "customer"]
    assert {s.speaker for s in body.segments} == set(NAMES)
    srt = c.audio.transcriptions.create(
        model="whisper-1", file=("c.wav", audio), response_format="srt", extra_body=extra
    )
    assert "[agent] " in str(srt) and "[customer] " in str(srt)
    vtt = c.audio.transcriptions.create(
        model="whisper-1", file=("c.wav", audio), response_format="vtt", extra_body=extra
    )
    assert "<v agent>" in str(vtt) and "<v customer>" in str(vtt)
    plain = c.audio.transcriptions.create(
        model="whisper-1", file=("c.wav", audio), extra_body={"multichannel": "true"}
    )
    assert normalize(plain.text).split()[:2] == normalize(reference(AGENT[:1])).split()[:2]


def test_the_stream_sends_segments_in_time_order_then_done(server: LiveServer) -> None:
    audio, _ = call(25.0)
    stream = client(server).audio.transcriptions.create(
        model="whisper-1",
        file=("c.wav", audio),
        response_format="diarized_json",
        stream=True,
        extra_body={"multichannel": "true", "channel_names": NAMES},
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and kinds.count("transcript.text.segment") >= 4
    starts = [e.start for e in events if e.type == "transcript.text.segment"]  # type: ignore[union-attr]
    assert starts == sorted(starts)
    usage = events[-1].usage  # type: ignore[union-attr]
    assert usage is not None and usage.output_tokens > 0  # whisper's count (issue 49)


def mono_wav() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, clip(AGENT[0]), RATE, format="WAV")
    return buf.getvalue()


def many_channels(count: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros((RATE, count), np.float32), RATE, format="WAV")
    return buf.getvalue()


MC, NAMES_ = {"multichannel": "true"}, "channel_names"


@pytest.mark.parametrize(
    ("file", "fields", "param"),
    [
        (mono_wav, {"multichannel": "true"}, "multichannel"),
        (lambda: many_channels(9), {"multichannel": "true"}, "multichannel"),
        (lambda: call()[0], {"multichannel": "true", "channel_names[]": ["a"]}, "channel_names"),
        (lambda: call()[0], {"multichannel": "true", "diarize": "true"}, "diarize"),
        (lambda: call()[0], {"channel_names[]": ["a", "b"]}, "channel_names"),
        # issue 49: the names label SRT and VTT cues, as known_speaker_names[] do
        (lambda: call()[0], MC | {"channel_names[]": ["a\n\n99\n00:00:00,000 --> x", "b"]}, NAMES_),
        (lambda: call()[0], MC | {"channel_names[]": ["Agent>Bob", "b"]}, NAMES_),
        (lambda: call()[0], MC | {"channel_names[]": ["[a]", "b"]}, NAMES_),
        (lambda: call()[0], MC | {"channel_names[]": ["a --> b", "b"]}, NAMES_),
        (lambda: call()[0], MC | {"channel_names[]": ["x" * 65, "b"]}, NAMES_),
        (lambda: call()[0], MC | {"channel_names[]": ["same", " same"]}, NAMES_),
        (lambda: call()[0], MC | {"include[]": ["logprobs"]}, "include"),  # was "logprobs": []
        (lambda: call()[0], MC | {"include[]": ["logprobs"], "stream": "true"}, "include"),
    ],
)
def test_bad_multichannel_requests_name_the_field(
    server: LiveServer, file: Any, fields: dict[str, Any], param: str
) -> None:
    response = httpx.post(
        server.url + "/v1/audio/transcriptions",
        files={"file": ("f.wav", file())},
        data={"model": "m", **fields},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def wav_header(channels: int, tag: int = 1) -> bytes:
    """A 16-bit WAV with `channels` and codec `tag` in its header, and 0.1 s of data."""
    align = max(channels, 1) * 2
    fmt = struct.pack("<HHIIHH", tag, channels, RATE, RATE * align, align, 16)
    data = b"\0" * (RATE // 10 * align)
    body = b"WAVEfmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(data))
    return b"RIFF" + struct.pack("<I", len(body) + len(data)) + body + data


@pytest.mark.parametrize(
    ("file", "code", "says"),
    [
        (wav_header(0), "invalid_audio", "no channels"),  # was "this file has 1 (mono)"
        (wav_header(2, tag=0x1234), "invalid_audio", "no codec"),  # was 'NoneType' object ...
        (b"", "empty_file", "empty"),  # was "not a supported audio format"
    ],
)
def test_a_broken_or_empty_file_with_multichannel_says_what_is_wrong(
    server: LiveServer, file: bytes, code: str, says: str
) -> None:
    """Issue 58 §7.6."""
    response = httpx.post(
        server.url + "/v1/audio/transcriptions",
        files={"file": ("f.wav", file)},
        data={"model": "m", "multichannel": "true"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "file" and error["code"] == code, error
    assert says in error["message"] and "NoneType" not in error["message"], error


def test_without_voice_detection_a_call_is_transcribed_channel_by_channel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Silero VAD is an optional extra (issue 49: the fallback had no test). Without it, a
    multichannel upload's channels are cut as mono files are, not a 500; every channel's
    words are still on it."""
    from qwen3_asr_server.audio import vad
    from qwen3_asr_server.errors import ModelLoadError

    def absent() -> None:
        raise ModelLoadError("Silero VAD is not installed")

    monkeypatch.setattr(vad, "silero_onnx_path", absent)
    audio, _ = call()
    with live_server(create_app(whisper_settings())) as srv:
        body = client(srv).audio.transcriptions.create(
            model="whisper-1",
            file=("call.wav", audio),
            response_format="verbose_json",
            extra_body={"multichannel": "true", "channel_names": NAMES},
        )
    segments: list[Any] = body.segments or []
    for channel, names in enumerate((AGENT, CUSTOMER)):
        text = " ".join(s.text for s in segments if s.channel == channel)
        assert wer([reference(names)], [text]) <= 0.5, (channel, text)


def test_the_echo_gate_silences_only_the_quieter_copy() -> None:
    rng = np.random.default_rng(0)
    near = rng.standard_normal(RATE).astype(np.float32) * 0.3
    tracks = [near, near * 10 ** (-25 / 20)]  # channel 1 carries channel 0's echo
    cleaned = without_echo(tracks)
    assert np.array_equal(cleaned[0], near) and not cleaned[1].any()
    both = [near, rng.standard_normal(RATE).astype(np.float32) * 0.2]  # both talk at once
    kept = without_echo(both)
    assert np.count_nonzero(kept[1]) > 0.95 * RATE


def test_the_live_echo_gate_cuts_as_the_upload_gate_across_any_messages() -> None:
    """A live stream's gate (EchoGate) sees messages of any length; with the delayed
    reference carried across them, it silences exactly what the upload's gate does."""
    tracks, _ = call_tracks(25.0)
    whole = np.stack(without_echo([tracks[0], tracks[1]]), axis=1)
    gate = EchoGate(2)
    frames = tracks.T
    pieces = [gate.push(frames[i : i + 1001]) for i in range(0, len(frames), 1001)]
    live = np.concatenate([*pieces, gate.rest()])
    assert np.array_equal(live, whole)
    assert np.count_nonzero(whole[:, 1] == 0) > np.count_nonzero(tracks[1] == 0) + RATE  # echo cut


def test_on_qwen_each_turn_is_placed_in_time(qwen_settings: Any) -> None:
    """Qwen (the tiny random checkpoint: its words are noise, its times are not) gives a
    segment no times inside; each channel is then cut at every turn, so each turn's segment
    starts where the turn does and the channels interleave: agent, customer, agent, customer
    (one 30 s window per channel would put both first segments at 0)."""
    audio, starts = call()
    with live_server(create_app(qwen_settings())) as srv:
        body = client(srv).audio.transcriptions.create(
            model="m",
            file=("call.wav", audio),
            response_format="verbose_json",
            extra_body={"multichannel": "true", "channel_names": NAMES},
        )
    segments: list[Any] = body.segments or []
    assert [s.channel for s in segments] == [0, 1, 0, 1], segments
    for segment, start in zip(segments, starts, strict=True):
        assert abs(segment.start - start) < 0.4, (segment.start, start)


def sentence_words(number: int) -> set[str]:
    return set(normalize(speech.sentences()[f"sentence_{number:02d}.wav"]).split())


def check_turns(segments: list[Any], turns: list[tuple[int, float, int]]) -> None:
    """One segment a turn, in the turns' order, each on its channel, starting at its speech
    (the sentence's audio starts ~0.2 s into its clip) and holding mostly its words."""
    assert [s.channel for s in segments] == [c for c, _, _ in turns], segments
    for s, (_, start, number) in zip(segments, turns, strict=True):
        assert start - 0.3 < s.start < start + 0.8, (s, start)
        assert s.end < start + len(sentence(number)) / RATE + 0.5, (s, start)
        words = normalize(s.text).split()
        assert sum(w in sentence_words(number) for w in words) >= 0.6 * len(words), (s, number)


def test_a_long_call_comes_back_turn_by_turn_in_order(server: LiveServer) -> None:
    """44 s of 10 alternating turns, 0.5 s apart (issue 49): pauses were shortened on each
    channel where the other side speaks, so whisper heard one side's turns back to back
    and one segment held three of them (0.31-20.81 s). Now the turns alternate, each one
    segment at its own time; and an agent at 0.5 s and 40.5 s with the customer at 20.5 s
    gives three segments, not one agent segment from 0.57 s to 46 s."""
    for turns in (alternating(), [(0, 0.5, 1), (1, 20.5, 2), (0, 40.5, 3)]):
        audio, _ = placed_call(turns)
        body = client(server).audio.transcriptions.create(
            model="whisper-1",
            file=("call.wav", audio),
            response_format="verbose_json",
            extra_body={"multichannel": "true"},
        )
        check_turns(body.segments or [], turns)
        assert body.words is None  # asked of whisper to place the segments, not sent


def test_a_short_8_khz_call_places_each_segment_at_its_speech(server: LiveServer) -> None:
    """An 8 kHz 14 s call (issue 49: a segment started at 7.0 s for speech at 13.0 s)."""
    turns = [(0, 0.5, 1), (1, 4.5, 2), (0, 8.5, 4), (1, 12.8, 5)]
    audio, _ = placed_call(turns, rate=8000)
    body = client(server).audio.transcriptions.create(
        model="whisper-1",
        file=("call.wav", audio),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
        extra_body={"multichannel": "true"},
    )
    segments: list[Any] = body.segments or []
    assert [s.channel for s in segments] == [0, 1, 0, 1], segments
    for s, (_, start, _) in zip(segments, turns, strict=True):
        assert start - 0.3 < s.start < start + 0.8, (s, start)
    for w in body.words or []:  # every word inside its segment's time
        assert any(s.start <= w.start <= w.end <= s.end for s in segments), w


def test_an_interjection_keeps_its_times_in_srt_and_vtt(server: LiveServer) -> None:
    """Issue 49: a customer who spoke during the agent's turn became a 1 ms cue at the end
    of the agent's cue (`00:00:07,000 --> 00:00:07,001`). Cues of different channels may
    overlap, as their speech does."""
    turns = [(0, 0.5, 1), (1, 2.0, 2), (0, 4.5, 3)]  # the customer talks over the agent
    audio, _ = placed_call(turns)
    extra = {"multichannel": "true", "channel_names": NAMES}
    c = client(server)
    srt = str(c.audio.transcriptions.create(
        model="whisper-1", file=("c.wav", audio), response_format="srt", extra_body=extra
    ))  # fmt: skip
    cues = [b.split("\n") for b in srt.strip().split("\n\n")]
    times = {text.split("]")[0][1:]: when.split(" --> ") for _, when, text, *_ in cues}
    start, end = (int(t[6:8]) + int(t[9:]) / 1000 for t in times["customer"])
    assert 1.7 < start < 2.9 and end - start > 1.5, srt
    vtt = str(c.audio.transcriptions.create(
        model="whisper-1", file=("c.wav", audio), response_format="vtt", extra_body=extra
    ))  # fmt: skip
    line = next(ln for ln in vtt.splitlines() if "-->" in ln and "00:00:02" in ln.split()[0])
    start, end = (float(t[6:]) for t in line.split(" --> "))
    assert end - start > 1.5, vtt


def with_bad_floats(audio: np.ndarray) -> np.ndarray:
    """A copy with NaN, +Inf and -Inf samples sprinkled through it (every 997th sample)."""
    bad = audio.copy()
    flat = bad.reshape(-1)
    flat[::997], flat[500::997], flat[700::997] = np.nan, np.inf, -np.inf
    return bad


@pytest.mark.parametrize(("stereo", "rate"), [(False, 16000), (False, 44100), (True, 44100)])
def test_nan_and_inf_samples_are_silence_not_brackets(
    server: LiveServer, stereo: bool, rate: int
) -> None:
    """Issue 49: NaN or Inf samples in a float WAV gave "))))))". They are taken as silence
    (before resampling, which would spread them), and the speech around them is heard."""
    speech_audio = sentence(1) if not stereo else call_tracks()[0].T
    audio = soxr.resample(speech_audio, RATE, rate) if rate != RATE else speech_audio
    buf = io.BytesIO()
    sf.write(
        buf, with_bad_floats(np.asarray(audio, np.float32)), rate, format="WAV", subtype="FLOAT"
    )
    if not stereo:
        text = (
            client(server)
            .audio.transcriptions.create(model="whisper-1", file=("f.wav", buf.getvalue()))
            .text
        )
        assert ")" not in text
        assert wer([speech.sentences()["sentence_01.wav"]], [text]) < 0.5, text
        return
    # A call is compared channel by channel: its text is in time order, so against the agent's
    # lines then the customer's the WER was about 0.5 by construction (issue 58 §3).
    body = client(server).audio.transcriptions.create(
        model="whisper-1",
        file=("f.wav", buf.getvalue()),
        response_format="verbose_json",
        extra_body={"multichannel": "true"},
    )
    assert ")" not in body.text
    segments: list[Any] = body.segments or []
    for channel, names in enumerate((AGENT, CUSTOMER)):
        heard = " ".join(s.text for s in segments if s.channel == channel)  # type: ignore[attr-defined]
        assert wer([reference(names)], [heard]) < 0.5, (channel, heard)


def test_a_call_gets_the_same_text_however_busy_the_server_is() -> None:
    """Issue 49: a call's text changed from run to run: each channel's job was decoded alone
    or in one engine call with the other channel's, depending on timing (whisper's batched
    word times differ by tens of ms, and its tails start there). Issue 58: the call's jobs
    are batched again, in groups the call fixes: on an idle server, and with the call queued
    behind a long upload (whose own jobs are batched), both channels' jobs share one engine
    call, which carries no other upload's job, and the text is the same."""
    audio, _ = placed_call(alternating(6))
    length = round(sf.info(io.BytesIO(audio)).duration, 2)
    engine = Recording(create_engine(whisper_settings()))
    with live_server(create_app(whisper_settings(), engine=engine)) as srv:  # type: ignore[arg-type]
        c = client(srv)

        def transcribe() -> str:
            return c.audio.transcriptions.create(
                model="whisper-1",
                file=("c.wav", audio),
                response_format="verbose_json",
                timestamp_granularities=["word", "segment"],
                extra_body={"multichannel": "true"},
            ).text

        quiet = transcribe()
        long_file = speech.path("long_2min.wav").read_bytes()
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(
                c.audio.transcriptions.create, model="whisper-1", file=("l.wav", long_file)
            )
            deadline = time.monotonic() + 120
            while not srv.ctx.scheduler.busy:  # the long upload holds the engine
                assert time.monotonic() < deadline and not busy.done()
                time.sleep(0.01)
            loaded = transcribe()
            busy.result()
    jobs = iter(engine.calls)
    calls = [[round(next(jobs), 2) for _ in range(size)] for size in engine.batch_sizes]
    assert [call for call in calls if length in call] == [[length, length]] * 2, calls
    assert loaded == quiet
