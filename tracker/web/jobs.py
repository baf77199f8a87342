"""Work the web page asks of the guard's own thread: enrolling and forgetting people.

Enrolment runs the guard's detector and backend, which belong to its processing thread (neither is
thread-safe, and a second copy would double the backend's memory on a 1 GB Pi). So the web server
submits a job, the guard runs one job between two frames (`run_next`: well under a second per
photo on a Pi 3, more for photos of tens of megapixels; one job per turn, and a watchdog ping
before each photo, keep the loop's pings coming), and the server awaits the job's future. The guard then reloads its
gallery, so a change takes effect on the next frame. Bounded: at most MAX_PENDING jobs wait; a
further one is refused at once (`Busy`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

MAX_PENDING = 4

Job = Callable[[Any, Any], Any]  # job(detector, backend) -> result


class Busy(Exception):
    """MAX_PENDING jobs already wait for the guard."""


class GuardJobs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: deque[tuple[Job, Future]] = deque()

    def submit(self, job: Job) -> Future:
        """Queue `job` for the guard's thread; its Future gets the result or the exception."""
        future: Future = Future()
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                raise Busy(f"{MAX_PENDING} changes are already waiting for the guard")
            self._pending.append((job, future))
        return future

    def run_next(self, detector, backend) -> bool:
        """Run the oldest queued job that is still wanted (the guard's thread, between frames);
        True if one ran."""
        while True:
            with self._lock:
                if not self._pending:
                    return False
                job, future = self._pending.popleft()
            if future.set_running_or_notify_cancel():
                break  # (a cancelled one is dropped and the next is looked at)
        try:
            future.set_result(job(detector, backend))
        except Exception as err:  # noqa: BLE001 - the web request reports it; the guard goes on
            future.set_exception(err)
        return True

    def cancel_all(self) -> None:
        """The guard has stopped: no queued job will run; their requests get an error at once."""
        with self._lock:
            pending, self._pending = self._pending, deque()
        for _, future in pending:
            future.cancel()
