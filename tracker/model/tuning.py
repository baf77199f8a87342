"""Choosing how many cores a forward pass uses, by timing the engine's own forward passes.

Why: on the 2-core EPYC this project is measured on, using both cores is ~1.4-2x faster when the
machine is otherwise idle, but many times slower when other processes compete for the cores
(an OpenBLAS sgemm with 2 threads called after im2col went from 0.6 ms to a ~35 ms median,
waiting for its helper thread to be scheduled; worker threads that must meet after every layer
suffer the same way, less). The host of a virtual machine can do it too: while it runs the
VM's two cores far apart, the "caffe" mode's pass on two BLAS threads took 1.5x its time on one
(docs/BENCHMARKS.md, "The host's slow phases"). No fixed setting is right in every situation,
and a Pi running the guard also runs capture and face detection next to the CNN. So when the
caller does not fix the thread count, the engine treats the candidate settings ("arms", e.g. 1
core or all cores) as a small bandit, per batch-size class:

- each arm first gets `SAMPLES` passes (an arm whose first pass is `REJECT` times slower than
  the best arm's median is not sampled further);
- then the arm with the lowest median of its recent passes is used;
- every so often (after `RETRY_FIRST` passes, doubling up to `RETRY_MAX`; an arm rejected at
  k times the best waits k * `RETRY_FIRST` passes) the other arms are sampled again with fresh
  samples, so a change of load is noticed.

Results never depend on the arm (only the speed does). Not thread-safe; one per Net.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from statistics import median


class ThreadTuner:
    """Per key (a batch-size class), which of `arms` (core counts, in order of preference while
    sampling) to use next; `record` feeds back seconds per image."""

    SAMPLES = 5
    WINDOW = 8
    REJECT = 3.0
    RETRY_FIRST = 64
    RETRY_MAX = 4096

    def __init__(self, arms: Sequence[int]):
        if not arms:
            raise ValueError("ThreadTuner needs at least one arm")
        self.arms = tuple(dict.fromkeys(arms))
        self._state: dict[Hashable, _KeyState] = {}

    def choose(self, key: Hashable) -> int:
        if len(self.arms) == 1:
            return self.arms[0]
        st = self._state.setdefault(key, _KeyState(self.arms, self.WINDOW, self.RETRY_FIRST))
        for arm in self.arms:  # still sampling an arm (a fresh start, or a retry)
            if not st.rejected[arm] and len(st.samples[arm]) < self.SAMPLES:
                return arm
        best = self.best(key)
        if st.calls >= st.retry_at:
            st.retry_gap = min(2 * st.retry_gap, self.RETRY_MAX)
            st.retry_at = st.calls + st.retry_gap
            for arm in self.arms:
                if arm != best:
                    st.samples[arm].clear()
                    st.rejected[arm] = False
            return next(arm for arm in self.arms if arm != best)
        return best

    def record(self, key: Hashable, arm: int, seconds_per_image: float) -> None:
        if len(self.arms) == 1:
            return
        st = self._state[key]
        st.calls += 1
        if not st.samples[arm]:
            others = [median(st.samples[a]) for a in self.arms if a != arm and len(st.samples[a]) >= self.SAMPLES]
            if others and seconds_per_image > self.REJECT * min(others):
                st.rejected[arm] = True
                # Trying it again costs one slow pass: the slower it was, the longer until then.
                ratio = seconds_per_image / min(others)
                st.retry_gap = max(st.retry_gap, min(self.RETRY_MAX, int(self.RETRY_FIRST * ratio)))
                st.retry_at = st.calls + st.retry_gap
        st.samples[arm].append(seconds_per_image)

    def best(self, key: Hashable) -> int:
        """The arm with the lowest median so far (the first arm when nothing is known)."""
        st = self._state.get(key)
        if st is None:
            return self.arms[0]
        timed = [(median(st.samples[a]), i) for i, a in enumerate(self.arms) if st.samples[a]]
        return self.arms[min(timed)[1]] if timed else self.arms[0]


class _KeyState:
    def __init__(self, arms: Sequence[int], window: int, retry_first: int):
        self.samples: dict[int, deque[float]] = {arm: deque(maxlen=window) for arm in arms}
        self.rejected = {arm: False for arm in arms}
        self.calls = 0
        self.retry_gap = retry_first
        self.retry_at = retry_first


def batch_class(n: int) -> int:
    """Batch sizes tuned together: 1, 2-3, 4-7, 8-15, ... (the bit length of n)."""
    return n.bit_length()
