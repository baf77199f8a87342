"""The web page's parts one by one: sessions, CSRF and login limits (auth.py), pages of the event
log (event_log.py), photo checks (uploads.py), the live view's frames (live.py) and the guard's
job queue (jobs.py). The page served by a running guard is tested in test_web_http.py and, in a
real browser, in test_web_browser.py."""

from __future__ import annotations

import json
import struct
import threading
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_images import many_scans_jpeg

from tracker.config import parse_config
from tracker.errors import ConfigError, InputError
from tracker.files import generations
from tracker.images import MAX_JPEG_SCANS
from tracker.passwords import web_password
from tracker.sinks.jsonl import JsonlSink
from tracker.types import Box, Event
from tracker.web import auth, event_log
from tracker.web.jobs import MAX_PENDING, Busy, GuardJobs
from tracker.web.live import LiveFeed, TrackMark, render
from tracker.web.uploads import MAX_PIXELS, check_image, safe_filename

FACES = Path(__file__).resolve().parents[2].parent / "shared" / "testdata" / "faces"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


# ---- auth ----------------------------------------------------------------------------------


def test_sessions_expire_and_are_bounded():
    clock = Clock()
    sessions = auth.Sessions(lifetime_s=60, clock=clock)
    first = sessions.create()
    assert sessions.get(first.token) == first and sessions.get("forged") is None and sessions.get(None) is None
    clock.now += 59.9
    assert sessions.get(first.token) == first
    clock.now += 0.1
    assert sessions.get(first.token) is None  # expired, and dropped
    made = [sessions.create() for _ in range(auth.MAX_SESSIONS + 5)]
    assert sessions.get(made[0].token) is None and sessions.get(made[-1].token) == made[-1]
    sessions.drop(made[-1].token)
    assert sessions.get(made[-1].token) is None


def test_a_session_in_use_outlives_a_flood_of_new_ones():
    """Without a password each request without a cookie makes a session: the page's own, used
    between them, is not the one dropped."""
    sessions = auth.Sessions(lifetime_s=60)
    page, idle = sessions.create(), sessions.create()
    for _ in range(3):
        for _ in range(auth.MAX_SESSIONS - 2):
            sessions.create()
        assert sessions.get(page.token) == page
    assert sessions.get(idle.token) is None


def test_csrf_and_password_checks():
    session = auth.Sessions(60).create()
    assert auth.csrf_ok(session, session.csrf)
    assert not auth.csrf_ok(session, None) and not auth.csrf_ok(session, session.csrf + "x")
    assert auth.password_ok("s3cret", "s3cret") and not auth.password_ok("s3cret", "s3cret ")


def test_login_limiter_refuses_after_five_failures_until_the_window_passes():
    clock = Clock()
    limiter = auth.LoginLimiter(clock)
    for _ in range(auth.FAILURES_ALLOWED):
        assert limiter.retry_after("10.0.0.2") is None
        limiter.failed("10.0.0.2")
        clock.now += 1
    wait = limiter.retry_after("10.0.0.2")
    assert wait == pytest.approx(auth.WINDOW_S - auth.FAILURES_ALLOWED)
    assert limiter.retry_after("10.0.0.3") is None  # per address
    clock.now += wait
    assert limiter.retry_after("10.0.0.2") is None  # the oldest failure left the window
    limiter.failed("10.0.0.2")
    limiter.succeeded("10.0.0.2")
    assert limiter.retry_after("10.0.0.2") is None


def test_the_login_limit_cannot_be_dodged_by_more_addresses_than_it_remembers():
    """Wrong passwords from MAX_CLIENTS + 1 addresses in turn: each address was forgotten before
    its fifth failure, so none was ever refused. Only an address whose failures have all left the
    window is forgotten; while every remembered one is live, a new address waits its turn."""
    clock = Clock()
    limiter = auth.LoginLimiter(clock)
    addresses = [f"10.0.{i // 256}.{i % 256}" for i in range(auth.MAX_CLIENTS + 1)]
    refused = 0
    for _ in range(auth.FAILURES_ALLOWED):
        for address in addresses:
            if limiter.retry_after(address) is None:
                limiter.failed(address)
            else:
                refused += 1
    assert refused > 0 and all(limiter.retry_after(a) is not None for a in addresses)
    newcomer = "10.9.9.9"
    assert limiter.retry_after(newcomer) == pytest.approx(auth.WINDOW_S)  # the table is full of live addresses
    clock.now += auth.WINDOW_S
    assert limiter.retry_after(newcomer) is None  # their failures left the window: they are forgotten
    limiter.failed(newcomer)


def test_the_login_limit_reads_its_clock_once_a_check():
    """An address whose last failure turned a minute old between two readings of the clock was
    forgotten at the first and emptied at the second: an IndexError, a 500 at the login."""
    now = [0.0]

    def ticking() -> float:  # a millisecond passes at every reading
        now[0] += 0.001
        return now[0]

    limiter = auth.LoginLimiter(ticking)
    limiter.failed("10.0.0.2")  # at 0.001
    now[0] = auth.WINDOW_S - 0.0005  # the next reading is just within the window, the one after past it
    assert limiter.retry_after("10.0.0.2") is None


def test_a_page_beyond_loopback_needs_a_password(tmp_path, monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    assert web_password(parse_config({"web": {"listen": "127.0.0.1:8080"}}).web) is None
    assert web_password(parse_config({"web": {"listen": "[::1]:8080"}}).web) is None
    with pytest.raises(ConfigError, match=r"'web.listen': '0.0.0.0:8080' serves the page beyond this machine"):
        web_password(parse_config({"web": {"listen": "0.0.0.0:8080"}}).web)
    secret = tmp_path / "web-password"
    secret.write_text("hunter22\n")
    secret.chmod(0o600)
    config = parse_config({"web": {"listen": "0.0.0.0:8080", "password_file": str(secret)}})
    assert web_password(config.web) == "hunter22"
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))  # systemd's LoadCredential=web-password
    assert web_password(parse_config({"web": {"listen": "192.168.1.5:80"}}).web) == "hunter22"


@pytest.mark.parametrize("listen", ["8080", "localhost", ":8080", "host:0", "host:70000", "a b:80", "[::1:80",
                                    "a" * 64 + ":80", "x..y:80"])  # a label over 63 characters, an empty one
def test_bad_listen_addresses_are_config_errors(listen):
    with pytest.raises(ConfigError, match=r"key 'web.listen': bad value .* expected host:port"):
        parse_config({"web": {"listen": listen}})


# ---- the event log -------------------------------------------------------------------------


def write_log(path: Path, events: int, torn_tail: bool = False) -> list[dict]:
    rows = [{"id": f"{i:032x}", "kind": "entered", "track_id": i, "identity": "alice" if i % 3 == 0 else "unknown"}
            for i in range(events)]
    with open(path, "w", encoding="utf-8") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps(row) + "\n")
            if i == 5:
                f.write("x" * (event_log.MAX_LINE * 3) + "\n")  # a garbage line longer than any event
                f.write("not json\n")
        if torn_tail:
            f.write('{"id": "half a line')
    return rows


def test_pages_newest_first_cover_the_log_once(tmp_path):
    path = tmp_path / "events.jsonl"
    rows = write_log(path, 500, torn_tail=True)
    seen, before = [], None
    while True:
        page, before = event_log.read_page(path, before=before, limit=37)
        seen += page
        assert len(page) <= 37
        if before is None:
            break
    assert [e["track_id"] for e in seen] == [r["track_id"] for r in reversed(rows)]


def test_a_filter_pages_by_identity_and_a_scan_limit_returns_where_to_go_on(tmp_path):
    path = tmp_path / "events.jsonl"
    rows = write_log(path, 300)
    alice = [r["track_id"] for r in reversed(rows) if r["identity"] == "alice"]
    found, before, pages = [], None, 0
    while True:
        page, before = event_log.read_page(path, before=before, limit=20, identity="alice", max_scan=4096)
        found += [e["track_id"] for e in page]
        pages += 1
        assert pages < 1000, "no progress"
        if before is None:
            break
    assert found == alice and pages > len(alice) // 20  # short pages: each scanned at most 4 kB


def test_a_missing_log_is_an_empty_page(tmp_path):
    assert event_log.read_page(tmp_path / "none.jsonl") == ([], None)


def guard_event(seq: int) -> Event:
    return Event(f"{seq:032x}", "entered", seq, "unknown", 0.0, Box(1.0, 2.0, 30.0, 40.0), seq, 1_767_225_600.0 + seq,
                 None, seq=seq)


def read_all(path: Path, backups: int, limit: int) -> list[int]:
    seen, before = [], None
    while True:
        page, before = event_log.read_page(path, backups=backups, before=before, limit=limit)
        seen += [e["seq"] for e in page]
        if before is None:
            return seen


def kept(path: Path, backups: int) -> list[int]:
    """The events in the log's files, oldest first, read whole."""
    return [json.loads(line)["seq"] for name in reversed(generations(path, backups)) if name.exists()
            for line in name.read_text().splitlines()]


def test_pages_go_on_through_the_rotated_logs_and_survive_a_rotation_between_them(tmp_path):
    path = tmp_path / "events.jsonl"
    sink, seq = JsonlSink(path, max_bytes=10_000, backups=2), 0
    while not path.with_name("events.jsonl.2").exists():
        sink.publish_event(guard_event(seq), None)
        seq += 1
    before_rotation = kept(path, 2)
    assert before_rotation[-1] == seq - 1
    for limit in (1, 7, 300):  # 1: pages that end at the start of a file too
        assert read_all(path, 2, limit) == before_rotation[::-1]
    assert read_all(path, 0, limit=7) == kept(path, 0)[::-1]  # backups 0: the current file alone

    oldest = json.loads(path.with_name("events.jsonl.2").read_text().splitlines()[-1])["seq"]
    page, cursor = event_log.read_page(path, backups=2, limit=5)  # then the guard rotates the files
    newest = path.stat().st_ino
    while path.stat().st_ino == newest:
        sink.publish_event(guard_event(seq), None)
        seq += 1
    seen = [e["seq"] for e in page]
    while cursor is not None:
        page, cursor = event_log.read_page(path, backups=2, before=cursor, limit=5)
        seen += [e["seq"] for e in page]
    assert seen == [s for s in before_rotation[::-1] if s > oldest]  # the oldest file went: the end

    page, cursor = event_log.read_page(path, backups=2, limit=300)
    assert cursor is None and [e["seq"] for e in page] == kept(path, 2)[::-1]
    oldest, gone = path.with_name("events.jsonl.2").stat().st_ino, None
    while gone is None or int(gone.split(":")[0]) != oldest:  # a cursor into the oldest file ...
        gone = event_log.read_page(path, backups=2, before=gone, limit=1)[1]
    assert event_log.read_page(path, backups=2, before=gone, limit=1)[0]
    for _ in range(3):  # ... which two rotations remove
        newest = path.stat().st_ino
        while path.stat().st_ino == newest:
            sink.publish_event(guard_event(seq), None)
            seq += 1
    sink.close()
    assert event_log.read_page(path, backups=2, before=gone) == ([], None)


@pytest.mark.parametrize("limit, max_scan", [(3, 4 << 20), (100, 1)])  # the next page starts at the older file's end
def test_pages_go_on_into_a_rotated_log_that_ends_in_a_torn_line(tmp_path, limit, max_scan):
    """A crash mid-line, then a rotation: the older file ends without a newline, and the cursor of
    its end was refused (not the start of a line), so its events could not be reached."""
    path = tmp_path / "events.jsonl"
    rows = write_log(path.with_name("events.jsonl.1"), 5, torn_tail=True) + write_log(path, 3)
    seen, before = [], None
    while True:
        page, before = event_log.read_page(path, backups=1, before=before, limit=limit, max_scan=max_scan)
        seen += [e["track_id"] for e in page]
        if before is None:
            break
    assert seen == [r["track_id"] for r in reversed(rows)]


def test_a_file_opened_twice_in_a_rotation_is_read_once(tmp_path, monkeypatch):
    """The guard rotates between the page's opening of `path` and of `path.1`: both names then open
    the same file (the one `path` was); its events are listed once."""
    path = tmp_path / "events.jsonl"
    rows = write_log(path, 30)
    monkeypatch.setattr(event_log, "generations", lambda p, backups: [p, p])
    page, cursor = event_log.read_page(path, backups=1, limit=100)
    assert [e["track_id"] for e in page] == [r["track_id"] for r in reversed(rows)] and cursor is None


@pytest.mark.parametrize("cursor", ["12", "1:2", "-5:3:4", "5:6:", ":5:6", "a:b:c", "1:2:3:4"])
def test_a_cursor_not_made_by_a_page_is_refused(cursor):
    with pytest.raises(ValueError, match="not <inode>:<mark>:<offset>"):
        event_log.parse_cursor(cursor)


def test_a_cursor_is_only_good_for_the_file_it_was_made_from(tmp_path):
    """ext4 gives a new events log the inode of the one the rotation removed: its cursor then
    names the new file's inode. Its mark (the first line) tells them apart; so does an offset that
    is not the start of a line."""
    path = tmp_path / "events.jsonl"
    write_log(path, 30)
    page, cursor = event_log.read_page(path, limit=5)
    inode, mark, offset = event_log.parse_cursor(cursor)
    assert event_log.read_page(path, before=cursor, limit=5)[0]
    assert event_log.read_page(path, before=f"{inode}:{mark}:{offset - 3}") == ([], None)
    with open(path, "r+", encoding="utf-8") as f:  # the same inode, another file's lines
        f.write(json.dumps({"id": "f" * 32, "kind": "entered", "track_id": 99, "identity": "unknown"}) + "\n")
    assert path.stat().st_ino == inode
    assert event_log.read_page(path, before=cursor) == ([], None)


def test_the_speed_tab_says_what_is_wrong_with_a_damaged_record(tmp_path):
    """A damaged record is said to be damaged (it read as no run at all); a NaN cell (no JSON) and
    plots that were not written are left out; a results file of the wrong shape or nested past
    Python's recursion cannot be read (it was a 500), and a plot over MAX_PLOT_BYTES is not served."""
    from tracker.bench.profile import last_run_path, record_last_run
    from tracker.web.speed import MAX_PLOT_BYTES, MAX_RESULTS_BYTES, speed_plot, speed_summary

    state, out = tmp_path / "state", tmp_path / "out"
    state.mkdir()
    assert speed_summary(state)["why"].startswith("no benchmark has run on this device yet")
    last_run_path(state).write_text("{not json")
    assert "is damaged; run the benchmark again" in speed_summary(state)["why"]
    out.mkdir()
    record_last_run(state, out)
    doc = {"complete": True, "machine": {"cpu": "x", "cores": 2}, "settings": {"batches": [1, 2], "columns": [{"label": "a"}]},
           "rows": [{"label": "a", "batch": 1, "status": "ok", "ms_per_image": 1.5, "median_ms_per_image": float("nan")},
                    {"label": "a", "batch": 2, "status": "ok", "ms_per_image": 1.0, "median_ms_per_image": 0.9}]}
    (out / "results.json").write_text(json.dumps(doc))
    (out / "per_image_ms_log.png").write_bytes(b"\x89PNG")
    run = speed_summary(state)["benchmark"]
    json.dumps(run, allow_nan=False)
    assert run["mean"] == {"a": {"1": 1.5, "2": 1.0}} and run["median"] == {"a": {"2": 0.9}}
    assert run["plots"] == {"log": "/speed/log.png"}
    doc["settings"]["batches"] = None
    (out / "results.json").write_text(json.dumps(doc))
    assert speed_summary(state)["benchmark"] is None and "cannot be read; run it again" in speed_summary(state)["why"]
    (out / "results.json").write_text("[" * 100_000 + "]" * 100_000)  # deeper than Python's recursion limit
    assert speed_summary(state)["benchmark"] is None and "cannot be read; run it again" in speed_summary(state)["why"]
    with open(out / "results.json", "ab") as results:  # a run of many --passes: not damaged, too large
        results.truncate(MAX_RESULTS_BYTES + 1)
    assert speed_summary(state)["benchmark"] is None and "over 8 MB" in speed_summary(state)["why"]
    assert speed_plot(state, "log") == b"\x89PNG"
    with open(out / "per_image_ms_log.png", "ab") as plot:
        plot.truncate(MAX_PLOT_BYTES + 1)
    assert speed_plot(state, "log") is None


def test_the_speed_tab_names_no_path_on_the_guard(tmp_path):
    """The page was told the profile's and the benchmark's paths ("no calibration profile at
    /.../profile.json", "out": "/.../bench"), which its visitors have no use for."""
    from tracker.bench.profile import last_run_path, record_last_run
    from tracker.web.speed import speed_summary

    state, out = tmp_path / "state", tmp_path / "out"
    state.mkdir()
    out.mkdir()
    answers = [speed_summary(state)]
    assert answers[0]["auto"]["why"].startswith("this device's calibration profile does not exist (run `tracker")
    (state / "profile.json").write_text("{not json")
    last_run_path(state).write_text("{not json")
    answers.append(speed_summary(state))
    assert answers[-1]["auto"]["why"].startswith("this device's calibration profile is unreadable")
    record_last_run(state, out)
    answers.append(speed_summary(state))  # no results.json
    doc = {"complete": True, "machine": {"cpu": "x", "cores": 2}, "settings": {"batches": [1], "columns": [{"label": "a"}]},
           "rows": [{"label": "a", "batch": 1, "status": "ok", "ms_per_image": 1.5, "median_ms_per_image": 1.5}]}
    (out / "results.json").write_text(json.dumps(doc))
    answers.append(speed_summary(state))
    assert answers[-1]["benchmark"]["mean"] == {"a": {"1": 1.5}}
    for answer in answers:
        assert str(tmp_path) not in json.dumps(answer), answer


def test_text_that_is_no_utf_8_is_a_wrong_token_or_password_not_an_error():
    session = auth.Sessions(60).create()
    assert not auth.csrf_ok(session, "\ud800") and not auth.password_ok("secret", "\ud800x")


# ---- uploads -------------------------------------------------------------------------------


def png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))


def test_real_photos_pass_with_their_size():
    astronaut = (FACES / "skimage" / "astronaut.png").read_bytes()
    assert check_image(astronaut, "astronaut.png") == ("png", 512, 512)
    jpeg = (FACES / "dlib" / "faces" / "dogs.jpg").read_bytes()
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert check_image(jpeg, "dogs.jpg") == ("jpeg", image.shape[1], image.shape[0])


def test_a_decompression_bomb_is_refused_before_decoding():
    with pytest.raises(InputError, match=r"bomb.png: 100000x100000 pixels is too large; expected at most 24 megapixels"):
        check_image(png_header(100_000, 100_000), "bomb.png")
    assert check_image(png_header(6000, 4000), "24mp.png") == ("png", 6000, 4000) and MAX_PIXELS == 6000 * 4000
    with pytest.raises(InputError, match=r"6001x4000 pixels is too large"):
        check_image(png_header(6001, 4000), "more.png")
    jpeg_bomb = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" \
                b"\xff\xc0\x00\x11\x08\xff\xff\xff\xff\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    with pytest.raises(InputError, match=r"65535x65535 pixels is too large"):
        check_image(jpeg_bomb, "bomb.jpg")


def test_a_jpeg_of_too_many_scans_is_refused_in_one_line():
    """Each scan of a progressive JPEG is a pass over the whole image: 10,000 of them in a 514 kB
    upload took the guard's thread 31 s to decode for enrolment."""
    with pytest.raises(InputError, match=rf"^bomb.jpg: a JPEG of more than {MAX_JPEG_SCANS} scans \(each decoded over "
                                         r"the whole image\); expected a photo \(a camera's has about 10\)$"):
        check_image(many_scans_jpeg(MAX_JPEG_SCANS + 1), "bomb.jpg")
    assert check_image(many_scans_jpeg(10), "photo.jpg") == ("jpeg", 64, 64)


@pytest.mark.parametrize("data, message", [
    (b"GIF89a....", "not a JPEG or PNG image"),
    (b"#!/bin/sh\nrm -rf /\n", "not a JPEG or PNG image"),
    (b"\x89PNG\r\n\x1a\n\x00", "a damaged PNG"),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", "a damaged JPEG"),
    (b"", "not a JPEG or PNG image"),
])
def test_non_images_and_damaged_images_are_refused(data, message):
    with pytest.raises(InputError, match=f"^upload.bin: {message}"):
        check_image(data, "upload.bin")


def test_upload_file_names_cannot_leave_their_folder():
    assert safe_filename("../../etc/passwd", 1) == "01-passwd"
    assert safe_filename("..\\..\\boot.ini", 2) == "02-boot.ini"
    assert safe_filename("my photo (1).JPG", 3) == "03-my_photo_1_.JPG"
    assert safe_filename("...", 4) == "04-photo"


# ---- live ----------------------------------------------------------------------------------


def test_the_feed_hands_over_frames_only_while_watched_and_at_its_rate():
    feed = LiveFeed(fps=5, width=320, max_viewers=2)
    image = np.full((480, 640, 3), 90, np.uint8)
    assert not feed.wants_frame(0) and feed.jpeg() is None
    assert feed.join() and feed.join() and not feed.join()  # max_viewers
    assert feed.wants_frame(0)
    feed.offer(image, (), 0)
    assert not feed.wants_frame(100_000_000) and feed.wants_frame(200_000_000)  # 1/5 s
    seq, jpeg = feed.jpeg()
    assert seq == 1 and feed.jpeg() == (seq, jpeg)  # encoded once per frame
    decoded = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == (240, 320, 3)  # scaled to the stream's width
    feed.leave()
    feed.leave()
    assert not feed.wants_frame(10**12) and feed.jpeg() is None  # unwatched: no frame held


def test_render_draws_each_track_with_its_label():
    image = np.full((240, 320, 3), 90, np.uint8)
    plain = cv2.imdecode(np.frombuffer(render(image, (), 320), np.uint8), cv2.IMREAD_COLOR)
    marks = (TrackMark(7, Box(40, 60, 80, 100), "alice", 0.93, True), TrackMark(8, Box(200, 60, 60, 80), "unknown", 0.0, False))
    drawn = cv2.imdecode(np.frombuffer(render(image, marks, 320), np.uint8), cv2.IMREAD_COLOR)
    changed = np.abs(drawn.astype(int) - plain.astype(int)).max(axis=2) > 40
    assert changed[60:160, 40].any() and changed[60:140, 200].any()  # both boxes' left edges
    assert not changed[200:, :30].any()  # nothing drawn where no track is
    assert np.array_equal(image, np.full((240, 320, 3), 90, np.uint8))  # the guard's frame is untouched


# ---- jobs ----------------------------------------------------------------------------------


def test_jobs_run_one_per_turn_on_the_thread_that_asks_bounded_and_cancelled_when_it_stops():
    jobs = GuardJobs()
    done = jobs.submit(lambda detector, backend: (detector, backend, threading.current_thread().name))
    dropped = jobs.submit(lambda detector, backend: pytest.fail("a cancelled job ran"))
    failing = jobs.submit(lambda detector, backend: (_ for _ in ()).throw(InputError("no face")))
    assert dropped.cancel()
    guard = threading.Thread(target=lambda: [jobs.run_next("det", "net") for _ in range(2)], name="guard")
    guard.start()
    guard.join()
    assert done.result() == ("det", "net", "guard")  # run by the guard's thread, with its stages
    with pytest.raises(InputError, match="no face"):
        failing.result()
    assert not jobs.run_next("det", "net")  # nothing left: the cancelled one was skipped
    waiting = [jobs.submit(lambda d, b: None) for _ in range(MAX_PENDING)]
    with pytest.raises(Busy):
        jobs.submit(lambda d, b: None)
    jobs.cancel_all()
    assert all(f.cancelled() for f in waiting) and not jobs.run_next("det", "net")
