"""The guard's web page, served by the guard itself: live view, recent events, the people it knows,
its speed (README, "The web page").

aiohttp on a thread of its own with its own event loop. Nothing here waits on the guard, and the
guard's loop never waits on this: frames are handed over by reference (`live.py`), the guard's
state arrives as a sink's `publish_state`, and changes to the people go through `jobs.py` and are
run by the guard between two frames. Reading files (the event log, snapshots, people's faces),
drawing and encoding frames and encoding faces run on a small thread pool (WORKERS), never on the
event loop. The server decodes no photo: an upload's header is checked on the loop (uploads.py: a
bounded walk over bytes in memory), and enrolment decodes it on the guard's thread (jobs.py).

Routes (JSON errors are {"error": one line} with a 4xx/5xx status):
    GET  /  /static/{app.js,style.css}          the page
    GET  /api/session                           {password_required, logged_in, csrf}
    POST /api/login {password}  /api/logout
    GET  /api/state                             the guard's fps, per-stage latency p50/p95, tracks
    GET  /live.mjpg                             the live view (multipart JPEG, stream_fps at most), until
                                                its session ends; not HEAD (405)
    GET  /api/events?before=&limit=&identity=   a page of the event log, newest first
    GET  /snapshots/{event id}.jpg              an event's snapshot
    GET  /api/people   GET /api/people/{name}/face.png
    POST /api/people (multipart: name, photos)  enrol, as `tracker enroll` does, or add to a known person's faces
    POST /api/people/{name}/from-event {event_id}   add an event's snapshot to a person (409: kept already)
    DELETE /api/people/{name}
    GET  /api/speed   GET /speed/{linear,log}.png   the last benchmark on this device, auto's picks

Security (auth.py for sessions, CSRF and login limits; uploads.py for photos): a password is
required unless the page listens on a loopback address only; then requests must also name the
page by a loopback host (a web site that rebinds its own name to 127.0.0.1 cannot read the page).
Every response the application gives, errors of its own routing too (no route, a method, a body
too large) and a handler's crash (500), forbids framing and sniffing, allows only the page's own
scripts, and is JSON when it is an error; aiohttp answers one kind of request with its own plain
400 (without those headers) before the application sees it: one too malformed to parse. A body in
any Content-Encoding but identity is refused (415) and never decoded: the page sends none, and
aiohttp's own decoding inflated a gzip body as it arrived, for a refused request too (it reads on
after the answer), a thousand times its size in CPU on the page's thread for anyone who reached it.

Bounded, so that no client can exhaust the guard's process (its file descriptors, memory or
threads): at most MAX_CONNECTIONS open connections (one more is answered 503 and closed); a
connection that sends no whole request for KEEPALIVE_S, idle or half-sent, is closed (aiohttp's
keep-alive timer, which runs from the connection's start); a JSON body must arrive within
BODY_TIMEOUT_S, an upload within UPLOAD_TIMEOUT_S and at
most MAX_UPLOADS at once (each up to web.max_upload_mb); a live viewer that takes no frame for
LIVE_WRITE_TIMEOUT_S, once its LIVE_SEND_BUFFER is full, is dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import shutil
import socket
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from importlib.resources import files
from pathlib import Path

import cv2
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.multipart import BadContentDispositionHeader, BadContentDispositionParam

from tracker import daemon
from tracker.child_process import one_line
from tracker.config import Config
from tracker.enroll import AlreadyKept, enroll
from tracker.errors import BackendFailure, InputError, TrackerError
from tracker.identity import UNKNOWN, people_files, person_chip, remove_person, validate_name
from tracker.passwords import loopback
from tracker.snapshots import snapshots_folder
from tracker.types import Event
from tracker.web import auth, event_log
from tracker.web.jobs import Busy, GuardJobs
from tracker.web.live import LiveFeed
from tracker.web.speed import speed_plot, speed_summary
from tracker.web.uploads import check_image, safe_filename

log = logging.getLogger(__name__)

WORKERS = 2
MAX_FILES = 20
MAX_OTHER_PARTS = 4  # fields of the enrol form besides its photos (it has one: the name)
_URL_NAME = "the person in the URL"  # where a name in /api/people/<name>/... came from, for its error
# A browser opens up to 6 connections to a page; with web.max_viewers (at most 16) streams open,
# 64 leaves room for several, and is far below a systemd service's 1024 file descriptors.
MAX_CONNECTIONS = 64
# aiohttp's default keeps a connection that sends nothing, or half a request, for an hour: 300 such
# connections held the guard's process until it ran out of file descriptors.
KEEPALIVE_S = 10.0
BODY_TIMEOUT_S = 10.0  # login and from-event bodies: a few bytes
UPLOAD_TIMEOUT_S = 120.0  # web.max_upload_mb (at most 64 MB) at 0.5 MB/s, a slow phone on Wi-Fi
MAX_UPLOADS = 2  # uploads received at once: each is held in memory (up to web.max_upload_mb) until stored
LIVE_WRITE_TIMEOUT_S = 10.0
REFUSAL_LINGER_S = 1.0  # a refused connection's 503 reaches the client before the close
# A live stream's kernel send buffer, fixed: Linux grows it to 4 MB for a viewer that stops reading
# (about 20 s of frames before a write even waits); 256 kB holds a second of them at any stream_width.
LIVE_SEND_BUFFER = 256 * 1024
_FORM_OVERHEAD = 64 * 1024  # multipart headers and boundaries around the photos
JOB_TIMEOUT_S = 120.0  # enrolling 20 photos on a Pi 3 takes a few seconds; the guard may be restarting a backend
_STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
_PUBLIC = {"/", "/api/session", "/api/login"}
_PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-IP")
_FORWARDED_HTTPS = re.compile(r"(?:^|[;,\s])proto=\"?https\"?(?:$|[;,\s])", re.IGNORECASE)  # RFC 7239
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; "
                               "form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _error(status: int, message: str, **extra) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


class WebServer:
    """The page's server (see the module docstring). A sink of the guard's (`publish_state`),
    with `live` (frames in) and `jobs` (people changes out) for the guard's loop."""

    def __init__(self, config: Config, state_dir: Path, events_path: Path, password: str | None,
                 benchmark_dir: Path | None = None):
        self.config = config
        self.state_dir = state_dir
        self.benchmark_dir = benchmark_dir or state_dir  # where `tracker --benchmark` records its runs
        self.events_path = events_path
        self.snapshots_dir = snapshots_folder(state_dir)
        self.password = password
        self.host, self.port = config.web.host_port
        self.live = LiveFeed(config.web.stream_fps, config.web.stream_width, config.web.max_viewers)
        self.jobs = GuardJobs()
        self.sessions = auth.Sessions(config.web.session_hours * 3600)
        self.logins = auth.LoginLimiter()
        self._state: dict = {}
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="web")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self.address: tuple[str, int] | None = None  # where it listens, once started
        self._uploads = 0  # uploads being read (the server's loop only)

    # -- the guard's side ------------------------------------------------------------------------

    def start(self) -> bool:
        """Serve from a thread of its own; False (and an error in the log) if it cannot listen.
        The guard guards on without its page rather than stopping for it. Uploads a guard killed
        before their enrolment ran left behind (people's photos) are removed first: only this
        guard, which holds the state directory, puts uploads there."""
        shutil.rmtree(self.state_dir / "uploads", ignore_errors=True)
        self._thread = threading.Thread(target=self._serve, name="web", daemon=True)
        self._thread.start()
        self._started.wait()
        return self.address is not None

    def publish_event(self, event: Event, snapshot_jpeg: bytes | None) -> None:
        """Events reach the page through the event log (event_log.py)."""

    def publish_state(self, state: dict) -> None:
        self._state = state  # one reference swapped: the server's threads read a whole dict

    def close(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self.jobs.cancel_all()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the server's thread ---------------------------------------------------------------------

    def _serve(self) -> None:
        logging.getLogger("aiohttp.server").addFilter(_client_mistakes_in_one_line)  # (once: addFilter adds it once)
        # aiohttp warns (warnings.warn) of every bad Content-Disposition of an upload's parts: two
        # lines on stderr, each up to the header's 8 kB, that anyone could repeat until journald's
        # rate limit dropped the guard's own lines. The form is judged without them (a 400 if it is
        # not one). (filterwarnings replaces an equal filter: once.)
        for category in (BadContentDispositionHeader, BadContentDispositionParam):
            warnings.filterwarnings("ignore", category=category)
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        # auto_decompress=False: aiohttp leaves a compressed body as it came (_guard_request refuses it).
        runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=1.0, keepalive_timeout=KEEPALIVE_S,
                               auto_decompress=False)
        try:
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(_BoundedSite(runner, self.host, self.port).start())
            self.address = runner.addresses[0][:2]
        except (OSError, ValueError) as err:  # ValueError: a host name the resolver refuses (UnicodeError)
            log.error("web: cannot listen on %s (%s); the guard runs on without its page", self.config.web.listen,
                      getattr(err, "strerror", None) or err)
            loop.run_until_complete(runner.cleanup())
            loop.close()
            return
        finally:
            self._started.set()  # start() waits for this, whatever happened (no address: not listening)
        log.info("web: the page is at http://%s:%d/%s", *self.address,
                 "" if self.password is None else " (password required)")
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            # Handlers still running (a live stream waiting for its next frame) end here, so that the
            # loop closes with nothing pending.
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    def _app(self) -> web.Application:
        # JSON bodies (login, from-event) are tiny: aiohttp refuses a bigger body with 413. Uploads
        # are streamed and capped by _enrol itself.
        app = web.Application(middlewares=[self._guard_request], client_max_size=64 * 1024)
        app.on_response_prepare.append(_add_security_headers)  # every answer, errors included
        app.add_routes([
            web.get("/", self._index),
            web.get("/static/{name}", self._static),
            web.get("/api/session", self._session),
            web.post("/api/login", self._login),
            web.post("/api/logout", self._logout),
            web.get("/api/state", self._get_state),
            # aiohttp answers HEAD of a GET route with its handler: HEAD here took a viewer's place and
            # was sent the stream as its body
            web.get("/live.mjpg", self._live, allow_head=False),
            web.get("/api/events", self._events),
            web.get("/snapshots/{name}", self._snapshot),
            web.get("/api/people", self._people),
            web.get("/api/people/{name}/face.png", self._face),
            web.post("/api/people", self._enrol),
            web.post("/api/people/{name}/from-event", self._enrol_from_event),
            web.delete("/api/people/{name}", self._forget),
            web.get("/api/speed", self._speed),
            web.get("/speed/{scale}.png", self._speed_plot),
        ])
        return app

    async def _run(self, fn, *args):
        """fn(*args) on the server's pool: never block the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # -- every request ---------------------------------------------------------------------------

    @web.middleware
    async def _guard_request(self, request: web.Request, handler) -> web.StreamResponse:
        if self.password is None and not _loopback_host(request.host):
            return _error(421, f"host {request.host!r} is not this page's; open it as http://127.0.0.1:{self.port}/")
        if self.password is None and any(h in request.headers for h in _PROXY_HEADERS):
            # A proxy on this machine would hand a page without a password to whoever reaches the proxy.
            return _error(403, "this page has no password and answers this machine only, not through a proxy; "
                               "set web.password_file to serve it through one")
        encoding = ", ".join(request.headers.getall("Content-Encoding", ()))
        if {e.strip().lower() for e in encoding.split(",")} - {"identity", ""}:  # (see the module docstring)
            return _error(415, f"Content-Encoding {encoding!r}; expected an uncompressed body (the page sends none)")
        session = self.sessions.get(request.cookies.get(auth.COOKIE))
        public = request.path in _PUBLIC or request.path.startswith("/static/")
        if not public and session is None:
            if self.password is None:  # nothing to log in to: a client that never opened the page has no cookie
                return _error(401, "no session cookie; this page has no password: open the page, or GET /api/session "
                                   "for the cookie (and the CSRF token changes need)")
            return _error(401, "not logged in; open the page and log in")
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("Origin")
            if origin is not None and origin.split("://", 1)[-1] != request.host:
                return _error(403, f"request from {origin!r}; expected it from this page")
            if request.path != "/api/login" and (session is None or not auth.csrf_ok(
                    session, request.headers.get(auth.CSRF_HEADER))):
                return _error(403, f"missing or wrong {auth.CSRF_HEADER}; reload the page")
        try:
            return await handler(request)
        except _BadBody as err:
            return _error(err.status, str(err))
        except web.HTTPException as err:  # aiohttp's own answers (no route, method, body too large): JSON too
            if err.status < 400:
                raise
            answer = _error(err.status, f"{err.reason}: {request.method} {request.path}" + (
                f" ({err.text})" if err.text and "\n" not in err.text and not err.text.startswith(str(err.status)) else ""))
            if "Allow" in err.headers:  # a 405 must say which methods the path takes (RFC 9110, 15.5.6)
                answer.headers["Allow"] = err.headers["Allow"]
            return answer
        except ConnectionError:  # the client went away (a phone dropped mid-upload): nothing to answer
            raise
        except Exception:  # a bug: logged whole, answered in one line (never a traceback to the client)
            log.exception("web: %s %s failed", request.method, request.path)
            if request.writer is not None and request.writer.output_size > 0:
                raise  # an answer is under way (the live stream): a status line now would corrupt it
            return _error(500, f"{request.method} {request.path} failed inside the guard; its log says why")

    # -- the page and its session ----------------------------------------------------------------

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(body=_read_static("index.html"), content_type="text/html", charset="utf-8")

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _STATIC:
            return _error(404, f"no static file {name!r}")
        return web.Response(body=_read_static(name), content_type=_STATIC[name], charset="utf-8")

    async def _session(self, request: web.Request) -> web.Response:
        session = self.sessions.get(request.cookies.get(auth.COOKIE))
        response = web.json_response({})
        # Another site's page can make a browser request this address (an <img>; no cookie goes with
        # it): the sessions it would make could push out the user's. A browser says where a request
        # comes from; a client that does not (curl, a script on this machine) is not a web page.
        same_site = request.headers.get("Sec-Fetch-Site", "same-origin") in ("same-origin", "none")
        if session is None and self.password is None and same_site:
            session = self._new_session(request, response)
        response.text = json.dumps({"password_required": self.password is not None, "logged_in": session is not None,
                                    "csrf": session.csrf if session else None})
        return response

    async def _login(self, request: web.Request) -> web.Response:
        expected = '{"password": "<text>"}'
        given = (await _json_object(request, expected)).get("password")
        if not isinstance(given, str):  # a client's mistake, not a guess: not counted against it
            return _error(400, f"the body's password is {type(given).__name__}; expected {expected}")
        # From here to the failure's record nothing awaits: parallel attempts cannot all pass the check.
        client = request.remote or "?"
        wait = self.logins.retry_after(client)
        if wait is not None:
            return web.json_response({"error": f"too many wrong passwords; try again in {wait:.0f} s"}, status=429,
                                     headers={"Retry-After": str(max(1, round(wait)))})
        if self.password is None:
            return _error(400, "this page has no password; just open it")
        if not auth.password_ok(self.password, given):
            self.logins.failed(client)
            return _error(401, "wrong password")
        self.logins.succeeded(client)
        self.sessions.drop(request.cookies.get(auth.COOKIE))
        response = web.json_response({})
        session = self._new_session(request, response)
        response.text = json.dumps({"csrf": session.csrf})
        return response

    async def _logout(self, request: web.Request) -> web.Response:
        self.sessions.drop(request.cookies.get(auth.COOKIE))
        response = web.json_response({"logged_in": False})
        response.del_cookie(auth.COOKIE, path="/")
        return response

    def _new_session(self, request: web.Request, response: web.Response) -> auth.Session:
        """A new session, its cookie set on `response`: Secure when the browser reached the page over
        TLS (through a proxy that says so: the page itself speaks plain HTTP), so that the browser never
        sends it over plain HTTP to the same host, where the LAN could read it. A client that claims TLS
        falsely only keeps its own cookie from itself."""
        session = self.sessions.create()
        response.set_cookie(auth.COOKIE, session.token, max_age=int(self.sessions.lifetime_s), path="/",
                            httponly=True, samesite="Strict", secure=request.secure or _came_over_tls(request.headers))
        return session

    # -- live ------------------------------------------------------------------------------------

    async def _get_state(self, request: web.Request) -> web.Response:
        return web.json_response({"state": self._state, "viewers": self.live.viewers})

    async def _live(self, request: web.Request) -> web.StreamResponse:
        if not self.live.join():
            return _error(503, f"{self.live.max_viewers} viewers already watch (web.max_viewers); try again later")
        try:
            response = web.StreamResponse(headers={"Content-Type": "multipart/x-mixed-replace; boundary=frame"})
            sock = request.transport.get_extra_info("socket") if request.transport else None
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, LIVE_SEND_BUFFER)
            await response.prepare(request)
            sent = 0
            poll_s = min(0.1, self.live.interval_ns / 2e9)
            token = request.cookies.get(auth.COOKIE)
            while self.sessions.get(token) is not None:  # logged out or expired: the stream ends
                frame = await self._run(self.live.jpeg) if self.live.seq != sent else None
                if frame is None:
                    await asyncio.sleep(poll_s)
                    continue
                sent, jpeg = frame
                await asyncio.wait_for(response.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: "
                                                      + str(len(jpeg)).encode() + b"\r\n\r\n" + jpeg + b"\r\n"),
                                       LIVE_WRITE_TIMEOUT_S)
            return response
        except (ConnectionError, asyncio.CancelledError):
            return response  # the viewer went away, or the server is closing
        except TimeoutError:  # a viewer that takes no frames holds a place other viewers may want
            request.protocol.force_close()
            return response
        finally:
            self.live.leave()

    # -- events ----------------------------------------------------------------------------------

    async def _events(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            before = query.get("before") or None
            if before is not None:
                event_log.parse_cursor(before)
            limit = int(query.get("limit", "20"))
            if not 1 <= limit <= event_log.MAX_LIMIT:
                raise ValueError
        except ValueError:
            return _error(400, f"bad before/limit {dict(query)!r}; expected before as a page's next gave it "
                               f"and limit 1..{event_log.MAX_LIMIT}")
        identity = query.get("identity") or None
        if identity is not None and identity != UNKNOWN:
            try:
                validate_name(identity, "identity filter")
            except InputError as err:
                return _error(400, str(err))
        def page() -> tuple[list[dict], str | None]:
            events, next_before = event_log.read_page(self.events_path, backups=self.config.sinks.jsonl_backups,
                                                      before=before, limit=limit, identity=identity)
            for event in events:
                event["snapshot"] = self._snapshot_url(event.get("id"))  # a file check each: on the pool too
            return events, next_before

        events, next_before = await self._run(page)
        return web.json_response({"events": events, "next": next_before})

    def _snapshot_file(self, event_id) -> Path | None:
        """The snapshot of event `event_id` (a uuid4 hex, as tracker.events makes), if kept."""
        if not isinstance(event_id, str) or len(event_id) != 32 or any(c not in "0123456789abcdef" for c in event_id):
            return None
        path = self.snapshots_dir / f"{event_id}.jpg"
        return path if path.is_file() else None

    def _snapshot_url(self, event_id) -> str | None:
        return f"/snapshots/{event_id}.jpg" if self._snapshot_file(event_id) else None

    async def _snapshot(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        path = self._snapshot_file(name[:-4]) if name.endswith(".jpg") else None
        if path is None:
            return _error(404, f"no snapshot {name!r} (snapshots are named <event id>.jpg; the oldest are removed)")
        try:
            jpeg = await self._run(path.read_bytes)
        except FileNotFoundError:  # the snapshot store removed it just now
            return _error(404, f"no snapshot {name!r} (the oldest are removed)")
        return web.Response(body=jpeg, content_type="image/jpeg")

    # -- people ----------------------------------------------------------------------------------

    async def _people(self, request: web.Request) -> web.Response:
        try:
            names = [p.stem for p in await self._run(people_files, self.state_dir)]
        except InputError as err:  # the folder cannot be read: the page says so, polled, in one line
            return _error(500, str(err))
        return web.json_response({"people": [{"name": n, "face": f"/api/people/{n}/face.png"} for n in names]})

    async def _face(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            validate_name(name, _URL_NAME)
        except InputError as err:
            return _error(400, str(err))
        png = await self._run(_face_png, self.state_dir, name)
        if png is None:
            return _error(404, f"no face kept for {name!r}")
        return web.Response(body=png, content_type="image/png")

    async def _enrol(self, request: web.Request) -> web.Response:
        """Multipart: `name`, then up to MAX_FILES `photos`, within web.max_upload_mb together (413
        otherwise: by its Content-Length, which it must have, before anything is read, or as soon as
        the bytes read pass it). Each photo is checked (uploads.py) before anything decodes it; the
        ones refused are reported beside enroll's own per-photo lines."""
        budget = int(self.config.web.max_upload_mb * 1e6)
        too_large = _error(413, f"upload larger than web.max_upload_mb ({self.config.web.max_upload_mb:g} MB); "
                                "expected fewer or smaller photos")
        if request.content_length is None:  # chunked: nothing would bound what the form's part headers hold
            return _error(411, "an upload needs a Content-Length (browsers send one); expected a form of photos")
        if request.content_length > budget + _FORM_OVERHEAD:
            return too_large
        if self._uploads >= MAX_UPLOADS:
            return _error(503, f"{MAX_UPLOADS} uploads are being received already; try again in a moment")
        self._uploads += 1
        try:
            async with asyncio.timeout(UPLOAD_TIMEOUT_S):
                form = await _read_enrol_form(await request.multipart(), budget)
        except TimeoutError:
            return _error(408, f"the upload took longer than {UPLOAD_TIMEOUT_S:.0f} s; expected fewer or smaller photos")
        # not multipart, broken or nested
        except (AssertionError, KeyError, ValueError, HttpProcessingError, web.RequestPayloadError) as err:
            return _error(400, f"expected a multipart form with a name and photos ({one_line(err)})")
        finally:
            self._uploads -= 1
        if form is None:
            return too_large
        name, photos, messages = form
        try:
            validate_name(name, "the form's name")
        except InputError as err:
            return _error(400, str(err))
        if not photos:
            return _error(400, f"no photo to enrol {name!r} from; expected JPEG or PNG photos showing one face each",
                          messages=messages)
        folder = self.state_dir / "uploads" / secrets.token_hex(8)
        try:
            paths = await self._run(_write_uploads, folder, photos)
        except OSError as err:
            await self._run(shutil.rmtree, folder, True)
            return _error(507, f"cannot store the photos in the guard's state folder ({err.strerror or err}); "
                               "free some space")
        shown = {path: label for path, (label, _) in zip(paths, photos, strict=True)}
        refused = len(messages)  # one line each so far (enroll's own lines come after)
        del form, photos  # on disk now: not held (up to web.max_upload_mb each) while the job waits its turn
        # The job removes the folder when it has run; if it never runs, _people_change does.
        return await self._people_change(
            lambda detector, backend: _enrol_job(self.config, name, shown, messages, folder, detector, backend,
                                                 refused=refused),
            messages, lambda: shutil.rmtree(folder, True))

    async def _enrol_from_event(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        expected = '{"event_id": "<the event\'s id>"}'
        event_id = (await _json_object(request, expected)).get("event_id")
        if not isinstance(event_id, str):
            return _error(400, f"the body's event_id is {type(event_id).__name__}; expected {expected}")
        try:
            validate_name(name, "the name")  # typed into the page's "This was..." box
        except InputError as err:
            return _error(400, str(err))
        path = self._snapshot_file(event_id)
        if path is None:
            return _error(404, f"no snapshot for event {event_id!r} (the oldest snapshots are removed)")
        messages: list[str] = []
        return await self._people_change(
            lambda detector, backend: _enrol_job(self.config, name, {path: "the event's snapshot"}, messages, None, detector, backend,
                                                 snapshot=True), messages)

    async def _forget(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            validate_name(name, _URL_NAME)
        except InputError as err:
            return _error(400, str(err))
        return await self._people_change(lambda detector, backend: _forget_job(self.state_dir, name), [])

    async def _people_change(self, job, messages: list[str], not_run=None) -> web.Response:
        """Run `job` on the guard's thread (jobs.py) and answer with its result or its error, one
        line each; `not_run()` is called when the job will never run (refused, or cancelled before
        the guard got to it)."""
        try:
            future: Future = self.jobs.submit(job)
        except Busy as err:
            if not_run is not None:
                await self._run(not_run)
            return _error(503, f"{err}; try again in a moment")
        try:
            # shield: a timeout here must not cancel a job the guard is running; cancel() below
            # takes back only one it has not started.
            result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), JOB_TIMEOUT_S)
        except TimeoutError:
            if future.cancel() and not_run is not None:
                await self._run(not_run)
            return _error(503, f"the guard did not get to the change within {JOB_TIMEOUT_S:.0f} s; try again")
        except InputError as err:
            status = 404 if isinstance(err, _NotEnrolled) else 409 if isinstance(err, AlreadyKept) else 400
            return _error(status, str(err), messages=messages)
        except BackendFailure as err:
            return _error(503, f"the backend failed ({err}); try again", messages=messages)
        except (TrackerError, OSError) as err:
            return _error(500, f"the change failed: {err}", messages=messages)
        return web.json_response({**result, "messages": messages})

    # -- speed -----------------------------------------------------------------------------------

    async def _speed(self, request: web.Request) -> web.Response:
        return web.json_response(await self._run(speed_summary, self.benchmark_dir))

    async def _speed_plot(self, request: web.Request) -> web.Response:
        png = await self._run(speed_plot, self.benchmark_dir, request.match_info["scale"])
        if png is None:
            return _error(404, "no benchmark plot here; run tracker --benchmark --backend all on this device")
        return web.Response(body=png, content_type="image/png")


class _NotEnrolled(InputError):
    """Nobody of that name to forget (404, not 400)."""


def _enrol_job(config: Config, name: str, shown: dict[Path, str], messages: list[str], folder: Path | None,
               detector, backend, snapshot: bool = False, refused: int = 0) -> dict:
    """Enrol `name` from the files of `shown` (the guard's thread): photos of one face each, as
    `tracker enroll` does, or (`snapshot`) an event's snapshot, a face with some context. Either is
    added to the faces a known person was enrolled from (the page never replaces a person: deleting
    one is its own step). enroll's messages name each file as `shown` names it to the user (the
    photo's name as uploaded), never by its path on the guard; `folder` (the uploads) is removed
    afterwards. "skipped" counts the `refused` photos (refused before enroll) too."""

    def report(line: str) -> None:
        for path, label in shown.items():
            line = line.replace(str(path), label)
        messages.append(line)

    try:
        done = enroll(name, list(shown), config, aligned=snapshot, add=True, report=report, backend=backend,
                      detector=detector, alive=daemon.watchdog)
    finally:
        if folder is not None:
            shutil.rmtree(folder, True)  # the uploads, once enroll has read them
    return {"name": name, "used": done.used, "skipped": done.skipped + refused}


def _face_png(state_dir: Path, name: str) -> bytes | None:
    """The face kept for person `name` (identity.person_chip) as PNG bytes, or None if none is kept.
    Reads a file and encodes: the pool's work."""
    chip = person_chip(state_dir, name)
    if chip is None:
        return None
    ok, png = cv2.imencode(".png", chip)
    if not ok:  # a chip of a kind PNG cannot hold: a bug, answered 500 by the middleware
        raise RuntimeError(f"cannot encode the face kept for {name!r} ({chip.dtype}, {chip.shape}) as PNG")
    return png.tobytes()


def _forget_job(state_dir: Path, name: str) -> dict:
    if not remove_person(state_dir, name):
        raise _NotEnrolled(f"nobody called {name!r} is enrolled")
    return {"name": name, "removed": True}


def _write_uploads(folder: Path, photos: list[tuple[str, bytes]]) -> list[Path]:
    """The checked photos as files in a private folder of their own, for enroll (which reads files)."""
    folder.parent.mkdir(mode=0o700, exist_ok=True)
    folder.mkdir(mode=0o700)
    paths = []
    for i, (label, data) in enumerate(photos, start=1):
        path = folder / safe_filename(label, i)
        path.write_bytes(data)
        paths.append(path)
    return paths


def _loopback_host(host: str) -> bool:
    """The request's Host header names this machine (passwords.loopback), with or without a port."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    return loopback(name.strip("[]"))


async def _read_enrol_form(reader, budget: int) -> tuple[str, list[tuple[str, bytes]], list[str]] | None:
    """(name, [(file name, bytes)] of the photos that pass uploads.check_image, a line for each that
    does not) from the enrol form; None once more than `budget` bytes came. ValueError for a form
    that is not one: broken, nested, without a name field, or with more than MAX_FILES photos or
    MAX_OTHER_PARTS other fields."""
    name = None
    photos: list[tuple[str, bytes]] = []
    messages: list[str] = []
    other_parts = photo_parts = 0  # refused photos and unknown parts count too: their headers cost memory
    async for part in reader:
        if not isinstance(part, BodyPartReader):
            raise ValueError("a nested multipart part")
        if part.name == "photos":
            photo_parts += 1
            if photo_parts > MAX_FILES:
                raise ValueError(f"more than {MAX_FILES} photos at a time")
        else:
            other_parts += 1
            if other_parts > MAX_OTHER_PARTS:
                raise ValueError(f"more than {MAX_OTHER_PARTS} fields besides the photos; expected a name")
        data = await _read_part(part, budget)
        if data is None:
            return None
        budget -= len(data)
        if part.name == "name":
            name = data.decode("utf-8", "replace")
        elif part.name == "photos":
            label = part.filename or f"photo {photo_parts}"
            try:
                check_image(data, label)
            except InputError as err:
                messages.append(f"{err}; skipped")
                continue
            photos.append((label, data))
    if name is None:
        raise ValueError("the form has no name field")
    return name, photos, messages


async def _read_part(part: BodyPartReader, budget: int) -> bytes | None:
    """The part's bytes, or None as soon as they exceed `budget` (never holding more than that)."""
    chunks, size = [], 0
    while chunk := await part.read_chunk(64 * 1024):
        size += len(chunk)
        if size > budget:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _client_mistakes_in_one_line(record: logging.LogRecord) -> bool:
    """A filter of aiohttp's server log: a request that breaks HTTP (a broken chunked body) and a
    client that hangs up mid-body are logged there as ERRORs with a traceback, which read as the
    guard's failure (and anyone could fill its journal with them); they are the client's, so each
    becomes one DEBUG line of ours instead."""
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, (HttpProcessingError, web.RequestPayloadError)):
        log.debug("web: a malformed request: %s", one_line(error))
        return False
    if isinstance(error, (ConnectionResetError, BrokenPipeError)):
        log.debug("web: the client went away: %s", one_line(error))
        return False
    return True


def _came_over_tls(headers) -> bool:
    """Whether a proxy in front says the browser used https (X-Forwarded-Proto, or RFC 7239's
    Forwarded with proto=https)."""
    return (headers.get("X-Forwarded-Proto", "").strip().lower() == "https"
            or bool(_FORWARDED_HTTPS.search(headers.get("Forwarded", ""))))


class _BadBody(Exception):
    """A request body that is not what its handler takes: answered `status` with the message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


async def _json_object(request: web.Request, expected: str) -> dict:
    """The request's body, a JSON object. _BadBody naming `expected` (its JSON form) for a body
    that is not one: not JSON, undecodable (a bad charset), nested deeper than
    Python's recursion allows, JSON of another type, or not whole within BODY_TIMEOUT_S (408)."""
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            body = await request.json()
    except TimeoutError:
        raise _BadBody(f"the body did not arrive within {BODY_TIMEOUT_S:.0f} s; expected {expected}", 408) from None
    except (ValueError, LookupError, RecursionError, web.RequestPayloadError) as err:
        raise _BadBody(f"the body is not JSON ({one_line(err)}); expected {expected}") from None
    if not isinstance(body, dict):
        raise _BadBody(f"the body is a JSON {type(body).__name__}, not an object; expected {expected}")
    return body


async def _add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(_HEADERS)


class _BoundedSite(web.BaseSite):
    """aiohttp's TCPSite with a bound on open connections: one more than MAX_CONNECTIONS gets a
    503 and is closed (aiohttp has none)."""

    def __init__(self, runner: web.AppRunner, host: str, port: int) -> None:
        super().__init__(runner)
        self._host, self._port = host, port
        self._lingering: set[_Refusal] = set()  # refusals waiting for their 503 to arrive (the loop's only)

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None  # the runner was set up

        def accept() -> asyncio.BaseProtocol:
            if len(server.connections) < MAX_CONNECTIONS:
                return server()
            # A refusal lingers a moment for its 503 to arrive; a flood of them would hold as many
            # descriptors as the bound is there to save: beyond MAX_CONNECTIONS lingering, at once.
            return _Refusal(self._lingering, linger=len(self._lingering) < MAX_CONNECTIONS)

        self._server = await loop.create_server(accept, self._host, self._port, reuse_address=True)


class _Refusal(asyncio.Protocol):
    """A connection beyond MAX_CONNECTIONS: a 503 with the page's headers, then the write side
    shut and, with `linger`, the connection closed up to REFUSAL_LINGER_S later (or when the client
    closes its side): closing at once, with the client's request unread, may send a reset that
    reaches the client before the 503 does. `lingering`: the refusals waiting so, kept by the site."""

    def __init__(self, lingering: set, linger: bool) -> None:
        self._lingering, self._linger = lingering, linger

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        body = json.dumps({"error": f"{MAX_CONNECTIONS} connections to this page are open already; try again later"})
        head = "".join(f"{k}: {v}\r\n" for k, v in _HEADERS.items())
        transport.write(f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n{head}\r\n{body}".encode())
        if not self._linger:
            transport.close()
            return
        transport.write_eof()
        self._lingering.add(self)
        asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        """The request is read and dropped: it gets the 503 whatever it is."""

    def eof_received(self) -> bool:
        return False  # the client is done: close now

    def connection_lost(self, exc: Exception | None) -> None:
        self._lingering.discard(self)


def _read_static(name: str) -> bytes:
    return (files("tracker.web") / "static" / name).read_bytes()
