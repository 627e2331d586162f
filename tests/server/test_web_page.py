"""The web page at `GET /` (server/web_page.py, server/web/) in a real headless Chromium (Debian's `chromium`,
driven by Playwright) against a live server: it loads with the server's voices and nothing from elsewhere, plays
the audio while it streams (shown by events: the Talker is held until the page has played what came before), counts
the samples the server sent, stops (and the server frees the request), shows the server's errors, takes the API key,
lists created voices, works by keyboard and without the waveform, and under a proxy's path prefix. A screenshot goes
to build/screenshots/web-page.png."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import TracebackType

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, Route, expect, sync_playwright

from engine.config import EngineConfig
from tests.conftest import OFFICIAL_VD
from tests.server.conftest import API_KEY, LiveServer, start_server
from tests.server.leaks import scrape, wait_no_leaks

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
# The machine's network is closed: without these Chromium waits on its background services. The autoplay policy
# lets the AudioContext start even when a test's key press is not taken as a user gesture.
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required"]
SCREENSHOT = ROOT / "build" / "screenshots" / "web-page.png"
WAIT_MS = 30_000  # a failure bound around each wait for a condition, never a threshold
ALIGNED_MS = 120_000  # the same, for a response held until its words are timed (tests/server/test_timestamps.py)
TEXT = "Hello from the streaming speech server, this is a test."
LONG_TEXT = "This sentence keeps going on and on so that the audio lasts for a good while. " * 12
SEED = 7
HELD_AT_STEP = 4  # frames 1-3 are made: the first chunks (1 frame, then 2) are out
COMPRESSED = {"mp3": "MediaSource", "aac": "MediaSource", "opus": "once complete", "flac": "once complete"}
CANCELLED = 'talkstream_requests_total{outcome="cancelled",protocol="http"}'
expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():  # a failure, not a skip: scripts/setup --browser installs it
        pytest.fail(f"Debian's chromium is not at {CHROMIUM}: apt-get install chromium (scripts/test does)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, timeout=60_000)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page; the test fails on any script error in it."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    yield page
    context.close()
    assert not errors


def open_page(page: Page, url: str) -> None:
    page.goto(url)
    expect(page.locator("#status")).to_have_text("Ready.")


def result(page: Page) -> Locator:
    return page.locator("#result")


def figure(page: Page, name: str) -> float:
    """A data attribute of #result as a number: bytes, samples, ttfa-ms."""
    value = result(page).get_attribute(f"data-{name}")
    assert value, f"the page has no {name} yet"
    return float(value)


def choose(page: Page, *, text: str = TEXT, fmt: str = "pcm", seed: int | None = SEED) -> dict[str, object]:
    """Fills the form; returns the request body the page will send (the model and voice it shows selected)."""
    page.get_by_label("Text").fill(text)
    page.get_by_label("Format").select_option(fmt)
    page.get_by_label("Seed").fill("" if seed is None else str(seed))
    body: dict[str, object] = {"model": page.get_by_label("Model").input_value(), "input": text,
                               "voice": page.get_by_label("Voice").input_value(), "response_format": fmt, "speed": 1}
    return body if seed is None else {**body, "seed": seed}


def direct(live: LiveServer, body: dict[str, object], key: str | None = None) -> bytes:
    """The same request straight to the server."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(live.url + "/v1/audio/speech", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.content


def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Polls a condition until it holds; fails past the deadline (a failure bound, not a speed threshold)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


class Hold:
    """The Talker held at a request's `at`-th step (the worker's test hook, on its thread) until released: while
    it is held the generation cannot go on, so what the page has by then came before the end."""

    def __init__(self, live: LiveServer, at: int = HELD_AT_STEP) -> None:
        assert live.engine.worker is not None and live.wait_idle()["slots_in_use"] == 0  # its steps are ours
        self.worker, self.at, self.steps = live.engine.worker, at, 0
        self.held, self.released, self.timed_out = threading.Event(), threading.Event(), threading.Event()

    def __enter__(self) -> Hold:
        self.worker.fault_hook = self._hook
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.released.set()
        self.worker.fault_hook = None

    def _hook(self, stage: str, batch: object) -> None:
        if stage != "step":
            return
        self.steps += 1
        if self.steps == self.at:
            self.held.set()
            if not self.released.wait(60):
                self.timed_out.set()

    def still_held(self) -> bool:
        return self.held.is_set() and not self.released.is_set() and self.steps == self.at


def test_the_page_loads_with_the_servers_voices_and_nothing_from_elsewhere(page: Page, live: LiveServer) -> None:
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    response = page.goto(live.url + "/")
    assert response is not None and response.status == 200
    assert "script-src 'self'" in response.headers["content-security-policy"]  # and it still works under it
    expect(page.locator("#status")).to_have_text("Ready.")
    voices = page.get_by_label("Voice").locator("option")
    assert sorted(voices.evaluate_all("options => options.map(o => o.value)")) == sorted(live.engine.voices)
    models = page.get_by_label("Model").locator("option").evaluate_all("options => options.map(o => o.value)")
    assert models[0] == live.engine.model_id and "tts-1" in models
    assert urls and all(url.startswith(live.url + "/") for url in urls), urls  # no CDN, no other origin
    assert {url.removeprefix(live.url) for url in urls} >= {"/", "/web/app.js", "/web/audio.js", "/web/style.css",
                                                            "/v1/models", f"/v1/audio/voices?model={models[0]}"}


def test_every_control_has_a_label_and_the_page_works_by_keyboard_without_the_waveform(
        page: Page, live: LiveServer) -> None:
    open_page(page, live.url + "/")
    for label in ("Text", "Model", "Voice", "Format", "Speed", "Seed", "API key", "Show the waveform"):
        expect(page.get_by_label(label)).to_have_count(1)
    expect(page.get_by_role("button", name="Stop")).to_be_disabled()
    page.get_by_label("Show the waveform").focus()
    page.keyboard.press("Space")
    expect(page.locator("#waveform")).to_be_hidden()
    body = choose(page)
    page.get_by_label("Speed").focus()
    for _ in range(20):  # 0.05 a step
        page.keyboard.press("ArrowRight")
    expect(page.locator("#speed-value")).to_have_text("2.00×")
    page.get_by_label("API key").focus()
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Speak")).to_be_focused()  # the next stop after the last field
    page.keyboard.press("Enter")
    expect(result(page)).to_have_attribute("data-state", re.compile("received|done"))
    assert figure(page, "samples") == len(direct(live, {**body, "speed": 2})) // 2 > 0  # at the speed chosen
    page.get_by_label("Text").fill(LONG_TEXT)
    page.get_by_label("Text").press("Control+Enter")  # speaks from the text box
    expect(result(page)).to_have_attribute("data-samples", re.compile(r"^[1-9]"))
    page.keyboard.press("Escape")  # stops: the long text plays far longer than this takes
    expect(result(page)).to_have_attribute("data-state", "stopped")
    expect(page.locator("#status")).to_have_text("Stopped.")


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
def test_speak_plays_while_it_streams_and_gets_every_sample_the_server_sent(page: Page, live: LiveServer,
                                                                           fmt: str) -> None:
    open_page(page, live.url + "/")
    body = choose(page, fmt=fmt)
    expected = len(direct(live, {**body, "response_format": "pcm"})) // 2
    assert expected > 0
    with Hold(live) as hold:
        page.get_by_role("button", name="Speak").click()
        assert hold.held.wait(30)
        # while the generation cannot go on, the page has samples and has started playing them
        expect(result(page)).to_have_attribute("data-samples", re.compile(r"^[1-9]"))
        expect(result(page)).to_have_attribute("data-ttfa-ms", re.compile(r"\d"))
        assert hold.still_held() and result(page).get_attribute("data-state") == "streaming"
        assert 0 < figure(page, "samples") < expected
    assert not hold.timed_out.is_set()
    expect(result(page)).to_have_attribute("data-state", re.compile("received|done"))
    assert figure(page, "samples") == expected
    assert figure(page, "bytes") == 2 * expected + (44 if fmt == "wav" else 0)
    assert figure(page, "ttfa-ms") > 0
    expect(page.locator("#download-link")).to_have_attribute("download", f"speech.{fmt}")
    if fmt == "pcm":  # while the rest plays, with the waveform drawn live
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)
    expect(result(page)).to_have_attribute("data-state", "done")  # played to the end
    expect(page.get_by_role("button", name="Stop")).to_be_disabled()


@pytest.mark.parametrize("fmt", sorted(COMPRESSED))
def test_compressed_formats_play_and_get_every_byte(page: Page, live: LiveServer, fmt: str) -> None:
    """mp3 and aac stream through MediaSource (Chromium takes both); Ogg Opus and FLAC it does not take there, so
    the page says they play once complete and offers the file."""
    open_page(page, live.url + "/")
    body = choose(page, fmt=fmt)
    expect(page.locator("#format-hint")).to_contain_text(COMPRESSED[fmt])
    expected = len(direct(live, body))
    page.get_by_role("button", name="Speak").click()
    expect(result(page)).to_have_attribute("data-state", re.compile("received|done"))
    assert figure(page, "bytes") == expected
    expect(result(page)).to_have_attribute("data-ttfa-ms", re.compile(r"\d"))  # it played
    assert figure(page, "ttfa-ms") > 0
    expect(page.locator("#download-link")).to_have_attribute("download", f"speech.{fmt}")
    expect(page.locator("#error")).to_be_hidden()


def test_the_page_shows_how_the_text_was_read_out(page: Page, live: LiveServer) -> None:
    open_page(page, live.url + "/")
    body = choose(page, text="The weather is lovely, and it is 42% off today.")
    expected = len(direct(live, {**body, "response_format": "pcm"})) // 2
    page.get_by_role("button", name="Speak").click()
    said = page.locator("#transcript")
    expect(said).to_have_text("Read out in english: The weather is lovely, and it is forty-two percent off today.")
    expect(said).to_have_attribute("data-language", "english")
    expect(result(page)).to_have_attribute("data-state", re.compile("received|done"))
    assert figure(page, "samples") == expected  # the events' audio is the plain stream's


def test_the_page_highlights_each_word_as_it_is_heard(page: Page, live: LiveServer) -> None:
    """The tiny aligner's weights are random, so its times fall anywhere in 400 s: the server's events are passed on
    with each segment's words spread over the segment's own span, so that playing the audio walks through them."""
    sent: list[dict[str, object]] = []

    def spread(route: Route) -> None:
        response = route.fetch()
        lines = []
        for line in response.text().split("\n"):
            if line.startswith("data: ") and '"speech.audio.timestamps"' in line:
                event = json.loads(line[6:])
                step = (event["end"] - event["start"]) / len(event["words"])
                for i, w in enumerate(event["words"]):
                    w["start"], w["end"] = event["start"] + i * step, event["start"] + (i + 1) * step
                sent.append(event)
                line = "data: " + json.dumps(event)
            lines.append(line)
        route.fulfill(response=response, body="\n".join(lines))

    page.route("**/v1/audio/speech", spread)
    open_page(page, live.url + "/")  # the shared server times words (tests/server/conftest.py)
    choose(page, text="Hello there, how are you today?")
    page.get_by_label("Highlight each word as it is heard").check()
    page.get_by_role("button", name="Speak").click()
    # the route hands the page the response whole, after its words are timed: the aligner runs under SCHED_IDLE,
    # which waits for a free core (in CI, with the capability runs beside, that took 30 s): the other timestamp
    # tests' bound, not the page's
    expect(result(page)).to_have_attribute("data-state", "done", timeout=ALIGNED_MS)
    words = [str(w["word"]) for e in sent for w in e["words"]]  # type: ignore[attr-defined]
    assert words == ["Hello", "there", "how", "are", "you", "today"]
    expect(page.locator("#words span")).to_have_text(words)
    expect(page.locator("#words span[aria-current]")).to_have_text(words[-1])  # the last word heard last


def test_stop_cancels_and_the_server_frees_the_request(page: Page, live: LiveServer) -> None:
    open_page(page, live.url + "/")
    choose(page, text=LONG_TEXT)
    cancelled = scrape(live.url).get(CANCELLED, 0.0)
    with Hold(live) as hold:
        page.get_by_role("button", name="Speak").click()
        expect(result(page)).to_have_attribute("data-samples", re.compile(r"^[1-9]"))
        metrics = scrape(live.url)
        assert metrics['talkstream_open_responses{protocol="http"}'] == metrics["talkstream_active_requests"] == 1
        page.get_by_role("button", name="Stop").click()
        expect(result(page)).to_have_attribute("data-state", "stopped")
        expect(page.locator("#status")).to_have_text("Stopped.")
        expect(page.get_by_role("button", name="Speak")).to_be_focused()  # not lost with the disabled Stop
        # the server saw the connection close while the Talker was still held: the stop freed it, not an end
        until(lambda: scrape(live.url)['talkstream_open_responses{protocol="http"}'] == 0, "the response to close")
        assert hold.still_held()
    assert wait_no_leaks(live.url, timeout=30) == {}
    assert scrape(live.url)[CANCELLED] == cancelled + 1
    expect(page.locator("#error")).to_be_hidden()


def test_a_server_error_is_shown(page: Page, live: LiveServer) -> None:
    open_page(page, live.url + "/")
    body = choose(page, text="")
    envelope = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=30)
    assert envelope.status_code == 400
    error = envelope.json()["error"]
    page.get_by_role("button", name="Speak").click()
    expect(result(page)).to_have_attribute("data-state", "error")
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text(f"Error 400 ({error['code']}): {error['message']}")
    expect(page.locator("#status")).to_have_text("Failed.")


@pytest.fixture
def keyed(server_config: EngineConfig, tmp_path: Path) -> Iterator[LiveServer]:
    """A VoiceDesign model behind an API key, with a designed voice in its library. Its random weights seldom end
    a text: a few seconds of audio at most."""
    config = replace(server_config, model=str(OFFICIAL_VD), max_batch=4, max_frames=40)
    server = start_server(config, API_KEY, data_dir=tmp_path)
    try:
        created = httpx.post(server.url + "/v1/audio/voices", headers={"Authorization": f"Bearer {API_KEY}"},
                             json={"type": "prompt", "name": "Calm", "prompt": "A calm, deep voice.",
                                   "model": server.engine.model_id}, timeout=30)
        assert created.status_code == 200, created.text
        yield server
    finally:
        server.stop()


def test_the_api_key_field_and_created_voices(keyed: LiveServer, page: Page) -> None:  # the page closes first
    page.goto(keyed.url + "/")
    expect(page.get_by_role("alert")).to_contain_text("Error 401")
    expect(page.get_by_label("API key")).to_be_focused()  # where the message points
    page.get_by_label("API key").fill(API_KEY)
    page.keyboard.press("Enter")  # loads the voices with the key (it does not speak)
    expect(page.locator("#status")).to_have_text("Ready.")
    expect(page.get_by_role("alert")).to_be_hidden()
    expect(page.get_by_label("Highlight each word as it is heard")).to_be_disabled()  # this server has no aligner
    resp = httpx.post(keyed.url + "/v1/audio/speech", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30,
                      json={"model": "tts-1", "voice": "alloy", "input": "Hi.", "stream_format": "sse",
                            "timestamps": "word"})
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["param"] == "timestamps" and "--aligner" in error["message"]
    calm = page.locator("#voice optgroup[label='Created'] option")
    expect(calm).to_have_text(["Calm"])
    page.get_by_label("Voice").select_option(label="Calm")
    body = choose(page, text="Hello.")  # one segment: at most max_frames
    assert str(body["voice"]).startswith("voice_")
    expected = len(direct(keyed, body, API_KEY)) // 2
    page.get_by_role("button", name="Speak").click()
    expect(result(page)).to_have_attribute("data-state", re.compile("received|done"))
    assert figure(page, "samples") == expected > 0
    page.get_by_role("button", name="Stop").click()  # before the server stops


def test_the_page_works_under_a_path_prefix(page: Page, live: LiveServer) -> None:
    """Behind a proxy that serves the app at /tts/ (and strips the prefix), as Playwright's request routing plays
    it: every request the page makes stays under the prefix."""
    outside: list[str] = []

    def proxy(route: Route) -> None:
        path = route.request.url.removeprefix(live.url)
        if not path.startswith("/tts/"):
            outside.append(path)
            route.fulfill(status=404, body="outside the prefix")
            return
        route.fulfill(response=route.fetch(url=live.url + path.removeprefix("/tts")))

    page.route(f"{live.url}/**", proxy)
    open_page(page, live.url + "/tts/")
    body = choose(page)
    page.get_by_role("button", name="Speak").click()
    expect(result(page)).to_have_attribute("data-state", re.compile("received|done"))
    assert figure(page, "samples") == len(direct(live, body)) // 2
    assert outside == []
