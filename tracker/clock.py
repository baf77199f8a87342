"""What time it is, and how far the wall clock can be trusted: for ages that must survive a restart.

A Raspberry Pi has no battery-backed clock. It boots with the time fake-hwclock saved at its last
shutdown (or 1970) and steps to the real time when NTP first answers, which may be hours later or
never (no network). An age computed from wall-clock stamps across that step is wrong by however
long the Pi was off: events stamped before it look days older after it. So a reading carries, besides
the wall clock, the boot it was taken in and the seconds since that boot (CLOCK_BOOTTIME, which
counts suspend and never steps), and whether the kernel says the wall clock is synchronized:
- two readings of one boot: their uptimes give the exact time between them;
- readings of different boots: only wall-clock stamps taken while synchronized can be compared.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
TIME_ERROR = 5  # adjtimex's answer while the kernel's clock is unsynchronized (STA_UNSYNC)
TIMEX_BYTES = 512  # more than struct timex on any Linux ABI (208 bytes on 64-bit); zeroed: modes 0 only reads

_PROCESS_BOOT = f"process-{uuid.uuid4()}"  # without a boot id, every process counts as its own boot


@dataclass(frozen=True)
class Reading:
    """wall: Unix seconds (float); boot: an id of this boot (the kernel's, else one per process);
    uptime: seconds since that boot (float, never steps); synchronized: the kernel reports the
    wall clock as synchronized to a time source (NTP, chrony, timesyncd)."""

    wall: float
    boot: str
    uptime: float
    synchronized: bool


@functools.cache
def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip() or _PROCESS_BOOT
    except OSError:  # not Linux, or /proc not mounted
        return _PROCESS_BOOT


def _uptime() -> float:
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock_id) if clock_id is not None else time.monotonic()


@functools.cache
def _adjtimex():
    """libc's adjtimex (the process's own libc, looked up once), or None where there is none."""
    return getattr(ctypes.CDLL(None), "adjtimex", None)


@functools.cache
def _say_refused() -> None:
    log.warning("clock: the kernel refused adjtimex, so whether the wall clock is synchronized is unknown; "
                "its stamps are not trusted across restarts (a sandbox denying the @clock system calls, "
                "e.g. systemd's ProtectClock=yes, does this)")


def _synchronized() -> bool:
    """Whether adjtimex says the wall clock is synchronized. Where there is no adjtimex (not Linux),
    True: the wall clock is trusted, as everywhere before this module. Where it is refused (-1: a
    seccomp filter denying the @clock calls), False, logged once: an unknown clock counts as
    unsynchronized, so no stamp it made ages an event early."""
    adjtimex = _adjtimex()
    if adjtimex is None:
        return True
    state = adjtimex(ctypes.create_string_buffer(TIMEX_BYTES))
    if state == -1:
        _say_refused()
    return state not in (TIME_ERROR, -1)


def now() -> Reading:
    return Reading(wall=time.time(), boot=_boot_id(), uptime=_uptime(), synchronized=_synchronized())
