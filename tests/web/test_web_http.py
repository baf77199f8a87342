"""The web page served by a real running guard (the synthetic scene at its own pace, the shipped
weights, YuNet), spoken to over HTTP: what it serves, and every bad input of issue 14 -- a photo
that is not an image, is huge or has no or several faces, a name with path tricks, a wrong password
(rate-limited), a snapshot outside the snapshot folder, a viewer that goes away mid-stream, ten
viewers at once, a request without the CSRF token, from another site or by another host name,
bodies that are not JSON, chunked, stalled and too many uploads, connections that never finish a
request and one too many -- each answered with a 4xx or 503 and one line while the guard keeps
processing frames."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import logging
import secrets
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from http.cookies import SimpleCookie
from pathlib import Path

import cv2
import numpy as np
import pytest
from mosquitto import free_port

from tracker.cli import main
from tracker.config import parse_config
from tracker.pipeline import Guard
from tracker.stages import build_stages
from tracker.web import auth
from tracker.web.server import WebServer

FACES = Path(__file__).resolve().parents[2].parent / "shared" / "testdata" / "faces"
ASTRONAUT = FACES / "skimage" / "astronaut.png"  # one face
CROWD = FACES / "dlib" / "faces" / "bald_guys.jpg"  # many faces
MAX_VIEWERS = 3


def no_face_png() -> bytes:
    """A photo of a grey wall: no face in it."""
    ok, png = cv2.imencode(".png", np.full((300, 400, 3), 128, np.uint8))
    return png.tobytes()


class Client:
    """HTTP/1.1 to the page with its session cookie and CSRF token, as the page's script sends them."""

    def __init__(self, port: int):
        self.port, self.cookie, self.csrf = port, None, None

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                csrf: bool = True) -> tuple[int, dict, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)  # emulated aarch64 is slow
        sent = dict(headers or {})
        if self.cookie:
            sent["Cookie"] = f"{auth.COOKIE}={self.cookie}"
        if csrf and self.csrf and method != "GET":
            sent.setdefault(auth.CSRF_HEADER, self.csrf)
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        data = response.read()
        for name, value in response.getheaders():
            if name.lower() == "set-cookie" and value.startswith(auth.COOKIE + "="):
                self.cookie = value.split(";")[0].split("=", 1)[1] or None
        connection.close()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    def json(self, method: str, path: str, payload=None, headers: dict | None = None, csrf: bool = True) -> tuple[int, dict]:
        body = None if payload is None else json.dumps(payload).encode()
        sent = {**({"Content-Type": "application/json"} if body else {}), **(headers or {})}
        status, _, data = self.request(method, path, body, sent, csrf=csrf)
        return status, json.loads(data) if data else {}

    def open_session(self) -> None:
        status, session = self.json("GET", "/api/session")
        assert status == 200 and session["logged_in"]
        self.csrf = session["csrf"]

    def upload(self, name: str, files: list[tuple[str, bytes]]) -> tuple[int, dict]:
        boundary = secrets.token_hex(8)
        parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\n{name}\r\n'.encode()]
        for filename, data in files:
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="photos"; filename="{filename}"\r\n'
                         f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        status, _, data = self.request("POST", "/api/people", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
        return status, json.loads(data)


def start_guard(state_dir: Path, web: dict) -> tuple[Guard, threading.Thread]:
    config = parse_config({
        "state_dir": str(state_dir),
        "source": {"kind": "synthetic"},  # paced at 10 fps like a camera, until stopped
        "sinks": {"console": False},
        "web": {"max_viewers": MAX_VIEWERS, "max_upload_mb": 2.0, **web},
    })
    guard = Guard(config, build_stages(config))
    assert guard.stages.web is not None, "the page did not start"
    thread = threading.Thread(target=guard.run, daemon=True)
    thread.start()
    return guard, thread


@contextlib.contextmanager
def page_alone(state_dir: Path) -> Iterator[int]:
    """A page of its own on a free loopback port, no password and no guard behind it (no job runs),
    closed on leaving; yields its port."""
    port = free_port()
    config = parse_config({"state_dir": str(state_dir), "web": {"listen": f"127.0.0.1:{port}"}})
    server = WebServer(config, state_dir, state_dir / "events.jsonl", password=None)
    assert server.start()
    try:
        yield port
    finally:
        server.close()


def wait_for(condition, what: str, timeout_s: float = 180.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A guard with its page on a free loopback port, no password."""
    port = free_port()
    guard, thread = start_guard(tmp_path_factory.mktemp("state"), {"listen": f"127.0.0.1:{port}"})
    yield guard, port
    guard.stop()
    thread.join(30)
    assert not thread.is_alive()


@pytest.fixture
def client(page):
    guard, port = page
    c = Client(port)
    c.open_session()
    return c


def frames_go_on(guard: Guard) -> None:
    """The guard keeps processing: 10 more frames (1 s of the scene) within the wait."""
    start = guard.frames_processed
    wait_for(lambda: guard.frames_processed >= start + 10, "the guard to process frames")


# ---- the page ------------------------------------------------------------------------------


def test_the_page_and_its_files_come_with_security_headers(client, page):
    """Every answer carries the page's headers: CSP, framing, no MIME sniffing, no referrer, not
    stored; the session cookie is for HTTP only (no script reads it) and this site's own requests."""
    from tracker.web import server

    expected = {"content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                                           "base-uri 'none'; form-action 'self'",
                "x-frame-options": "DENY", "x-content-type-options": "nosniff", "referrer-policy": "no-referrer",
                "cache-control": "no-store"}
    assert {k.lower(): v for k, v in server._HEADERS.items()} == expected  # a header added is checked here too
    status, headers, body = client.request("GET", "/")
    assert status == 200 and b'id="live-view"' in body and headers["content-type"].startswith("text/html")
    assert {k: headers.get(k) for k in expected} == expected
    status, headers, _ = client.request("GET", "/static/app.js")
    assert status == 200 and {k: headers.get(k) for k in expected} == expected
    status, headers, body = client.request("GET", "/static/..%2F..%2Fconfig.py")
    assert status == 404 and json.loads(body)["error"].startswith("no static file")
    assert {k: headers.get(k) for k in expected} == expected
    _, headers, _ = Client(page[1]).request("GET", "/api/session")  # a new session: its cookie is set
    cookie = SimpleCookie(headers["set-cookie"])[auth.COOKIE]
    assert cookie["httponly"] is True and cookie["samesite"] == "Strict" and cookie["path"] == "/"


def test_another_host_name_is_refused(client):
    """A site that rebinds its own name to 127.0.0.1 cannot read a loopback page; this machine's
    own name is not case-sensitive (LOCALHOST was refused)."""
    status, _, body = client.request("GET", "/api/state", headers={"Host": f"evil.example:{client.port}"})
    assert status == 421 and "is not this page's" in json.loads(body)["error"]
    assert client.request("GET", "/api/session", headers={"Host": f"LocalHost:{client.port}"})[0] == 200


@pytest.mark.parametrize("header", ["X-Forwarded-For", "Forwarded", "X-Real-IP"])
def test_a_page_without_a_password_does_not_answer_through_a_proxy(client, header):
    status, _, body = client.request("GET", "/api/state", headers={header: "192.168.1.20"})
    assert status == 403 and "not through a proxy; set web.password_file" in json.loads(body)["error"]


def test_another_sites_requests_make_no_session(page):
    """Another site's page can make the browser ask for /api/session (an <img>, no cookie): each
    would be a session, and 64 of them pushed out the user's. A browser names the request's site;
    the page's own fetch is same-origin, an address typed in is "none"."""
    _, port = page
    for site, made in (("cross-site", False), ("same-site", False), ("same-origin", True), ("none", True)):
        client = Client(port)
        status, headers, body = client.request("GET", "/api/session", headers={"Sec-Fetch-Site": site})
        assert status == 200 and json.loads(body)["logged_in"] is made and ("set-cookie" in headers) is made, site


def test_without_a_session_nothing_but_the_page_answers(page):
    """Without a password there is no login: the answer said "log in" all the same."""
    guard, port = page
    anonymous = Client(port)
    assert anonymous.json("GET", "/api/state") == (401, {
        "error": "no session cookie; this page has no password: open the page, or GET /api/session for the cookie "
                 "(and the CSRF token changes need)"})
    assert anonymous.request("GET", "/live.mjpg")[0] == 401


def test_changes_need_the_csrf_token_and_the_pages_origin(client):
    status, answer = client.json("DELETE", "/api/people/alice", csrf=False)
    assert status == 403 and answer["error"] == f"missing or wrong {auth.CSRF_HEADER}; reload the page"
    status, answer = client.json("DELETE", "/api/people/alice", headers={auth.CSRF_HEADER: "forged"})
    assert status == 403
    status, answer = client.json("DELETE", "/api/people/alice", headers={"Origin": "http://evil.example"})
    assert status == 403 and answer["error"] == "request from 'http://evil.example'; expected it from this page"


def test_state_shows_the_guards_speed(client, page):
    guard, _ = page
    frames_go_on(guard)
    status, answer = wait_for(lambda: (r := client.json("GET", "/api/state"))[1]["state"].get("fps") and r,
                              "a state with the frame rate")
    state = answer["state"]
    assert status == 200 and state["fps"] > 0 and state["frames"] > 0
    assert {"detect_ms", "infer_ms", "total_ms"} <= set(state["latency_ms"])
    assert all(v["p50"] <= v["p95"] for v in state["latency_ms"].values())


# ---- live ----------------------------------------------------------------------------------


def open_stream(port: int, cookie: str) -> tuple[socket.socket, bytes]:
    """A live-view connection and the first bytes of its answer (the status line, headers and, when
    it streams, the start of a frame)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.sendall(f"GET /live.mjpg HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {auth.COOKIE}={cookie}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head or (head.startswith(b"HTTP/1.1 200") and b"image/jpeg" not in head):
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, head


def test_the_live_view_streams_jpegs_to_a_bounded_number_of_viewers_and_drops_none_of_the_guards_frames(client, page):
    guard, port = page
    answers = []
    lock = threading.Lock()

    def viewer() -> None:
        sock, head = open_stream(port, client.cookie)
        with lock:
            answers.append((sock, head))

    ten = [threading.Thread(target=viewer) for _ in range(10)]
    for t in ten:
        t.start()
    for t in ten:
        t.join(180)
    streaming = [(s, h) for s, h in answers if h.startswith(b"HTTP/1.1 200")]
    refused = [(s, h) for s, h in answers if h.startswith(b"HTTP/1.1 503")]
    assert len(streaming) == MAX_VIEWERS and len(refused) == 10 - MAX_VIEWERS
    assert all(b"multipart/x-mixed-replace; boundary=frame" in h and b"Content-Type: image/jpeg" in h for _, h in streaming)
    assert b"viewers already watch (web.max_viewers)" in refused[0][1]
    frames_go_on(guard)
    for sock, _ in answers:  # every viewer goes away mid-stream, without a word
        sock.close()
    wait_for(lambda: client.json("GET", "/api/state")[1]["viewers"] == 0, "the viewers to be counted out")
    frames_go_on(guard)
    sock, head = open_stream(port, client.cookie)  # room again
    sock.close()
    assert head.startswith(b"HTTP/1.1 200")


def test_a_viewer_that_takes_no_frames_gives_its_place_up(client, page, monkeypatch):
    """Three viewers that stopped reading kept every other viewer out for good."""
    from tracker.web import server

    guard, port = page
    monkeypatch.setattr(server, "LIVE_WRITE_TIMEOUT_S", 1.0)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills after a few frames
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /live.mjpg HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {auth.COOKIE}={client.cookie}\r\n\r\n".encode())
    wait_for(lambda: client.json("GET", "/api/state")[1]["viewers"] == 1, "the viewer to be counted")
    wait_for(lambda: client.json("GET", "/api/state")[1]["viewers"] == 0, "the viewer that reads nothing to be dropped")
    sock.close()
    frames_go_on(guard)


def test_head_of_the_live_view_is_refused_and_takes_no_viewers_place(client, page):
    """HEAD /live.mjpg was answered with the stream, for ever, and counted as a viewer."""
    wait_for(lambda: client.json("GET", "/api/state")[1]["viewers"] == 0, "no viewers")
    status, headers, body = client.request("HEAD", "/live.mjpg")
    assert status == 405 and body == b"" and headers["x-frame-options"] == "DENY" and headers["allow"] == "GET"
    assert client.json("GET", "/api/state")[1]["viewers"] == 0
    assert client.request("HEAD", "/api/state")[0] == 200  # other routes answer HEAD as before


def test_a_live_view_ends_with_its_session(client, page):
    """The session was checked only when the stream opened: a stream went on after its logout."""
    guard, port = page
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.sendall(f"GET /live.mjpg HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {auth.COOKIE}={client.cookie}\r\n"
                 "Connection: close\r\n\r\n".encode())
    answer = b""
    while answer.count(b"--frame") < 2:  # it streams
        answer += sock.recv(65536)
    assert client.json("POST", "/api/logout")[0] == 200
    frames = 0
    while frames < 50 and (chunk := sock.recv(65536)):  # the stream ends, or 10 s of frames come on
        frames += chunk.count(b"--frame")
    sock.close()
    assert frames < 50
    frames_go_on(guard)


# ---- events --------------------------------------------------------------------------------


def test_events_come_in_pages_newest_first_with_their_snapshots(client):
    events = wait_for(lambda: len(e := client.json("GET", "/api/events?limit=100")[1]["events"]) >= 2 and e, "two events")
    status, first = client.json("GET", "/api/events?limit=1")
    assert status == 200 and len(first["events"]) == 1 and first["next"] is not None
    status, second = client.json("GET", f"/api/events?limit=1&before={first['next']}")
    assert second["events"][0]["id"] != first["events"][0]["id"]
    assert [first["events"][0]["id"], second["events"][0]["id"]] == [e["id"] for e in events[:2]]
    with_snapshot = next(e for e in events if e["snapshot"])
    status, headers, jpeg = client.request("GET", with_snapshot["snapshot"])
    assert status == 200 and headers["content-type"] == "image/jpeg" and jpeg[:3] == b"\xff\xd8\xff"
    name = events[0]["identity"]
    status, only = client.json("GET", f"/api/events?identity={name}")
    assert only["events"] and {e["identity"] for e in only["events"]} == {name}


def test_the_events_go_on_into_the_rotated_log(client, page):
    guard, _ = page
    wait_for(lambda: client.json("GET", "/api/events?limit=1")[1]["events"], "an event")
    older = guard.stages.state_dir / "events.jsonl.1"
    old_event = {"schema": 1, "id": "0" * 31 + "1", "kind": "left", "track_id": 1, "identity": "unknown"}
    older.write_text(json.dumps(old_event) + "\n")
    try:
        seen, cursor = [], None
        while True:
            status, answer = client.json("GET", "/api/events?limit=100" + (f"&before={cursor}" if cursor else ""))
            assert status == 200
            seen += answer["events"]
            if (cursor := answer["next"]) is None:
                break
        assert seen[-1] == {**old_event, "snapshot": None} and len(seen) > 1
    finally:
        older.unlink()


@pytest.mark.parametrize("query", ["limit=0", "limit=1000", "before=-5", "before=12", "limit=x", "identity=../x"])
def test_bad_event_queries_are_400(client, query):
    status, answer = client.json("GET", f"/api/events?{query}")
    assert status == 400 and answer["error"]


@pytest.mark.parametrize("path", ["/snapshots/..%2F..%2Fpeople%2Falice.npz", "/snapshots/../events.jsonl",
                                  "/snapshots/0123456789abcdef0123456789abcdef.jpg", "/snapshots/latency.jsonl",
                                  "/snapshots/%2Fetc%2Fpasswd"])
def test_no_file_outside_the_snapshots_and_no_missing_one(client, path):
    status, _, body = client.request("GET", path)
    assert status == 404 and b"root:" not in body


# ---- people --------------------------------------------------------------------------------


def test_enrolling_by_upload_reports_each_photo_and_takes_effect_in_the_running_guard(client, page):
    guard, _ = page
    status, answer = client.upload("astronaut", [
        ("astronaut.png", ASTRONAUT.read_bytes()),
        ("grey wall.png", no_face_png()),
        ("crowd.jpg", CROWD.read_bytes()),
        ("notes.txt", b"not a photo at all"),
    ])
    assert status == 200, answer
    # Every photo not used is counted, the one refused before enrolment too, and named as uploaded.
    assert (answer["name"], answer["used"], answer["skipped"]) == ("astronaut", 1, 3)
    lines = answer["messages"]
    assert "notes.txt: not a JPEG or PNG image; expected a photo; skipped" in lines
    assert any(line.startswith("enroll: grey wall.png: 0 faces found; expected exactly one") for line in lines)
    assert any(line.startswith("enroll: crowd.jpg:") and "faces found; expected exactly one" in line for line in lines)
    wait_for(lambda: "astronaut" in guard.stages.gallery.names, "the guard to know the astronaut")
    status, people = client.json("GET", "/api/people")
    assert {"name": "astronaut", "face": "/api/people/astronaut/face.png"} in people["people"]
    status, headers, png = client.request("GET", "/api/people/astronaut/face.png")
    assert status == 200 and png[:8] == b"\x89PNG\r\n\x1a\n"

    status, answer = client.json("DELETE", "/api/people/astronaut")
    assert status == 200 and answer["removed"]
    wait_for(lambda: "astronaut" not in guard.stages.gallery.names, "the guard to forget the astronaut")
    assert client.json("DELETE", "/api/people/astronaut") == (404, {"error": "nobody called 'astronaut' is enrolled",
                                                                     "messages": []})
    frames_go_on(guard)


def test_photos_uploaded_for_someone_enrolled_are_added_to_their_faces(client, page):
    """An upload for a known name replaced the person: the faces they were enrolled from were lost."""
    guard, _ = page
    person = guard.stages.state_dir / "people" / "twice.npz"
    mirrored = cv2.imencode(".png", cv2.flip(cv2.imread(str(ASTRONAUT)), 1))[1].tobytes()
    for kept, photo in ((1, ASTRONAUT.read_bytes()), (2, mirrored)):
        status, answer = client.upload("twice", [("astronaut.png", photo)])
        assert status == 200 and answer["used"] == 1, answer
        with np.load(person) as data:
            assert int(data["count"]) == len(data["chips"]) == kept
    status, answer = client.upload("twice", [("again.png", mirrored)])  # a face kept already
    assert status == 409 and answer["messages"] == ["enroll: again.png: this face is kept for 'twice' already; skipped"]
    assert client.json("DELETE", "/api/people/twice")[0] == 200


def test_a_persons_face_is_encoded_on_the_pool_not_the_event_loop(tmp_path, monkeypatch):
    """The face's PNG was encoded on the page's event loop, which every other request waits on."""
    from tracker.web import server

    encoded_on = []
    imencode = cv2.imencode
    monkeypatch.setattr(server, "person_chip", lambda state_dir, name: np.full((88, 88), 128, np.uint8))
    monkeypatch.setattr(cv2, "imencode", lambda *args: encoded_on.append(threading.current_thread().name) or imencode(*args))
    with page_alone(tmp_path) as port:
        client = Client(port)
        client.open_session()
        status, headers, png = client.request("GET", "/api/people/ann/face.png")
    assert status == 200 and headers["content-type"] == "image/png" and png.startswith(b"\x89PNG")
    assert len(encoded_on) == 1 and encoded_on[0].startswith("web_")  # a thread of the pool's (the event loop's is "web")


@pytest.mark.parametrize("name", ["../etc", "a/b", "unknown", ".hidden", "", "x" * 65, "bob\n"])
def test_a_name_with_path_tricks_is_refused(client, name):
    status, answer = client.upload(name, [("astronaut.png", ASTRONAUT.read_bytes())])
    assert status == 400 and answer["error"].startswith("the form's name: bad name")


def test_uploads_without_one_face_are_refused_with_each_photos_reason(client):
    status, answer = client.upload("nobody", [("wall.png", no_face_png()), ("crowd.jpg", CROWD.read_bytes())])
    assert status == 400 and answer["error"].startswith("enroll: no usable face for 'nobody' in 2 image(s)")
    assert len(answer["messages"]) == 2
    status, answer = client.upload("nobody", [("fake.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 30)])
    assert status == 400 and answer["error"].startswith("no photo to enrol 'nobody' from")
    assert answer["messages"] == ["fake.png: a damaged PNG (no header); expected a JPEG or PNG photo; skipped"]


def test_a_huge_upload_is_refused_before_it_is_read(client, page):
    guard, _ = page
    status, answer = client.upload("big", [("big.png", b"\x89PNG" + b"\0" * 3_000_000)])  # max_upload_mb 2
    assert status == 413 and "larger than web.max_upload_mb (2 MB)" in answer["error"]
    # A Content-Length far beyond the cap is refused on the header: the body is never waited for.
    status, _, body = client.request("POST", "/api/people", b"x" * 10,
                                     {"Content-Type": "multipart/form-data; boundary=x", "Content-Length": "50000000"})
    assert status == 413
    for content_type, data in (("multipart/form-data; boundary=x", b"x" * 10), ("application/json", b"{}"), (None, b"x")):
        status, _, body = client.request("POST", "/api/people", data, {"Content-Type": content_type} if content_type else {})
        assert status == 400 and json.loads(body)["error"].startswith("expected a multipart form with a name and photos")
    frames_go_on(guard)


def raw_request(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.sendall(data)
    return sock


def read_answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    return answer


def upload_head(port: int, cookie: str, csrf: str, length: int, boundary: str = "b") -> bytes:
    return (f"POST /api/people HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {auth.COOKIE}={cookie}\r\n"
            f"{auth.CSRF_HEADER}: {csrf}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n").encode()


def test_uploads_are_bounded_in_parts_length_number_and_time(client, page, monkeypatch):
    """What an upload may hold in memory: a Content-Length it must have, at most MAX_FILES photos
    (refused ones count) and MAX_OTHER_PARTS other parts, MAX_UPLOADS at once, each whole within
    UPLOAD_TIMEOUT_S; and a form without a name field is said to be one."""
    from tracker.web import server

    guard, port = page
    part = '--b\r\nContent-Disposition: form-data; name="photos"; filename="x.png"\r\n\r\n\r\n'
    status, _, body = client.request("POST", "/api/people", (part * (server.MAX_FILES + 2) + "--b--\r\n").encode(),
                                     {"Content-Type": "multipart/form-data; boundary=b"})
    assert status == 400 and f"more than {server.MAX_FILES} photos at a time" in json.loads(body)["error"]
    name = '--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nann\r\n'
    status, _, body = client.request("POST", "/api/people", (name * (server.MAX_OTHER_PARTS + 1) + "--b--\r\n").encode(),
                                     {"Content-Type": "multipart/form-data; boundary=b"})
    assert status == 400 and f"more than {server.MAX_OTHER_PARTS} fields besides the photos" in json.loads(body)["error"]
    status, _, body = client.request("POST", "/api/people", (part * server.MAX_FILES + "--b--\r\n").encode(),
                                     {"Content-Type": "multipart/form-data; boundary=b"})
    assert status == 400 and "(the form has no name field)" in json.loads(body)["error"]
    chunked = raw_request(port, upload_head(port, client.cookie, client.csrf, 0).replace(
        b"Content-Length: 0", b"Transfer-Encoding: chunked") + b"5\r\n--b--\r\n0\r\n\r\n")
    answer = read_answer(chunked)
    assert answer.startswith(b"HTTP/1.1 411") and b"an upload needs a Content-Length" in answer
    broken = '--b\r\nContent-Disposition form-data\r\n\r\nx\r\n--b--\r\n'  # a part header without its colon
    status, _, body = client.request("POST", "/api/people", broken.encode(), {"Content-Type": "multipart/form-data; boundary=b"})
    assert status == 400 and json.loads(body)["error"].startswith("expected a multipart form with a name and photos")

    monkeypatch.setattr(server, "UPLOAD_TIMEOUT_S", 2.0)
    start = b'--b\r\nContent-Disposition: form-data; name="photos"; filename="a.png"\r\n\r\n' + b"\x89PNG"
    stalled = [raw_request(port, upload_head(port, client.cookie, client.csrf, 100_000) + start)
               for _ in range(server.MAX_UPLOADS)]
    wait_for(lambda: guard.stages.web._uploads == server.MAX_UPLOADS, "the stalled uploads to be received")
    status, answer = client.upload("late", [("astronaut.png", ASTRONAUT.read_bytes())])
    assert status == 503 and answer["error"] == f"{server.MAX_UPLOADS} uploads are being received already; try again in a moment"
    for sock in stalled:
        answer = read_answer(sock)
        assert answer.startswith(b"HTTP/1.1 408") and b"the upload took longer than 2 s" in answer
    assert guard.stages.web._uploads == 0
    frames_go_on(guard)


def test_connections_are_bounded_in_number_and_in_the_time_a_request_takes(client, page, monkeypatch):
    """Connections that send half a request and wait used to stay open for good (aiohttp's default
    keep-alive is an hour), until the guard's process ran out of file descriptors."""
    from tracker.web import server

    guard, port = page
    monkeypatch.setattr(server, "MAX_CONNECTIONS", 5)
    half = f"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()  # no blank line: never whole
    silent = [raw_request(port, half) for _ in range(5)]
    time.sleep(0.5)  # accepted and counted before the next one comes
    whole = f"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    answer = read_answer(raw_request(port, whole))  # the 503 arrives though the request is never read
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"X-Frame-Options: DENY" in head
    assert json.loads(body)["error"] == "5 connections to this page are open already; try again later"
    for sock in silent:  # each closed by the server after KEEPALIVE_S, without an answer (else the read times out)
        assert read_answer(sock) == b""
    assert client.json("GET", "/api/state")[0] == 200  # room again
    frames_go_on(guard)


def test_uploads_a_killed_guard_left_are_removed_when_the_page_starts(tmp_path):
    """A guard killed (the watchdog, the OOM killer) while an upload waited for its enrolment left
    the household's photos in <state_dir>/uploads for good."""
    left = tmp_path / "uploads" / "0123456789abcdef"
    left.mkdir(parents=True)
    (left / "ann.jpg").write_bytes(b"a face")
    with page_alone(tmp_path):
        pass
    assert not (tmp_path / "uploads").exists()


def test_bad_part_headers_of_an_upload_are_refused_without_a_word_on_stderr(tmp_path, recwarn):
    """aiohttp warns of each bad Content-Disposition of a part (warnings.warn: two lines on stderr,
    each up to the header's 8 kB): 200 such uploads grew the guard's log by 68 MB."""
    with page_alone(tmp_path) as port:
        client = Client(port)
        client.open_session()
        junk = "y" * 7000
        body = (f'--b\r\nContent-Disposition: form-data; name="photos"; foo*=x{junk}\r\n\r\nz\r\n'  # a bad parameter
                f'--b\r\nContent-Disposition: form data {junk}; name="name"\r\n\r\nann\r\n--b--\r\n')  # a bad header
        status, _, answer = client.request("POST", "/api/people", body.encode(),
                                           {"Content-Type": "multipart/form-data; boundary=b"})
        assert status == 400 and json.loads(answer)["error"].startswith("expected a multipart form with a name and photos")
    assert [str(w.message)[:60] for w in recwarn] == []


JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("path, headers, body, error", [
    ("/api/login", {"Content-Type": "application/json; charset=bogus"}, b'{"password": "x"}', "the body is not JSON"),
    ("/api/login", JSON, b"[" * 30_000 + b"]" * 30_000, "the body is not JSON"),  # deeper than Python's recursion
    ("/api/login", JSON, b"[1]", "the body is a JSON list, not an object"),
    ("/api/login", JSON, b'{"password": 123}', "the body's password is int"),
    ("/api/people/bob/from-event", JSON, b"xx", "the body is not JSON"),
    ("/api/people/bob/from-event", JSON, b'{"id": "abc"}', "the body's event_id is NoneType"),
])
def test_bodies_that_are_not_what_the_handler_takes_get_a_400_with_one_line(client, path, headers, body, error, caplog):
    status, _, answer = client.request("POST", path, body, headers)
    message = json.loads(answer)["error"]
    assert status == 400 and message.startswith(error) and "; expected {" in message and "\n" not in message, message
    # (a body that does not decode was read again after the answer: an ERROR with a traceback)
    time.sleep(0.5)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith(("aiohttp", "tracker"))]


def test_a_request_that_breaks_http_is_no_error_in_the_guards_log(page, caplog):
    guard, port = page
    broken = raw_request(port, (f"POST /api/login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
                                "\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"pas\r\nzz\r\n").encode())
    assert b" 400 Bad Request" in read_answer(broken).split(b"\r\n")[0]
    # a client that hangs up mid-body: an ERROR with a traceback, which anyone could repeat
    gone = raw_request(port, (f"POST /api/login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
                              "\r\nContent-Length: 100\r\n\r\n{\"pass").encode())
    time.sleep(0.5)
    gone.close()
    time.sleep(0.5)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith(("aiohttp", "tracker"))]
    frames_go_on(guard)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd", "identity, gzip"])
def test_a_compressed_body_is_refused_with_a_415_and_never_decoded(client, page, encoding, monkeypatch, caplog):
    """aiohttp inflated a gzip body as it arrived, for a request it refused too (401: it reads on
    after the answer): a few MB of gzip cost the page's thread seconds of CPU, for anyone on the LAN
    (a body in br or zstd got aiohttp's own plain-text 400). The page sends no compressed bodies."""
    from aiohttp import http_parser

    guard, port = page
    decompressors = []
    real = http_parser.ZLibDecompressor
    monkeypatch.setattr(http_parser, "ZLibDecompressor", lambda *a, **k: decompressors.append(k) or real(*a, **k))
    body = zlib.compress(b'{"password": "x"}') if encoding == "deflate" else gzip.compress(b'{"password": "x"}')
    for who, path in ((Client(port), "/api/people"), (client, "/api/login")):  # without a session, and with one
        status, headers, answer = who.request("POST", path, body, {**JSON, "Content-Encoding": encoding})
        assert (status, json.loads(answer)) == (415, {"error": f"Content-Encoding {encoding!r}; expected an uncompressed "
                                                               "body (the page sends none)"})
        assert headers["x-frame-options"] == "DENY"
    assert decompressors == []
    assert client.request("POST", "/api/login", b'{"password": "x"}', {**JSON, "Content-Encoding": "identity"})[0] == 400
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith(("aiohttp", "tracker"))]


def test_a_handler_that_fails_is_a_json_500_and_the_page_goes_on(client, page, monkeypatch):
    guard, _ = page

    def broken(_dir):
        raise RuntimeError("a bug")

    monkeypatch.setattr("tracker.web.server.speed_summary", broken)
    status, headers, body = client.request("GET", "/api/speed")
    assert status == 500 and json.loads(body) == {"error": "GET /api/speed failed inside the guard; its log says why"}
    assert headers["x-frame-options"] == "DENY"
    assert client.json("GET", "/api/state")[0] == 200
    frames_go_on(guard)


@pytest.mark.parametrize("method, path, status", [("GET", "/nowhere", 404), ("PUT", "/api/people", 405),
                                                   ("GET", "/api/state", 401)])
def test_the_servers_own_errors_are_json_with_the_security_headers(client, page, method, path, status):
    guard, port = page
    got, headers, body = (client if status != 401 else Client(port)).request(method, path)
    assert got == status and set(json.loads(body)) == {"error"} and "\n" not in json.loads(body)["error"]
    assert headers["x-frame-options"] == "DENY" and "default-src 'self'" in headers["content-security-policy"]
    assert headers["content-type"].startswith("application/json")
    if status == 405:  # the methods the path takes, as RFC 9110 asks of a 405
        assert sorted(m.strip() for m in headers["allow"].split(",")) == ["GET", "HEAD", "POST"]


def test_an_events_snapshot_teaches_the_guard_a_face(client, page):
    guard, _ = page

    def snapshots_of_two_tracks():
        events = [e for e in client.json("GET", "/api/events?limit=100")[1]["events"] if e["snapshot"]]
        other = next((e for e in events if e["track_id"] != events[0]["track_id"]), None)
        return other and (events[0], other)

    first, other = wait_for(snapshots_of_two_tracks, "events with snapshots of two tracks")
    status, answer = client.json("POST", "/api/people/visitor/from-event", {"event_id": first["id"]})
    assert status == 200 and answer["used"] == 1, answer
    wait_for(lambda: "visitor" in guard.stages.gallery.names, "the guard to know the visitor")
    status, answer = client.json("POST", "/api/people/visitor/from-event", {"event_id": other["id"]})
    assert status == 200  # added to the faces kept for the visitor
    assert client.json("POST", "/api/people/visitor/from-event", {"event_id": "../../people/x"})[0] == 404
    assert client.json("DELETE", "/api/people/visitor")[0] == 200


def test_a_snapshot_without_a_face_is_named_as_the_events_not_by_its_path(client, page):
    """The page was told the snapshot's path on the guard ("enroll: /.../snapshots/<id>.jpg: ...")."""
    guard, _ = page
    event_id = secrets.token_hex(16)
    snapshot = guard.stages.state_dir / "snapshots" / f"{event_id}.jpg"
    snapshot.parent.mkdir(exist_ok=True)
    snapshot.write_bytes(cv2.imencode(".jpg", np.full((120, 120, 3), 128, np.uint8))[1].tobytes())
    try:
        status, answer = client.json("POST", "/api/people/nobody/from-event", {"event_id": event_id})
    finally:
        snapshot.unlink()
    assert status == 400 and answer["messages"] == ["enroll: the event's snapshot: no face found on the chip; skipped"]
    assert str(guard.stages.state_dir) not in json.dumps(answer)


def test_a_bad_name_for_an_events_face_is_the_names_error(client):
    """The name is typed into the page's box: it was refused as "the person in the URL"."""
    status, answer = client.json("POST", "/api/people/unknown/from-event", {"event_id": "0" * 32})
    assert status == 400 and answer["error"].startswith("the name: bad name 'unknown'; expected")


def test_an_events_face_is_added_to_a_person_once(client, page):
    """ "This was..." clicked twice added the same snapshot's face twice."""
    guard, _ = page
    event = wait_for(lambda: next((e for e in client.json("GET", "/api/events?limit=100")[1]["events"] if e["snapshot"]),
                                  None), "an event with a snapshot")
    assert client.json("POST", "/api/people/twice/from-event", {"event_id": event["id"]})[0] == 200
    status, answer = client.json("POST", "/api/people/twice/from-event", {"event_id": event["id"]})
    assert status == 409 and answer["error"] == "enroll: every face found is kept for 'twice' already; nothing added"
    with np.load(guard.stages.state_dir / "people" / "twice.npz") as data:
        assert int(data["count"]) == len(data["chips"]) == 1
    assert client.json("DELETE", "/api/people/twice")[0] == 200


# ---- speed ---------------------------------------------------------------------------------


def test_speed_shows_the_last_benchmark_on_this_device_and_autos_picks(client, page, tmp_path, monkeypatch):
    guard, _ = page
    status, answer = client.json("GET", "/api/speed")
    assert status == 200 and answer["benchmark"] is None and answer["why"].startswith("no benchmark has run")
    assert client.request("GET", "/speed/linear.png")[0] == 404
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {guard.stages.state_dir}\n")
    import tracker.bench.command

    monkeypatch.setattr(tracker.bench.command, "load_average", lambda: [0.1, 0.1, 0.1])  # a quiet machine: write the profile
    assert main(["--config", str(config), "--benchmark", "--backend", "caffe-openblas-dl", "--batches", "1,2",
                 "--passes", "2", "--out", str(tmp_path / "out")]) == 0
    status, answer = client.json("GET", "/api/speed")
    run = answer["benchmark"]
    assert "out" not in run  # where the benchmark wrote its files is no business of the page's
    assert run["columns"] == ["caffe-openblas-dl"] and run["batches"] == [1, 2] and run["complete"]
    assert set(run["mean"]["caffe-openblas-dl"]) == set(run["median"]["caffe-openblas-dl"]) == {"1", "2"}
    assert answer["auto"]["picks"] == [{"batch": 1, "backend": "caffe-openblas-dl", "precision": "fp32"},
                                       {"batch": 2, "backend": "caffe-openblas-dl", "precision": "fp32"}]
    status, headers, png = client.request("GET", "/speed/log.png")
    assert status == 200 and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert client.request("GET", "/speed/../results.png")[0] == 404


# ---- a page with a password ----------------------------------------------------------------


def test_a_password_is_needed_and_wrong_ones_are_rate_limited(tmp_path):
    secret = tmp_path / "web-password"
    secret.write_text("correct horse\n")
    secret.chmod(0o600)
    port = free_port()
    guard, thread = start_guard(tmp_path / "state", {"listen": f"127.0.0.1:{port}", "password_file": str(secret)})
    try:
        c = Client(port)
        status, session = c.json("GET", "/api/session")
        assert session == {"password_required": True, "logged_in": False, "csrf": None} and c.cookie is None
        assert c.json("GET", "/api/state") == (401, {"error": "not logged in; open the page and log in"})
        status, answer = c.json("POST", "/api/login", {"password": "correct horse"})
        assert status == 200 and c.cookie
        c.csrf = answer["csrf"]
        assert c.json("GET", "/api/state")[0] == 200
        assert c.json("POST", "/api/logout")[0] == 200
        assert c.json("GET", "/api/state")[0] == 401  # the session ended
        for proxy_says, secure in (({}, False), ({"X-Forwarded-Proto": "https"}, True),
                                   ({"Forwarded": 'for=192.0.2.7;proto="https"'}, True),
                                   ({"Forwarded": "for=192.0.2.7;proto=http"}, False)):
            status, headers, _ = c.request("POST", "/api/login", json.dumps({"password": "correct horse"}).encode(),
                                           {"Content-Type": "application/json", **proxy_says})
            # behind a TLS proxy, the browser must never send the cookie over plain HTTP to this host
            attributes = [a.strip().lower() for a in headers["set-cookie"].split(";")]
            assert status == 200 and ("secure" in attributes) is secure, (proxy_says, attributes)
        for _ in range(auth.FAILURES_ALLOWED + 1):  # a body of another form is the client's mistake, not a guess
            status, _, body = c.request("POST", "/api/login", b"password=correct+horse",
                                        {"Content-Type": "application/x-www-form-urlencoded"})
            assert status == 400 and json.loads(body)["error"].startswith("the body is not JSON")
        for _ in range(auth.FAILURES_ALLOWED):
            assert c.json("POST", "/api/login", {"password": "guess"}) == (401, {"error": "wrong password"})
        status, headers, body = c.request("POST", "/api/login", json.dumps({"password": "correct horse"}).encode(),
                                          {"Content-Type": "application/json"})
        assert status == 429 and int(headers["retry-after"]) > 0
        assert json.loads(body)["error"].startswith("too many wrong passwords; try again in")
        frames_go_on(guard)
    finally:
        guard.stop()
        thread.join(30)


def test_a_page_beyond_loopback_without_a_password_is_refused_at_start(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nweb:\n  listen: 0.0.0.0:8080\n")
    assert main(["--config", str(config), "--check-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tracker: error: config: key 'web.listen': '0.0.0.0:8080' serves the page beyond this "
                          "machine without a password") and "\n" not in err


def test_a_taken_port_leaves_the_guard_guarding_without_its_page(tmp_path, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = parse_config({"state_dir": str(tmp_path), "source": {"kind": "synthetic", "frames": 30, "realtime": False},
                               "sinks": {"console": False}, "web": {"listen": f"127.0.0.1:{port}"}})
        stages = build_stages(config, realtime=config.source.realtime)  # unpaced, as the guard builds it: none dropped
        assert stages.web is None
        guard = Guard(config, stages)
        assert guard.run() == 0 and guard.frames_processed == 30
    assert f"web: cannot listen on 127.0.0.1:{port}" in caplog.text
