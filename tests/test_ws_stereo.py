"""Stereo live streams on /ws/transcribe (issue 44): `channels=2` takes interleaved frames,
s16le or G.711 at 8 kHz as FreeSWITCH's stereo audio fork sends them. Each channel has its
own voice detection and finals, every message about a channel carries `channel`, a flush
finalises both, and a stereo stream takes a seat per channel. Whisper, real speech, a real
server; the call is tests/calls.py's (two espeak-ng voices, one per channel, turns with an
overlap)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import soxr

from calls import AGENT, CUSTOMER, RATE, call_tracks, clip, reference, said
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.audio import g711
from server import LiveServer, live_server
from streaming_client import Collector, open_ws, pcm16
from wer import normalize, wer

pytestmark = pytest.mark.slow
SIDES = (AGENT, CUSTOMER)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings(ws_max_sessions=3))) as srv:
        yield srv


def finals(collector: Collector, channel: int | None) -> list[str]:
    return [
        m["text"]
        for _, m in collector.messages
        if m.get("is_final") and m.get("channel") == channel
    ]


def reset_seen(collector: Collector, channels: list[int | None]) -> bool:
    seen = [m.get("channel") for _, m in collector.messages if m.get("status") == "buffer_reset"]
    return all(c in seen for c in channels)


def session(
    srv: LiveServer, data: bytes, step: int, actions: list[str], **query: str
) -> tuple[dict[str, Any], Collector, float]:
    """Send `data` in messages of `step` bytes, then the actions, and read until every
    channel's buffer_reset (a reset answers after every final before it, in order).
    Returns the connected message, the messages, and when the first action was sent."""
    channels: list[int | None] = [0, 1] if "channels" in query else [None]
    with open_ws(srv.url, language="en", **query) as ws:
        connected = json.loads(ws.recv(timeout=30))
        collector = Collector(ws)
        for i in range(0, len(data), step):
            ws.send(data[i : i + step])
        acted = time.perf_counter()
        for action in actions:
            ws.send(json.dumps({"action": action}))
        assert collector.wait_for(lambda c: reset_seen(c, channels), timeout=120)
    return connected, collector, acted


def stereo_pcm(tracks: np.ndarray) -> bytes:
    return pcm16(np.ascontiguousarray(tracks.T).reshape(-1))


def test_a_stereo_pcm_call_with_echo_keeps_each_voice_on_its_channel(server: LiveServer) -> None:
    """Each channel's finals, in order, score within 0.05 of that voice streamed alone (its
    clean channel on the seed's mono protocol), though each channel carries the other
    side's -25 dB echo. Messages of 4001 bytes split samples and frames."""
    clean, _ = call_tracks()
    echoed, _ = call_tracks(25.0)
    connected, stereo, _ = session(server, stereo_pcm(echoed), 4001, ["reset"], channels="2")
    assert connected["channels"] == 2
    messages = [m for _, m in stereo.messages if m.get("is_final") or m.get("is_partial")]
    assert messages and all(m["channel"] in (0, 1) for m in messages)
    for channel, names in enumerate(SIDES):
        mono, alone, _ = session(server, pcm16(clean[channel]), 3200, ["reset"])
        assert connected["buffer_size"] == 2 * mono["buffer_size"] and "channels" not in mono
        control = wer([reference(names)], [" ".join(finals(alone, None))])
        heard = [t for t in finals(stereo, channel) if t]
        score = wer([reference(names)], [" ".join(heard)])
        assert score <= control + 0.05, (channel, heard, control)
        # in order: the channel's first final starts with its first sentence's words
        first = normalize(said(names[0])).split()[:2]
        assert normalize(heard[0]).split()[:2] == first, heard


def test_a_mulaw_stereo_stream_flush_finalises_both_channels(server: LiveServer) -> None:
    """8 kHz μ-law, as FreeSWITCH forks a call: a turn on each side, then both sides talk at
    once up to the end of the audio, with no silence after. Only the flush can end those
    last utterances; it gives each channel its final, with that channel's words."""
    turns, starts = call_tracks()
    tails = [clip(AGENT[1]), clip(CUSTOMER[1])]
    tail = np.zeros((2, max(map(len, tails))), np.float32)
    for channel, turn in enumerate(tails):
        tail[channel, : len(turn)] = turn
    cut = int(starts[2] * RATE)  # the first two turns and the 0.8 s pause after them
    tracks = np.concatenate([turns[:, :cut], tail], axis=1)
    narrow = soxr.resample(tracks.T, RATE, 8000)
    data = g711.encode(np.ascontiguousarray(narrow).reshape(-1), "mulaw")
    query = {"channels": "2", "sample_rate": "8000", "encoding": "mulaw"}
    _, collector, flushed = session(server, data, 1601, ["flush", "reset"], **query)
    for channel, names in enumerate(SIDES):
        texts = finals(collector, channel)
        # the flush's final, the last: a reset with nothing left adds no empty final
        last = texts[-1]  # the words both sides were saying
        assert wer([said(names[1])], [last]) <= 0.5, (channel, texts)
        other = SIDES[1 - channel][1]
        assert wer([said(other)], [last]) >= 0.8  # not the other side's
        arrived = [t for t, m in collector.messages if m.get("text") == last]
        assert arrived[-1] > flushed


def test_a_stereo_stream_takes_a_seat_per_channel(server: LiveServer) -> None:
    """WS_MAX_SESSIONS=3: a stereo stream takes two, /health counts two (and /metrics one
    stream, two seats), a second stereo stream is refused while a mono one still fits."""
    with open_ws(server.url, channels="2") as stereo:
        assert json.loads(stereo.recv(timeout=30))["channels"] == 2
        assert httpx.get(server.url + "/health").json()["streaming_sessions"] == 2
        # the metrics count one stream and its two seats (issue 49: the stream counted two)
        gauges = metric_values(server)
        on = '{route="/ws/transcribe"}'  # (issue 52: by route)
        assert (gauges["asr_streaming_sessions" + on], gauges["asr_streaming_seats" + on]) == (1, 2)
        with open_ws(server.url, channels="2") as second:
            refused = json.loads(second.recv(timeout=30))
        assert refused["code"] == "TOO_MANY_SESSIONS" and "each channel" in refused["message"]
        with open_ws(server.url) as mono:
            connected = json.loads(mono.recv(timeout=30))
            assert connected["status"] == "connected" and "channels" not in connected


def metric_values(server: LiveServer) -> dict[str, float]:
    """The samples of /metrics by name, labels as written (`name{route="/ws/transcribe"}`)."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    lines = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    return {parts[0]: float(parts[1]) for parts in lines if len(parts) == 2}


@pytest.mark.parametrize("value", ["0", "9", "two"])
def test_a_bad_channel_count_is_refused(server: LiveServer, value: str) -> None:
    with open_ws(server.url, channels=value) as ws:
        error = json.loads(ws.recv(timeout=30))
    assert (error["code"], error["statusCode"]) == ("UNSUPPORTED_CHANNELS", 400)
    assert value in error["message"]
