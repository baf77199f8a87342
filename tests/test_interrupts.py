"""tracker.interrupts: SIGTERM and SIGHUP as Ctrl-C for a block, an ignored signal left ignored; a
stop held out of a block's steps."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tracker.interrupts import interrupts_held, stop_as_ctrl_c


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


def test_a_stop_within_held_steps_comes_after_the_last_of_them():
    """tracker train's two renames (the card, then the weights): a stop between them left the new card
    beside the old weights, which the guard then refused. Another thread runs meanwhile, as torch's
    do: a signal mask of the main thread alone let the stop in through it."""
    done = []
    other = threading.Thread(target=time.sleep, args=(0.5,))
    other.start()
    with stop_as_ctrl_c(), pytest.raises(KeyboardInterrupt):
        with interrupts_held():
            done.append("card")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # a stop not held would have come by now (between bytecodes)
            done.append("weights")
        done.append("after")
    other.join()
    assert done == ["card", "weights"]
