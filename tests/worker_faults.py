"""Test-only backends that misbehave for real inside a worker's child process.

Imported by the child through PYTHONPATH (the tests directory), never by the product. `Faulty`
computes a simple, exactly predictable result (see `expected`) until call number `after`
(counted from 1 in this process; call 1 is the worker's warm-up on one zero image, so the
default `after=2` is the parent's first infer), then on every call does its `fault`:

    kill     SIGKILL to itself mid-batch (as the kernel's OOM killer would)
    abort    says so on stderr, then SIGABRT (what a C++ runtime does on std::bad_alloc or a failed assertion)
    exit     os._exit(7)
    hang     sleeps for an hour
    greedy   allocates 64 MiB per input (a workspace that grows with the batch): MemoryError
             under the worker's memory limit
    reject   raises InputError (a bad input: the backend stays usable)
    crash    raises RuntimeError
    wait     writes `marker` (a path) when the batch has arrived, then sleeps (the test kills it)

`NeverReady` sleeps in its constructor; `Unavailable` has no runtime.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from tracker.backends.base import BackendBase
from tracker.errors import BackendUnavailable, InputError
from tracker.types import Inference


def expected(x: np.ndarray) -> Inference:
    """What Faulty returns for x (N, C, H, W): softmax of the first 10 values, the first 4 values."""
    flat = x.reshape(x.shape[0], -1).astype(np.float64)
    logits = flat[:, :10] - flat[:, :10].max(axis=1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return Inference(probs.astype(np.float32), flat[:, :4].astype(np.float32))


class Faulty(BackendBase):
    name = "faulty"

    def __init__(self, model, *, precision="fp32", threads=None, fault="none", after=2, marker=None):
        self.fault, self.after, self.marker = fault, after, marker
        self.calls = 0

    def infer(self, x):
        self.calls += 1
        if self.calls >= self.after:
            self._misbehave(x)
        return expected(x)

    def _misbehave(self, x) -> None:
        if self.fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.fault == "abort":
            print(f"faulty: aborting on call {self.calls}", file=sys.stderr, flush=True)
            os.abort()
        elif self.fault == "exit":
            os._exit(7)
        elif self.fault == "hang":
            time.sleep(3600)
        elif self.fault == "greedy":
            workspace = np.ones((x.shape[0], 64 * 2**20 // 4), np.float32)
            x = x + workspace[:, :1, None, None]
        elif self.fault == "reject":
            raise InputError(f"faulty input: call {self.calls} rejected; expected a call before {self.after}")
        elif self.fault == "crash":
            raise RuntimeError(f"faulty engine broke on call {self.calls}")
        elif self.fault == "wait":
            Path(self.marker).write_text(str(os.getpid()))
            time.sleep(3600)


class NeverReady(BackendBase):
    name = "never-ready"

    def __init__(self, model, **options):
        time.sleep(3600)


class Unavailable(BackendBase):
    name = "unavailable"

    @classmethod
    def check_runtime(cls):
        raise BackendUnavailable("backend 'unavailable': runtime 'nothing' is not importable; install it with: nothing")
