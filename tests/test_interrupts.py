"""tracker.interrupts: SIGTERM and SIGHUP as Ctrl-C for a block, an ignored signal left ignored."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tracker.interrupts import stop_as_ctrl_c


def test_stop_as_ctrl_c_leaves_an_ignored_signal_ignored_and_restores_the_handlers():
    """Under nohup SIGHUP is ignored: a benchmark or a training run that way must outlive the terminal."""
    before_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    before_term = signal.getsignal(signal.SIGTERM)
    try:
        with stop_as_ctrl_c():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)  # the handler runs between bytecodes: at once
        assert signal.getsignal(signal.SIGTERM) is before_term and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before_hup)
