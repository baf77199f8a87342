"""Stopping a long command as Ctrl-C stops it, whatever signal stops it.

A benchmark or a training run catches KeyboardInterrupt to keep what it did (the cells measured,
the crops cut, the last checkpoint); systemd, a shell's kill and a closed terminal send SIGTERM or
SIGHUP instead, whose default action ends the process at once, past every `finally`.
`interrupts_held()` keeps such a stop out of a few steps that must happen together;
`signals_handled()` is how both put their handlers in place and back (and how the guard puts its
clean stop in place).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def stop_as_ctrl_c() -> Iterator[None]:
    """For the block, SIGTERM (systemd, a shell's kill) and SIGHUP (a closed terminal) raise
    KeyboardInterrupt as Ctrl-C does, so that the command keeps what it did (a benchmark kills its
    running child and keeps what it measured); a signal already ignored (SIGHUP under nohup) stays
    ignored. Main thread only."""
    with signals_handled((signal.SIGTERM, signal.SIGHUP), signal.default_int_handler):
        yield


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """For the block, SIGINT, SIGTERM and SIGHUP are held: the first that comes is noted, and raised
    again as the block ends to the handler it had before, so a KeyboardInterrupt never falls between
    the block's steps (the renames that put a caffemodel and its card in place). (Not a signal mask:
    a process's signal goes to any thread that does not block it, and torch's threads do not.) An
    ignored signal stays ignored. Main thread only; keep the block short."""
    came: list[int] = []
    try:
        with signals_handled((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), lambda signum, frame: came.append(signum)):
            yield
    finally:
        if came:
            signal.raise_signal(came[0])


@contextlib.contextmanager
def signals_handled(signums: tuple[int, ...], handler) -> Iterator[None]:
    """For the block, `handler` for each of `signums` that is not ignored (an ignored one stays
    ignored: SIGHUP under nohup) nor handled outside Python (signal.getsignal says None: that
    handler could not be put back); the handlers before it put back after. Main thread only."""
    before = {signum: signal.signal(signum, handler) for signum in signums
              if signal.getsignal(signum) not in (signal.SIG_IGN, None)}
    try:
        yield
    finally:
        for signum, previous in before.items():
            signal.signal(signum, previous)
