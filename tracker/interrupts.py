"""Stopping a long command as Ctrl-C stops it, whatever signal stops it.

A benchmark or a training run catches KeyboardInterrupt to keep what it did (the cells measured,
the crops cut, the last checkpoint); systemd, a shell's kill and a closed terminal send SIGTERM or
SIGHUP instead, whose default action ends the process at once, past every `finally`.
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
    before = {signum: signal.signal(signum, signal.default_int_handler)
              for signum in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
