"""systemd integration: the sd_notify protocol, written with the socket module (no dependency).

The guard's process calls (tracker.pipeline's loop unless said otherwise):
    ready(status)    once the backend and the first frame are up (or the camera is being waited
                     for: tracker.pipeline.READY_WITHOUT_FRAME_S), again each turn until it was
                     sent (a full queue refuses it, and the unit's start would time out) -> READY=1 (+ STATUS=)
    watchdog()       every turn of the loop, a frame or none (it waits at most 0.5 s for one), and
                     within its long steps: while a backend worker's reply is awaited, as a web
                     page's enrolment goes on; sends WATCHDOG=1 at most every WatchdogSec/2 (cheap to call)
    status(text)     with each report, e.g. "12.3 fps, 2 people, backend caffe-openblas-dl" -> STATUS=...
    stopping()       as every run whose loop started ends, whatever ended it (a signal, the end of
                     the source, --frames, an error), before the last `left`s  -> STOPPING=1
Each returns True if a datagram was sent. All are no-ops returning False when $NOTIFY_SOCKET is unset
(not under systemd, or Type= is not notify), so the same code runs in a terminal and in tests.

Protocol facts (sd_notify(3)): one datagram of newline-separated KEY=VALUE lines to the AF_UNIX
datagram socket named by $NOTIFY_SOCKET (a leading '@' means the abstract namespace). The watchdog
interval is $WATCHDOG_USEC microseconds, meant for the process $WATCHDOG_PID (if set). With
NotifyAccess=main only the main process may notify, so a backend worker child must not call these.
Sending errors are swallowed: losing a notification must never stop the guard (a missed WATCHDOG is
exactly what systemd is there to notice).
"""

from __future__ import annotations

import os
import socket
import threading
import time

_lock = threading.Lock()
_last_watchdog = float("-inf")


def _address() -> str | None:
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return None
    return "\0" + path[1:] if path.startswith("@") else path


def under_systemd() -> bool:
    """True when $NOTIFY_SOCKET names where notifications go."""
    return _address() is not None


def notify(*fields: str) -> bool:
    """Send KEY=VALUE fields as one datagram; False when not under systemd or the send failed.

    The send never blocks: an AF_UNIX datagram queue holds only a few messages (net.unix.
    max_dgram_qlen, 10 by default), and a guard must not hang because its reader is slow."""
    address = _address()
    if address is None:
        return False
    message = "\n".join(fields).encode("utf-8")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, socket.MSG_DONTWAIT, address)
    except OSError:
        return False
    return True


def _clean(text: str) -> str:
    return " ".join(str(text).split())  # one line: a newline would start a new KEY=VALUE field


def ready(status_text: str | None = None) -> bool:
    fields = ["READY=1"]
    if status_text:
        fields.append(f"STATUS={_clean(status_text)}")
    return notify(*fields)


def status(text: str) -> bool:
    return notify(f"STATUS={_clean(text)}")


def stopping() -> bool:
    return notify("STOPPING=1")


def watchdog_interval_s() -> float | None:
    """systemd's WatchdogSec for this process in seconds, or None when no watchdog is armed for it."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


def watchdog() -> bool:
    """Ping the watchdog if half its interval has passed since the last ping (monotonic clock).

    Call it from the loop whose progress proves the guard is alive, not from a timer thread: a stuck
    loop then stops the pings and systemd restarts the service. A ping the socket refused (its
    queue full for a moment) is tried again at the next call, not half an interval later: by then
    the last ping delivered would be a whole interval old, and systemd would kill a working guard."""
    global _last_watchdog
    interval = watchdog_interval_s()
    if interval is None or _address() is None:
        return False
    with _lock:  # held over the send: two threads' calls must not both ping
        now = time.monotonic()
        if now - _last_watchdog < interval / 2 or not notify("WATCHDOG=1"):
            return False
        _last_watchdog = now
    return True
