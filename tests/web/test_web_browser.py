"""The web page in a real browser: headless Chromium from Debian (scripts/setup installs `chromium`
and `chromium-driver`) driven by selenium against a real `tracker --demo` serving the page (issue 14,
"Proof: tests in a real browser").

Each test starts the guard as a subprocess on the synthetic scene (paced at its 10 fps, state and
HOME in tmp_path, the page on 127.0.0.1 at a free port), waits for /api/session to answer, and opens
the page:
- live: the page opens on the Live tab, the MJPEG picture changes from one screenshot of it to a
  later one, and the stats show a frame rate above 0;
- live, guard stopped: the numbers give way to "-" and a sentence saying the guard is not answering,
  which the other tabs and the enrol form say too;
  a live view refused for too many viewers says it tries again, and does;
- events: the Events tab lists an event whose snapshot image has loaded; "This was..." checks its
  name in the page and sends it on Enter; on a phone's 375 px it does not scroll sideways;
- people: enrolling "visitor" from an uploaded photo lists them with their face; an upload that is
  not an image gets its per-file message and an error, and enrols nobody; deleting someone deleted
  already takes them off the list; a name of 64 letters without a space keeps the People and
  Events tabs a phone's 390 px wide;
- login: with a password file, the page asks for the password, says so when it is wrong, and shows
  the tabs and the live view once it is right;
- speed: a run of every backend (13 columns) keeps the page a phone's 390 px wide (its tables scroll).
Every wait is bounded (WebDriverWait, a deadline); no assertion is about time. Each test's final page
is saved to test-artifacts/web/<test name>.png (also on failure). With TRACKER_UPDATE_DOCS_SCREENSHOT=1
the live test also writes docs/web-live.png, the README's picture of the page: the screenshot with
the most named people over one cycle of the scene (20 s more).

The browser never talks to anything but the guard: selenium gets chromedriver's path (so
selenium-manager never runs, let alone downloads a browser), and Chromium's own background traffic
is switched off. A missing browser or driver FAILS the tests (run scripts/setup), never skips them.
Native only (not listed in scripts/aarch64/suite.txt): no browser belongs on the Pi or under emulation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mosquitto import free_port

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = REPO / "test-artifacts" / "web"
DOCS_SCREENSHOT = REPO / "docs" / "web-live.png"
WINDOW = (1280, 900)
GUARD_FRAMES = 36_000   # an hour of the paced scene: the guard ends by itself even if its teardown never came
START_TIMEOUT_S = 60.0  # the guard enrols the scene's people before it serves the page
WAIT_S = 30.0           # upper bound for anything the page should show
STOP_TIMEOUT_S = 20.0   # from SIGTERM to the guard's exit before it is killed
ENROL_WAIT_S = 120.0    # an enrolment runs on the guard's thread between two frames (server.JOB_TIMEOUT_S)
PASSWORD = "correct horse battery staple"

pytestmark = pytest.mark.native_only(reason="a browser test: no browser on the Pi nor under emulation")


# ---- the guard -------------------------------------------------------------------------------------


def tracker_command() -> list[str]:
    """The `tracker` console script of this interpreter's environment (.venv/bin/tracker)."""
    script = Path(sys.executable).with_name("tracker")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tracker"]


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http_proxy of the environment


class Guard:
    """`tracker --demo` serving the page on 127.0.0.1:<free port>, its output in files of its own."""

    def __init__(self, tmp_path: Path, web: dict):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.state = tmp_path / "state"
        config = tmp_path / "tracker.yaml"
        config.write_text(json.dumps({"state_dir": str(self.state),
                                      "web": {"listen": f"127.0.0.1:{self.port}", **web}}), encoding="utf-8")
        env = dict(os.environ, HOME=str(tmp_path / "home"), TRACKER_CACHE_DIR=str(tmp_path / "cache"))
        env.pop("STATE_DIRECTORY", None)
        env.pop("CREDENTIALS_DIRECTORY", None)
        self.stderr_path = tmp_path / "guard.stderr"
        self.stopped = False  # stop() was called (by a test, or at teardown)
        with open(tmp_path / "guard.stdout", "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen([*tracker_command(), "--demo", "--frames", str(GUARD_FRAMES), "--config", str(config)],
                                         stdout=out, stderr=err, env=env, cwd=tmp_path)

    def stderr_tail(self, chars: int = 3000) -> str:
        return self.stderr_path.read_text(errors="replace")[-chars:]

    def wait_until_serving(self) -> None:
        """Polls GET /api/session until it answers 200; fails if the guard exits or the deadline passes."""
        deadline = time.monotonic() + START_TIMEOUT_S
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the guard exited with {self.proc.returncode} before serving the page:\n{self.stderr_tail()}")
            try:
                with _DIRECT.open(self.url + "api/session", timeout=2) as answer:
                    if answer.status == 200:
                        return
                    last = f"status {answer.status}"
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(0.2)
        pytest.fail(f"the page at {self.url} did not answer within {START_TIMEOUT_S:.0f} s ({last}):\n{self.stderr_tail()}")

    def assert_running(self) -> None:
        assert self.proc.poll() is None, f"the guard exited with {self.proc.returncode}:\n{self.stderr_tail()}"

    def stop(self) -> str | None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; what went wrong, or None for a clean exit 0."""
        if self.proc.poll() is not None:
            if self.stopped and self.proc.returncode == 0:
                return None  # a test stopped it, and it exited cleanly then
            return f"the guard had already exited with {self.proc.returncode}"
        self.stopped = True
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)
            return f"the guard did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM (killed)"
        return None if self.proc.returncode == 0 else f"the guard exited with {self.proc.returncode} on SIGTERM"


@pytest.fixture
def start_guard(tmp_path):
    """start_guard(**web) -> a serving Guard; every guard started is stopped at teardown (SIGTERM,
    then SIGKILL after a timeout), whatever the test's outcome."""
    guards: list[Guard] = []

    def start(**web) -> Guard:
        folder = tmp_path / f"guard{len(guards)}"
        folder.mkdir()
        guard = Guard(folder, web)
        guards.append(guard)
        guard.wait_until_serving()
        return guard

    yield start
    problems = [guard.stop() for guard in guards]
    for guard, problem in zip(guards, problems, strict=True):
        assert problem is None, f"{problem}:\n{guard.stderr_tail()}"
        assert "Traceback" not in guard.stderr_tail(1_000_000), guard.stderr_tail()


# ---- the browser -----------------------------------------------------------------------------------


@pytest.fixture
def browser(request, start_guard, tmp_path, monkeypatch):
    """Headless Chromium through Debian's chromedriver. Depends on start_guard so that it is torn
    down first: the final page is saved to test-artifacts/web/<test>.png while the guard still serves it."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: the browser tests need Debian's chromium and chromium-driver; "
                    "run scripts/setup", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # belt and braces: selenium-manager is never asked (explicit Service path)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-proxy-server",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER), log_output=str(tmp_path / "chromedriver.log")),
                              options=options)
    try:
        yield driver
    finally:
        try:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / f"{request.node.name}.png"))
        finally:
            driver.quit()


def wait(driver, timeout: float = WAIT_S):
    """An upper bound for something the page should show; the page rebuilds lists as it updates them,
    so an element found a moment earlier may be gone (stale) at the next poll."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.25,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))


def by_css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def all_by_css(driver, selector: str) -> list:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def image_loaded(driver, selector: str) -> bool:
    """Whether the image `selector` names exists and has loaded a picture (one script: no stale element)."""
    return bool(driver.execute_script(
        "const img = document.querySelector(arguments[0]); return img !== null && img.complete && img.naturalWidth > 0;",
        selector))


def number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def open_tab(driver, name: str) -> None:
    by_css(driver, f'#tabs button[data-tab="{name}"]').click()
    wait(driver).until(lambda d: by_css(d, f"#{name}").is_displayed())


def open_page(driver, guard: Guard) -> None:
    """Loads the page and waits for the Live tab (no password) to be shown with its picture."""
    driver.get(guard.url)
    wait(driver).until(lambda d: by_css(d, "#tabs").is_displayed() and by_css(d, "#live").is_displayed())
    wait(driver).until(lambda d: image_loaded(d, "#live-view"))


# ---- the tests -------------------------------------------------------------------------------------


def test_live_view_moves_and_shows_its_speed(start_guard, browser):
    guard = start_guard()
    open_page(browser, guard)
    assert by_css(browser, '#tabs button[data-tab="live"]').get_attribute("class") == "active"
    assert not by_css(browser, "#login").is_displayed()
    for tab in ("events", "people", "speed"):
        assert not by_css(browser, f"#{tab}").is_displayed(), f"the {tab} tab is shown on the Live tab"
    view = by_css(browser, "#live-view")
    assert view.get_attribute("src").startswith(guard.url + "live.mjpg")
    first = view.screenshot_as_png
    # The scene moves and the stream sends up to web.stream_fps frames a second: a later picture differs.
    time.sleep(1.5)  # a pause between the two pictures, not an assertion: the wait below bounds the check
    wait(browser).until(lambda d: by_css(d, "#live-view").screenshot_as_png != first,
                        "the live picture did not change")
    wait(browser).until(lambda d: (number(by_css(d, "#fps").text) or 0) > 0, "no frame rate above 0 in #fps")
    # The table is rebuilt every second: its stage names read in one script, not row by row.
    stages = wait(browser).until(lambda d: d.execute_script(
        "return Array.from(document.querySelectorAll('#latency tbody td:first-child'), (td) => td.textContent);"),
        "no per-stage latency rows")
    assert {"capture", "motion", "detect", "infer", "track", "publish", "total"} <= set(stages), stages
    assert by_css(browser, "#backend").text not in ("", "-")
    assert by_css(browser, "#live-error").text == ""
    # The stats follow the scene: its first two walkers are counted (and the final screenshot shows them).
    wait(browser).until(lambda d: (number(by_css(d, "#tracks").text) or 0) >= 2, "never two people in view")
    if os.environ.get("TRACKER_UPDATE_DOCS_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.write_bytes(best_labelled_page(browser))
    guard.assert_running()


def test_the_live_tab_shows_no_numbers_while_the_guard_is_not_answering(start_guard, browser):
    """With the guard stopped the page said "Failed to fetch" beside the last frame rate, people in
    view and latency table, as if live."""
    guard = start_guard()
    open_page(browser, guard)
    wait(browser).until(lambda d: (number(by_css(d, "#fps").text) or 0) > 0, "no frame rate above 0 in #fps")
    assert guard.stop() is None
    wait(browser).until(lambda d: "The guard is not answering" in by_css(d, "#live-error").text,
                        "the page did not say the guard is not answering")
    assert [by_css(browser, f"#{id_}").text for id_ in ("fps", "tracks", "backend")] == ["-", "-", "-"]
    assert not all_by_css(browser, "#latency tbody tr")


def test_the_other_tabs_say_so_while_the_guard_is_not_answering(start_guard, browser):
    """With the guard stopped the Events, People and Speed tabs and the enrol form said only the
    browser's "Failed to fetch"."""
    guard = start_guard()
    open_page(browser, guard)
    assert guard.stop() is None
    for tab, message in (("events", "#events-error"), ("people", "#people-error"), ("speed", "#speed-why")):
        open_tab(browser, tab)
        wait(browser).until(lambda d, message=message: by_css(d, message).text != "", f"no message in {message}")
        assert by_css(browser, message).text.startswith("The guard is not answering: it is stopped or restarting")
    open_tab(browser, "people")
    wait(browser).until(lambda d: by_css(d, "#people-error").text != "", "no message on the People tab")
    browser.execute_script("document.querySelector('#people-error').textContent = '';")
    by_css(browser, "#enrol-name").send_keys("visitor")
    browser.execute_script("document.querySelector('#enrol-photos').required = false;")  # no file: still sent
    by_css(browser, "#enrol-button").click()
    wait(browser).until(lambda d: by_css(d, "#people-error").text != "", "no message for an enrolment not sent")
    assert by_css(browser, "#people-error").text.startswith("The guard is not answering")


def test_a_live_view_refused_for_too_many_viewers_is_tried_again(start_guard, browser):
    """A live view refused (503: web.max_viewers watch already) said so and never tried again."""
    guard = start_guard(max_viewers=1)
    with _DIRECT.open(guard.url + "api/session", timeout=10) as answer:  # a viewer of its own: curl, another page
        cookie = answer.headers["Set-Cookie"].split(";")[0]
    other = _DIRECT.open(urllib.request.Request(guard.url + "live.mjpg", headers={"Cookie": cookie}), timeout=10)
    try:
        assert other.read(7) == b"--frame"
        browser.get(guard.url)
        wait(browser).until(lambda d: "trying again every 5 s" in by_css(d, "#live-error").text,
                            "the page did not say it tries the live view again")
        assert not image_loaded(browser, "#live-view")
    finally:
        other.close()  # the place is free: the page's next try takes it
    wait(browser).until(lambda d: image_loaded(d, "#live-view"), "the live view was not tried again")
    wait(browser).until(lambda d: by_css(d, "#live-error").text == "", "the live view's message stayed")
    guard.assert_running()


def best_labelled_page(driver) -> bytes:
    """For docs/web-live.png: of the page's screenshots over one cycle of the synthetic scene, the one
    with the most of the live view's known-person colour (tracker.web.live._KNOWN: boxes and name
    labels), i.e. the most people named, their labels apart. A picture for the README, not a check."""
    import cv2
    import numpy as np

    from tracker.sources.synthetic import CYCLE_S
    from tracker.web.live import _KNOWN

    best, best_score = driver.get_screenshot_as_png(), -1
    deadline = time.monotonic() + CYCLE_S
    while time.monotonic() < deadline:
        png = driver.get_screenshot_as_png()
        image = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
        score = int(np.count_nonzero(np.all(np.abs(image.astype(np.int16) - _KNOWN) < 30, axis=2)))
        if score > best_score:
            best, best_score = png, score
        time.sleep(0.3)
    return best


def requests_to(driver, path: str) -> int:
    return driver.execute_script(
        "return performance.getEntriesByType('resource').filter((e) => e.name.includes(arguments[0])).length;", path)


def state_requests(driver) -> int:
    return requests_to(driver, "/api/state")


def session_requests(driver) -> int:
    return requests_to(driver, "/api/session")


def test_a_page_without_a_password_that_loses_its_session_makes_a_new_one(start_guard, browser):
    """No password (the page answers this machine only): a session lost (the guard restarted, or
    its hours passed) is made anew, not answered with a login form no password can pass, and the
    tab that found it lost is opened again. And the
    Live tab opened again while open polls the guard's state once a second, not twice."""
    guard = start_guard()
    open_page(browser, guard)
    for _ in range(3):
        by_css(browser, '#tabs button[data-tab="live"]').click()
    open_tab(browser, "people")
    polled = state_requests(browser)
    time.sleep(2.5)  # a pause in which a poll left running would ask twice or more; the count is the check
    assert state_requests(browser) <= polled + 1
    # The tab whose request found the session gone is opened again with the new session (the first
    # click went to the Live tab instead, and the Events tab's left an uncaught error).
    browser.execute_script("window.uncaught = []; window.addEventListener('unhandledrejection', "
                           "(e) => window.uncaught.push(String(e.reason)));")
    browser.delete_all_cookies()
    by_css(browser, '#tabs button[data-tab="speed"]').click()  # its request now gets 401
    wait(browser).until(lambda d: "no benchmark has run" in by_css(d, "#speed-why").text,
                        "the Speed tab was not loaded with a new session")
    assert by_css(browser, "#speed").is_displayed() and not by_css(browser, "#live").is_displayed()
    assert not by_css(browser, "#login").is_displayed()
    # why auto has no profile, its command as code (the guard's message had it in backticks)
    auto_why = by_css(browser, "#auto-why")
    assert "`" not in auto_why.text and "tracker --benchmark --backend all" in [
        code.text for code in all_by_css(browser, "#auto-why code")], auto_why.text
    browser.delete_all_cookies()
    sessions = session_requests(browser)
    by_css(browser, '#tabs button[data-tab="events"]').click()
    wait(browser).until(lambda d: session_requests(d) > sessions, "no new session asked for")
    wait(browser).until(lambda d: by_css(d, "#events-error").text == "", "the Events tab was not loaded again")
    assert by_css(browser, "#events").is_displayed() and not by_css(browser, "#live").is_displayed()
    assert browser.execute_script("return window.uncaught;") == []
    open_tab(browser, "people")
    wait(browser).until(lambda d: all_by_css(d, "#people-list li.person"), "the new session lists nobody")
    guard.assert_running()


def test_events_tab_lists_an_event_with_its_snapshot(start_guard, browser):
    guard = start_guard()
    open_page(browser, guard)
    open_tab(browser, "events")
    reread = [time.monotonic()]

    def an_event_with_its_snapshot(driver):
        # Read in one script: the list is rebuilt whenever the tab is opened again.
        found = driver.execute_script("""
            for (const item of document.querySelectorAll('#event-list li.event')) {
              const img = item.querySelector('img');
              if (img && img.complete && img.naturalWidth > 0)
                return {src: img.src, kind: item.querySelector('strong').textContent, text: item.textContent};
            }
            return null;""")
        if found is None and time.monotonic() - reread[0] > 2.0:
            # The list is read when the tab opens: read it again until the demo has made an event.
            reread[0] = time.monotonic()
            open_tab(driver, "events")
        return found

    event = wait(browser, 60).until(an_event_with_its_snapshot, "no event with a loaded snapshot on the Events tab")
    assert event["src"].startswith(guard.url + "snapshots/"), event
    assert event["kind"] in ("entered", "identified", "left"), event
    assert "track " in event["text"], event
    assert by_css(browser, "#events-error").text == ""
    assert not by_css(browser, "#live").is_displayed()
    guard.assert_running()


def wait_for_an_event_with_a_snapshot(driver) -> None:
    """Until the Events tab lists an event with a snapshot (and so its "This was..." box), opening
    the tab again every 2 s: the list is read when the tab opens."""
    reread = [time.monotonic()]

    def listed(d):
        if all_by_css(d, "#event-list li.event form.this-was-form"):
            return True
        if time.monotonic() - reread[0] > 2.0:
            reread[0] = time.monotonic()
            open_tab(d, "events")
        return False

    open_tab(driver, "events")
    wait(driver, 60).until(listed, "no event with a snapshot on the Events tab")


def from_event_requests(driver) -> int:
    return requests_to(driver, "/from-event")


def test_this_was_checks_the_name_in_the_page_and_enter_sends_it(start_guard, browser):
    """An empty name was posted (to /api/people//from-event: "Not Found"), a bad one was refused as
    "the person in the URL", and Enter in the box did nothing."""
    from selenium.webdriver.common.keys import Keys

    guard = start_guard()
    open_page(browser, guard)
    wait_for_an_event_with_a_snapshot(browser)
    item = "#event-list li.event:has(form.this-was-form)"
    by_css(browser, f"{item} button.this-was").click()
    assert by_css(browser, f"{item} .this-was-message").text == "type who this was first"
    by_css(browser, f"{item} input.this-was-name").send_keys("a/b" + Keys.ENTER)
    assert by_css(browser, f"{item} .this-was-message").text.startswith('bad name "a/b"; expected a letter or digit')
    assert from_event_requests(browser) == 0
    by_css(browser, f"{item} input.this-was-name").clear()
    by_css(browser, f"{item} input.this-was-name").send_keys("visitor" + Keys.ENTER)
    wait(browser, ENROL_WAIT_S).until(lambda d: from_event_requests(d) == 1, "Enter in the name sent nothing")
    # Whether the snapshot shows a face or not, the guard's answer is shown, not the page's own check.
    wait(browser).until(lambda d: d.execute_script(
        "return document.querySelector(arguments[0]).textContent;", f"{item} .this-was-message")
        not in ("", "type who this was first"), "no answer shown")
    guard.assert_running()


def test_the_events_tab_fits_a_phones_width(start_guard, browser):
    """On a 375 px wide phone the Events tab scrolled sideways: its "This was..." box was cut off."""
    guard = start_guard()
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 375, "height": 667, "deviceScaleFactor": 2, "mobile": True})
    open_page(browser, guard)
    wait_for_an_event_with_a_snapshot(browser)
    assert browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth];") == [375, 375]
    guard.assert_running()


def test_people_tab_enrols_an_uploaded_photo(start_guard, browser, testdata, tmp_path):
    guard = start_guard()
    open_page(browser, guard)
    open_tab(browser, "people")
    # The demo enrols the scene's people itself (from chips the scene does not show).
    wait(browser).until(lambda d: len(all_by_css(d, "#people-list li.person")) >= 4, "the demo's people are not listed")
    assert not all_by_css(browser, '#people-list li.person[data-name="visitor"]')

    # A portrait with exactly one face (testdata README: skimage's astronaut, 512x512).
    by_css(browser, "#enrol-name").send_keys("visitor")
    by_css(browser, "#enrol-photos").send_keys(str(testdata / "faces" / "skimage" / "astronaut.png"))
    by_css(browser, "#enrol-button").click()
    wait(browser, ENROL_WAIT_S).until(lambda d: all_by_css(d, '#people-list li.person[data-name="visitor"]'),
                                      "visitor was not listed")
    wait(browser).until(lambda d: image_loaded(d, '#people-list li.person[data-name="visitor"] img'),
                        "visitor's face did not load")
    messages = by_css(browser, "#enrol-messages").text
    assert "enrolled visitor from 1 photo(s), 0 skipped" in messages, messages
    assert by_css(browser, "#people-error").text == ""
    assert (guard.state / "demo" / "people" / "visitor.npz").is_file()

    # Not an image: its own line in the messages, an error, and nobody enrolled.
    notes = tmp_path / "notes.txt"
    notes.write_text("this is not a photo\n", encoding="utf-8")
    by_css(browser, "#enrol-name").send_keys("visitor2")
    by_css(browser, "#enrol-photos").send_keys(str(notes))
    by_css(browser, "#enrol-button").click()
    wait(browser).until(lambda d: by_css(d, "#people-error").text != "", "no error for an upload that is not an image")
    assert "no photo to enrol" in by_css(browser, "#people-error").text
    messages = by_css(browser, "#enrol-messages").text
    assert "notes.txt: not a JPEG or PNG image" in messages, messages
    assert not all_by_css(browser, '#people-list li.person[data-name="visitor2"]')
    assert all_by_css(browser, '#people-list li.person[data-name="visitor"]')
    assert not (guard.state / "demo" / "people" / "visitor2.npz").exists()
    guard.assert_running()


def test_deleting_someone_deleted_already_takes_them_off_the_list(start_guard, browser):
    """A 404 (deleted meanwhile, from another page) left them listed, with its Delete button."""
    guard = start_guard()
    open_page(browser, guard)
    open_tab(browser, "people")
    name = wait(browser).until(lambda d: by_css(d, "#people-list li.person").get_attribute("data-name"), "nobody listed")
    # Deleted by another page meanwhile: the same request this page makes (its session and token).
    assert browser.execute_script("""return fetch('/api/people/' + arguments[0],
        {method: 'DELETE', headers: {'X-CSRF-Token': csrf}}).then((answer) => answer.status);""", name) == 200
    browser.execute_script("window.confirm = () => true;")
    by_css(browser, f'#people-list li.person[data-name="{name}"] button.forget').click()
    wait(browser).until(lambda d: not all_by_css(d, f'#people-list li.person[data-name="{name}"]'), f"{name} still listed")
    assert by_css(browser, "#people-error").text == f"nobody called {name!r} is enrolled"
    assert all_by_css(browser, "#people-list li.person"), "the others are not listed"
    guard.assert_running()


def test_login_with_a_password(start_guard, browser, tmp_path):
    password_file = tmp_path / "web-password"
    password_file.write_text(PASSWORD + "\n", encoding="utf-8")
    password_file.chmod(0o600)
    guard = start_guard(password_file=str(password_file))
    browser.get(guard.url)
    wait(browser).until(lambda d: by_css(d, "#login").is_displayed(), "no login form")
    assert not by_css(browser, "#tabs").is_displayed()
    assert not by_css(browser, "#live").is_displayed()
    assert by_css(browser, "#live-view").get_attribute("src") in (None, "")

    by_css(browser, "#password").send_keys("not the password")
    by_css(browser, "#login-button").click()
    wait(browser).until(lambda d: by_css(d, "#login-error").text != "", "no error for a wrong password")
    assert by_css(browser, "#login").is_displayed()
    assert not by_css(browser, "#tabs").is_displayed()

    by_css(browser, "#password").clear()
    by_css(browser, "#password").send_keys(PASSWORD)
    by_css(browser, "#login-button").click()
    wait(browser).until(lambda d: by_css(d, "#tabs").is_displayed() and by_css(d, "#live").is_displayed(),
                        "the tabs did not appear after the right password")
    wait(browser).until(lambda d: image_loaded(d, "#live-view"), "no live picture after logging in")
    assert not by_css(browser, "#login").is_displayed()
    assert by_css(browser, "#logout").is_displayed()
    wait(browser).until(lambda d: (number(by_css(d, "#fps").text) or 0) > 0, "no frame rate after logging in")
    guard.assert_running()


# The columns of a `tracker --benchmark --backend all` run here (tracker --list-backends, int8 where a backend has it).
ALL_BACKENDS = ["auto", "auto int8", "caffe-openblas", "caffe-openblas-dl", "tf-vanilla", "tf-neon-vfpv4",
                "tf-neon-vfpv4 int8", "mxnet-openblas", "mxnet-openblas-dl", "nnpack", "onnxruntime",
                "onnxruntime int8", "opencv-dnn"]


def record_a_benchmark_of_every_backend(benchmark_dir: Path, out: Path) -> None:
    """A run's results.json with every backend's column and its two plots (the benchmark's 1000 x 550
    px), recorded as this device's last run in `benchmark_dir` (where the Speed tab looks)."""
    import cv2
    import numpy as np

    from tracker.bench.profile import record_last_run
    from tracker.bench.report import PLOT_FILES

    out.mkdir()
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    doc = {"complete": True, "machine": {"cpu": "Cortex-A53", "cores": 4, "arch": "aarch64"},
           "settings": {"batches": batches, "columns": [{"label": label} for label in ALL_BACKENDS]},
           "rows": [{"label": label, "batch": batch, "status": "ok", "ms_per_image": 12.3456, "median_ms_per_image": 12.3456}
                    for label in ALL_BACKENDS for batch in batches]}
    (out / "results.json").write_text(json.dumps(doc), encoding="utf-8")
    for name in PLOT_FILES.values():
        cv2.imwrite(str(out / name), np.full((550, 1000, 3), 255, np.uint8))
    record_last_run(benchmark_dir, out)


def test_the_speed_tab_fits_a_phones_width(start_guard, browser, tmp_path):
    """A run of every backend (13 columns) made the whole page 1343 px wide on a 390 px phone (wider
    than a 1280 px window too): the header and tabs covered a third of it and the phone zoomed out
    to fit. The tables scroll within the page's width instead."""
    guard = start_guard()
    record_a_benchmark_of_every_backend(guard.state, tmp_path / "bench-out")  # the demo's benchmarks: beside its state
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True})
    open_page(browser, guard)
    open_tab(browser, "speed")
    wait(browser).until(lambda d: len(all_by_css(d, "#speed-tables table")) == 2, "no speed tables")
    wait(browser).until(lambda d: image_loaded(d, "#speed-plots img"), "no plot")
    assert len(all_by_css(browser, "#speed-tables table.speed-mean thead th")) == 1 + len(ALL_BACKENDS)
    assert browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth];") == [390, 390]
    guard.assert_running()


def test_a_long_name_fits_a_phones_width(start_guard, browser, testdata):
    """A name of 64 letters without a space (the enrolment rules allow it) made the People tab 753
    px wide on a 390 px phone, its Delete button off the screen, and the Events tab's person filter
    504 px."""
    guard = start_guard()
    name = "Maria_Fernanda_Gonzalez_Rodriguez_de_la_Santisima_Trinidad_Lopez"[:64]
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True})
    open_page(browser, guard)
    open_tab(browser, "people")
    by_css(browser, "#enrol-name").send_keys(name)
    by_css(browser, "#enrol-photos").send_keys(str(testdata / "faces" / "skimage" / "astronaut.png"))
    by_css(browser, "#enrol-button").click()
    wait(browser, ENROL_WAIT_S).until(lambda d: all_by_css(d, f'#people-list li.person[data-name="{name}"]'),
                                      f"{name} was not listed")
    width = "return [document.documentElement.scrollWidth, window.innerWidth];"
    assert browser.execute_script(width) == [390, 390]
    open_tab(browser, "events")
    wait(browser).until(lambda d: all_by_css(d, f'#event-filter option[value="{name}"]'), f"{name} is not in the filter")
    assert browser.execute_script(width) == [390, 390]
    guard.assert_running()
