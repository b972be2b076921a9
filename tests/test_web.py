"""The browser page at GET / and /ui, driven in real Chromium (Playwright, /usr/bin/chromium)
against a real uvicorn server on the bundled whisper-tiny.en model.

Screenshots of each state go to build/test-artifacts/web/ (ignored by git)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from server import LiveServer, live_server
from wer import wer

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parent.parent
SPEECH = ROOT / "tests" / "data" / "speech"
TRANSCRIPTS: dict[str, str] = json.loads((SPEECH / "transcripts.json").read_text())
ARTIFACTS = ROOT / "build" / "test-artifacts" / "web"
CHROMIUM = "/usr/bin/chromium"
LIVE_WAV = SPEECH / "three_sentences.wav"
API_KEY = "web-test-key"

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (make install-dev installs it)", allow_module_level=True)

# Records the order of what the page shows: partials, finals, upload segments, upload state.
OBSERVER = """() => {
  window.__log = [];
  const log = (kind) => window.__log.push(kind);
  new MutationObserver(() => log('partial')).observe(document.querySelector('#partial .unstable'),
    {childList: true, characterData: true, subtree: true});
  new MutationObserver((m) => m.forEach((r) => r.addedNodes.forEach(() => log('final')))).observe(
    document.getElementById('finals'), {childList: true});
  new MutationObserver((m) => m.forEach((r) => r.addedNodes.forEach(() => log('segment')))).observe(
    document.getElementById('segments'), {childList: true});
  const status = document.getElementById('upload-status');
  new MutationObserver(() => log('state:' + status.dataset.state))
    .observe(status, {attributes: true, attributeFilter: ['data-state']});
}"""


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings(preload=True))) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={LIVE_WAV}",
            ],
        )
        yield chromium
        chromium.close()


class Page:
    """A fresh browser context on `url`; every request it makes is recorded, and any that is
    not to the loopback server is aborted (and fails the test at teardown)."""

    def __init__(self, browser: Any, url: str, width: int = 1280, height: int = 900) -> None:
        self.url = url
        self.requests: list[str] = []
        self.context = browser.new_context(
            viewport={"width": width, "height": height}, accept_downloads=True
        )
        self.context.grant_permissions(["microphone"], origin=url)
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("websocket", lambda ws: self.requests.append(ws.url))
        self.page.set_default_timeout(60_000)

    def _route(self, route: Any) -> None:
        self.requests.append(route.request.url)
        if self._local(route.request.url):
            route.continue_()
        else:
            route.abort()

    def _local(self, url: str) -> bool:
        ws_url = "ws" + self.url.removeprefix("http")
        return url.startswith((self.url + "/", ws_url + "/"))

    def open(self, path: str = "/") -> Any:
        self.page.goto(self.url + path)
        self.page.wait_for_selector("body[data-ready=true]")
        self.page.evaluate(OBSERVER)
        return self.page

    def close(self) -> None:
        self.context.close()
        outside = [url for url in self.requests if not self._local(url)]
        assert not outside, f"requests outside the server: {outside}"
        assert self.requests, "no requests were recorded"


@pytest.fixture
def make_page(browser: Any) -> Iterator[Any]:
    pages: list[Page] = []

    def make(url: str, **kwargs: Any) -> Page:
        pages.append(Page(browser, url, **kwargs))
        return pages[-1]

    yield make
    for page in pages:
        page.close()


def finals_text(page: Any) -> list[str]:
    return page.locator("#finals li span:last-child").all_inner_texts()  # type: ignore[no-any-return]


def run_live(page: Any, finals: int) -> list[str]:
    page.locator("#live-toggle").click()
    page.wait_for_function(
        f"document.querySelectorAll('#finals li').length >= {finals}", timeout=60_000
    )
    texts = finals_text(page)
    page.locator("#live-toggle").click()
    return texts


def test_page_served_at_root_and_ui(server: LiveServer) -> None:
    for path in ("/", "/ui"):
        response = server.get(path)
        assert response.status_code == 200
        assert "text/html" in response.headers["content-type"]
        assert "/ui/static/js/main.js" in response.text
    assert server.get("/ui/static/js/pcm-worklet.js").status_code == 200
    assert server.get("/ui/languages.json").json()["languages"][0]["code"]


def test_live_microphone(server: LiveServer, make_page: Any) -> None:
    page = make_page(server.url).open()
    shot(page, "01-start")
    page.locator("#live-toggle").click()
    page.wait_for_function("document.getElementById('partial').textContent.trim() !== ''")
    shot(page, "02-live-partial")
    page.wait_for_function("document.querySelectorAll('#finals li').length >= 3")
    texts = finals_text(page)[:3]
    page.locator("#live-toggle").click()
    shot(page, "03-live-finals")
    log = page.evaluate("window.__log")
    assert "partial" in log and log.index("partial") < log.index("final"), log
    # whisper-tiny.en on a fake microphone looping the file: loose bound, the order matters.
    score = wer([TRANSCRIPTS[LIVE_WAV.name]], [" ".join(texts)])
    assert score < 0.35, (score, texts)
    assert page.locator("#live-error").is_hidden()


def test_upload_streams_segments_and_downloads_srt(
    server: LiveServer, make_page: Any, tmp_path: Path
) -> None:
    import srt

    page = make_page(server.url).open("/ui")
    page.set_input_files("#file", str(SPEECH / "long_2min.wav"))
    page.locator("#upload-start").click()
    page.wait_for_selector("#segments li")
    shot(page, "04-upload-in-progress")
    page.wait_for_selector("#upload-status[data-state=done]", timeout=90_000)
    shot(page, "05-upload-done")
    log = page.evaluate("window.__log")
    assert log.count("segment") >= 3
    assert log.index("segment") < log.index("state:done"), log
    assert page.locator("#progress-bar").evaluate("e => e.style.width") == "100%"
    text = " ".join(page.locator("#segments li span:last-child").all_inner_texts())
    assert wer([TRANSCRIPTS["long_2min.wav"]], [text]) < 0.3

    with page.expect_download(timeout=90_000) as info:
        page.locator("#dl-srt").click()
    path = tmp_path / "out.srt"
    info.value.save_as(path)
    cues = list(srt.parse(path.read_text()))
    # a cue's text is wrapped into lines (max_line_chars): compare words, not line breaks
    assert len(cues) >= 10 and "lazy dog" in " ".join(cues[0].content.lower().split())
    assert all(a.start <= b.start for a, b in itertools.pairwise(cues))
    assert cues[-1].end.total_seconds() > 100
    with page.expect_download() as info:
        page.locator("#dl-txt").click()
    info.value.save_as(tmp_path / "out.txt")
    assert "lazy dog" in " ".join((tmp_path / "out.txt").read_text().lower().split())

    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"this is not audio at all" * 100)
    expected = httpx.post(
        server.url + "/v1/audio/transcriptions/stream",
        files={"file": ("garbage.wav", garbage.read_bytes())},
        timeout=60,
    ).json()["error"]["message"]
    page.set_input_files("#file", str(garbage))
    page.locator("#upload-start").click()
    page.wait_for_selector("#upload-error:visible")
    assert page.locator("#upload-error").inner_text() == expected
    shot(page, "06-upload-error")


def test_speakers_switch_shows_turns_and_labels_subtitles(
    server: LiveServer, make_page: Any, tmp_path: Path
) -> None:
    """Three espeak-ng voices (tests/data/speech/meeting.wav): each turn shows its speaker,
    coloured, and the VTT download carries voice tags."""
    page = make_page(server.url).open("/ui")
    page.set_input_files("#file", str(SPEECH / "meeting.wav"))
    page.locator("#speakers").check()
    page.locator("#upload-start").click()
    page.wait_for_selector("#upload-status[data-state=done]", timeout=120_000)
    shot(page, "07-speakers")
    speakers = page.locator("#segments li").evaluate_all(
        "items => items.map(i => i.dataset.speaker)"
    )
    assert speakers[:3] == ["A", "B", "C"] and set(speakers) == {"A", "B", "C"}, speakers
    colours = page.locator("#segments li .speaker").evaluate_all(
        "els => els.map(e => getComputedStyle(e).color)"
    )
    assert len(set(colours)) == 3
    with page.expect_download(timeout=120_000) as info:
        page.locator("#dl-vtt").click()
    path = tmp_path / "out.vtt"
    info.value.save_as(path)
    vtt = path.read_text()
    assert "<v A>" in vtt and "<v B>" in vtt and "<v C>" in vtt


def test_channels_switch_labels_each_channel_of_a_call(
    server: LiveServer, make_page: Any, tmp_path: Path
) -> None:
    """A stereo call (agent, customer; tests/test_multichannel.py's fixture, with echo): the
    Channels switch shows each turn under its channel, and the SRT download labels them."""
    from test_multichannel import call

    (tmp_path / "call.wav").write_bytes(call(25.0)[0])
    page = make_page(server.url).open("/ui")
    page.set_input_files("#file", str(tmp_path / "call.wav"))
    page.locator("#speakers").check()
    page.locator("#channels").check()
    assert not page.locator("#speakers").is_checked()  # one or the other
    page.locator("#upload-start").click()
    page.wait_for_selector("#upload-status[data-state=done]", timeout=120_000)
    labels = page.locator("#segments li").evaluate_all("items => items.map(i => i.dataset.speaker)")
    assert labels[:2] == ["channel 0", "channel 1"] and set(labels) == {"channel 0", "channel 1"}
    with page.expect_download(timeout=120_000) as info:
        page.locator("#dl-srt").click()
    path = tmp_path / "out.srt"
    info.value.save_as(path)
    srt = path.read_text()
    assert "[channel 0] " in srt and "[channel 1] " in srt


def test_keyboard_and_phone_width(server: LiveServer, make_page: Any) -> None:
    page = make_page(server.url, width=390, height=844).open()
    shot(page, "07-phone")
    page.set_input_files("#file", str(SPEECH / "sentence_01.wav"))
    reached = []
    for _ in range(20):
        page.keyboard.press("Tab")
        reached.append(page.evaluate("document.activeElement.id"))
    for control in (
        "file",
        "upload-language",
        "sub-mode",
        "upload-start",
        "live-language",
        "vad",
        "live-toggle",
    ):
        assert control in reached, (control, reached)
    page.focus("#live-toggle")
    page.keyboard.press("Enter")
    page.wait_for_selector("#live-toggle[aria-pressed=true]")
    page.keyboard.press("Enter")
    page.wait_for_selector("#live-toggle[aria-pressed=false]")
    page.focus("#upload-start")
    page.keyboard.press("Enter")
    page.wait_for_selector("#upload-status[data-state=done]")
    assert "lazy dog" in page.locator("#segments").inner_text().lower()
    shot(page, "08-phone-upload-done")


# Records the subprotocols of every WebSocket the page opens (where a key would travel).
WS_SPY = """(() => {
  const Native = window.WebSocket;
  window.__wsProtocols = [];
  window.WebSocket = function (url, protocols) {
    window.__wsProtocols.push([String(url), [].concat(protocols || [])]);
    return new Native(url, protocols);
  };
  Object.assign(window.WebSocket, Native);
  window.WebSocket.prototype = Native.prototype;
})();"""


def test_api_key(make_page: Any) -> None:
    """With API_KEY set the page asks for the key; uploads send it, and the live microphone
    mints a client secret with it and opens /v1/realtime with that `ek_` secret only."""
    with live_server(create_app(whisper_settings(api_key=API_KEY, preload=True))) as srv:
        made = make_page(srv.url)
        made.context.add_init_script(WS_SPY)
        page = made.open()
        page.wait_for_selector("#key-panel:visible")
        shot(page, "09-api-key-asked")
        page.fill("#api-key", API_KEY)
        page.locator("#key-save").click()
        page.wait_for_selector("#key-panel", state="hidden")
        page.set_input_files("#file", str(SPEECH / "sentence_01.wav"))
        page.locator("#upload-start").click()
        page.wait_for_selector("#upload-status[data-state=done]")
        assert "lazy dog" in page.locator("#segments").inner_text().lower()
        texts = run_live(page, finals=2)
        assert texts and texts[0].strip()
        shot(page, "10-api-key-works")
        assert page.locator("#live-error").is_hidden()
        score = wer([TRANSCRIPTS[LIVE_WAV.name]], [" ".join(texts)])
        assert score < 0.6, (score, texts)  # two of its three sentences, or more
        opened = page.evaluate("window.__wsProtocols")
        assert [url.split("?")[0].removeprefix("ws://") for url, _ in opened] == [
            f"127.0.0.1:{srv.port}/v1/realtime"
        ]
        protocols = opened[0][1]
        assert protocols[0] == "realtime" and protocols[1].startswith("openai-insecure-api-key.ek_")
        assert all(API_KEY not in url + " ".join(p) for url, p in opened)
        assert any(r.endswith("/v1/realtime/client_secrets") for r in made.requests)
