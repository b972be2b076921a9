"""docs/CALLS.md's Twilio Media Streams bridge (examples/twilio_bridge.py, issue 52) run as
its own uvicorn process against a real server: a test plays Twilio, sending a two-sided call
as Twilio's `connected`/`start`/`media`/`stop` messages (base64 8 kHz mu-law, both tracks),
and reads the transcripts the bridge prints and POSTs to a webhook (which fails its first
request: the transcription goes on)."""

from __future__ import annotations

import base64
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from calls import AGENT, CUSTOMER, call_tracks, reference
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.audio import g711
from server import LiveServer, free_port, live_server
from wer import wer

pytestmark = pytest.mark.slow
KEY = "bridge-key"
TOKEN = "bridge-token"
EXAMPLES = Path(__file__).parent.parent / "examples"
CHUNK = 160  # 20 ms of 8 kHz mu-law, as Twilio sends it


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings(api_key=KEY))) as srv:
        yield srv


class Webhook(BaseHTTPRequestHandler):
    """Keeps each POSTed line; answers the first with a 500."""

    posted: list[dict[str, object]]

    def do_POST(self) -> None:
        line = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.posted.append(line)  # type: ignore[attr-defined]
        self.send_response(500 if len(self.server.posted) == 1 else 200)  # type: ignore[attr-defined]
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Webhook)
    httpd.posted = []  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()


@dataclass
class Bridge:
    url: str
    lines: queue.Queue[str]  # stdout: the JSON lines
    errors: queue.Queue[str]  # stderr


def drain(stream: Any, into: queue.Queue[str]) -> None:
    def read() -> None:
        for line in stream:
            into.put(line)

    threading.Thread(target=read, daemon=True).start()


@pytest.fixture
def bridge(server: LiveServer, webhook: ThreadingHTTPServer) -> Iterator[Bridge]:
    with running_bridge(server, f"http://127.0.0.1:{webhook.server_port}") as out:
        yield out


@contextmanager
def running_bridge(server: LiveServer, webhook: str = "") -> Iterator[Bridge]:
    port = free_port()
    env = {**os.environ, "ASR_URL": server.url.replace("http://", "ws://"), "API_KEY": KEY}
    env |= {"BRIDGE_TOKEN": TOKEN, "TRANSCRIPT_WEBHOOK": webhook}
    cmd = [sys.executable, "-m", "uvicorn", "twilio_bridge:app", "--app-dir", str(EXAMPLES)]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = Bridge(f"ws://127.0.0.1:{port}/twilio", queue.Queue(), queue.Queue())
    drain(proc.stdout, out.lines)
    drain(proc.stderr, out.errors)
    deadline = time.monotonic() + 30
    while True:  # ready once it accepts a socket
        try:
            connect(out.url, open_timeout=2).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the bridge did not start"
            time.sleep(0.1)
    try:
        yield out
    finally:
        proc.terminate()
        proc.wait(10)


def twilio_media(track: str, payload: bytes, n: int) -> str:
    media = {"track": track, "chunk": str(n), "timestamp": str(20 * n)}
    media["payload"] = base64.b64encode(payload).decode()
    return json.dumps({"event": "media", "sequenceNumber": str(n + 2), "media": media})


def test_a_two_sided_call_through_twilio_messages_is_transcribed_per_track(
    bridge: Bridge, webhook: ThreadingHTTPServer
) -> None:
    url, lines = bridge.url, bridge.lines
    tracks, _ = call_tracks()  # channel 0 the agent (Twilio's outbound), 1 the customer
    ulaw = [g711.encode(soxr.resample(t, 16000, 8000).astype(np.float32), "mulaw") for t in tracks]
    start = {
        "callSid": "CA123",
        "streamSid": "MZ456",
        "tracks": ["inbound", "outbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"token": TOKEN},
    }
    with connect(url) as ws:
        ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        ws.send(json.dumps({"event": "start", "sequenceNumber": "1", "start": start}))
        for n, at in enumerate(range(0, len(ulaw[0]), CHUNK)):
            ws.send(twilio_media("inbound", ulaw[1][at : at + CHUNK], n))
            ws.send(twilio_media("outbound", ulaw[0][at : at + CHUNK], n))
            time.sleep(0.01)  # twice real time: the call is 20 ms a message
        ws.send(json.dumps({"event": "stop", "sequenceNumber": "9999", "stop": {}}))
        said: dict[str, list[dict[str, object]]] = {"inbound": [], "outbound": []}
        seconds = len(ulaw[0]) / 8000
        deadline = time.monotonic() + 60
        done: set[str] = set()
        while done != {"inbound", "outbound"}:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            got = json.loads(line)  # the bridge prints JSON lines only: a traceback fails here
            assert got["call"] == "CA123" and "error" not in got, got
            if got.get("done"):
                done.add(str(got["track"]))
            else:
                said[str(got["track"])].append(got)
    for track, side in (("inbound", CUSTOMER), ("outbound", AGENT)):
        text = " ".join(str(t["text"]) for t in said[track])
        assert wer([reference(side)], [text]) <= 0.35, (track, text)
        times = [(float(t["start"]), float(t["end"])) for t in said[track]]  # type: ignore[arg-type]
        assert all(0 <= a < b <= seconds + 0.1 for a, b in times), times
        assert times == sorted(times), times
    posted: list[dict[str, object]] = webhook.posted  # type: ignore[attr-defined]
    printed = [t for track in said.values() for t in track]
    assert sorted(map(str, posted)) == sorted(map(str, printed))  # the failed POST included
    assert "webhook" in bridge.errors.get(timeout=10)  # its failure was logged, nothing stopped


@pytest.mark.parametrize("token", ["guess", "gü€ss"])  # (not ASCII: a TypeError, issue 58 §6.6)
def test_a_start_without_the_bridge_token_opens_no_stream(
    bridge: Bridge, server: LiveServer, token: str
) -> None:
    start = {"callSid": "CA9", "tracks": ["inbound"], "customParameters": {"token": token}}
    with connect(bridge.url) as ws:
        ws.send(json.dumps({"event": "start", "sequenceNumber": "1", "start": start}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert server.get("/health").json()["streaming_sessions"] == 0
    assert bridge.lines.empty()


def test_a_track_whose_stream_is_refused_does_not_lose_the_call() -> None:
    """The server takes one stream (WS_MAX_SESSIONS=1): the second track's is refused (429),
    which the bridge reports as that track's error and done lines; the first track is
    transcribed; after `stop` the bridge closes Twilio's socket (1000, not a drop) (issue 58
    §6.5, §6.6)."""
    speech = soxr.resample(call_tracks()[0][0], 16000, 8000).astype(np.float32)
    ulaw = g711.encode(speech, "mulaw")
    start = {
        "callSid": "CA7",
        "tracks": ["inbound", "outbound"],
        "customParameters": {"token": TOKEN},
    }
    settings = whisper_settings(api_key=KEY, ws_max_sessions=1)
    with live_server(create_app(settings)) as srv, running_bridge(srv) as bridge:
        with connect(bridge.url) as ws:
            ws.send(json.dumps({"event": "start", "sequenceNumber": "1", "start": start}))
            for n, at in enumerate(range(0, len(ulaw), CHUNK)):
                ws.send(twilio_media("inbound", ulaw[at : at + CHUNK], n))
                ws.send(twilio_media("outbound", ulaw[at : at + CHUNK], n))
            ws.send(json.dumps({"event": "stop", "sequenceNumber": "9999", "stop": {}}))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=60)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
        got: list[dict[str, Any]] = []
        while sum(1 for line in got if line.get("done")) < 2:
            got.append(json.loads(bridge.lines.get(timeout=60)))
    errors = [line for line in got if "error" in line]
    assert [e["track"] for e in errors] == ["outbound"] and "429" in errors[0]["error"], errors
    text = " ".join(
        str(line["text"]) for line in got if line["track"] == "inbound" and "text" in line
    )
    assert wer([reference(AGENT)], [text]) <= 0.35, text
