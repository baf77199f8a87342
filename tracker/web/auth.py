"""Who may use the web page, and proof that a state-changing request comes from the page itself.

Sessions: a random 256-bit token in an HttpOnly, SameSite=Strict cookie (Secure when the page was
reached over TLS: server.py), kept in memory (at most
MAX_SESSIONS: the one unused longest is dropped first, so a page in use keeps its session while
requests without a cookie make new ones; the live tab asks for the guard's state every second)
and ending `lifetime_s` after it was made. With a password a session is made by logging in;
without one (the page listens on loopback only) by opening the page, never by a request a
browser marks as another site's (server.py); the page makes a new one when its own is lost.
Either way a session is needed: it carries the CSRF token.

CSRF: each session has its own random token, which the page reads from /api/session (a same-origin
read: another site's script cannot read it). Every state-changing request must carry it in the
X-CSRF-Token header: a cross-site form cannot set a header, and a cross-site fetch with one needs a
CORS grant the server never gives. (SameSite=Strict keeps the cookie off cross-site requests too.)

Logins are rate-limited per client address: after FAILURES_ALLOWED wrong passwords within WINDOW_S,
that address is refused until the oldest of them is WINDOW_S old. Bounded: at most MAX_CLIENTS
addresses are remembered, and an address is forgotten only once its last failure is WINDOW_S old
(forgetting one still failing would let a guesser go round more addresses than that, never refused);
while MAX_CLIENTS addresses with recent failures are remembered, every other address is refused
until the first of them is forgotten.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

MAX_SESSIONS = 64
FAILURES_ALLOWED = 5
WINDOW_S = 60.0
MAX_CLIENTS = 256
COOKIE = "tracker_session"
CSRF_HEADER = "X-CSRF-Token"


@dataclass(frozen=True)
class Session:
    token: str
    csrf: str
    expires: float  # on the Sessions' clock (monotonic seconds)


class Sessions:
    """The live sessions (see the module docstring). `clock`: monotonic seconds (tests pass their own)."""

    def __init__(self, lifetime_s: float, clock: Callable[[], float] = time.monotonic):
        self.lifetime_s = lifetime_s
        self._clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def create(self) -> Session:
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), self._clock() + self.lifetime_s)
        self._sessions[session.token] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session

    def get(self, token: str | None) -> Session | None:
        """The live session of `token`, or None (unknown or expired: an expired one is dropped)."""
        session = self._sessions.get(token or "")
        if session is None:
            return None
        if self._clock() >= session.expires:
            del self._sessions[session.token]
            return None
        self._sessions.move_to_end(session.token)
        return session

    def drop(self, token: str | None) -> None:
        self._sessions.pop(token or "", None)


def csrf_ok(session: Session, header: str | None) -> bool:
    return header is not None and hmac.compare_digest(session.csrf.encode(), _bytes(header))


def password_ok(expected: str, given: str) -> bool:
    """Constant-time comparison (of digests, so that the length of the password leaks nothing either)."""
    return hmac.compare_digest(hashlib.sha256(expected.encode()).digest(), hashlib.sha256(_bytes(given)).digest())


def _bytes(text: str) -> bytes:
    """`text` as UTF-8, a lone surrogate (from a header's undecodable bytes or a JSON string's
    escapes) included: such text is only ever a wrong token or password, never an error."""
    return text.encode("utf-8", "surrogatepass")


class LoginLimiter:
    """Wrong-password counts per client address (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        # address -> its latest failures, the address failed longest ago first
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, client: str) -> float | None:
        """Seconds until `client` may try again, or None if it may now."""
        now = self._clock()  # once: an address forgotten at one reading must not be emptied at the next
        self._forget_quiet(now)
        recent = self._failures.get(client)
        if recent is None:
            if len(self._failures) < MAX_CLIENTS:
                return None
            recent = next(iter(self._failures.values()))  # no room: wait until this one is forgotten
            return max(0.1, recent[-1] + WINDOW_S - now)
        while recent[0] <= now - WINDOW_S:  # (not emptied: _forget_quiet left an address with a failure in the window)
            recent.popleft()
        if len(recent) < FAILURES_ALLOWED:
            return None
        return max(0.1, recent[0] + WINDOW_S - now)

    def failed(self, client: str) -> None:
        """Count a wrong password of `client`, which retry_after let try."""
        self._failures.setdefault(client, deque(maxlen=FAILURES_ALLOWED)).append(self._clock())
        self._failures.move_to_end(client)

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)

    def _forget_quiet(self, now: float) -> None:
        """Forget the addresses whose failures have all left the window by `now`."""
        while self._failures and next(iter(self._failures.values()))[-1] <= now - WINDOW_S:
            self._failures.popitem(last=False)
