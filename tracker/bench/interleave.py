"""Timing several ways of doing one job in alternating rounds in one process, for the benchmark's
runoff (tracker.bench.runoff) and the measuring tools (`scripts/backend_overhead.py`,
`scripts/engine_timing.py --against`): on a shared host whose speed drifts, separate runs cannot
give a ratio, interleaved ones can."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def time_interleaved(variants: dict[str, Callable[[np.ndarray], Any]], x: np.ndarray, seconds: float,
                     rounds: int, on_round: Callable[[int], None] | None = None) -> dict[str, tuple[float, int]]:
    """Each variant's median seconds per call on `x` and its number of timed calls: {name: (s, calls)}.

    One untimed call each first (it allocates, traces, resizes, packs weights). Then `rounds`
    rounds; in each, every variant is called back to back for `seconds` (at least once), one
    variant after the other. The order rotates by one each round, so that no variant always
    follows the same one (whose caches and threads it would inherit), and a machine that gets
    busier or quieter during the run slows every variant alike. on_round(k), if given, is called
    with the number of rounds done: 0 after the untimed calls, then after each round.
    """
    for run in variants.values():
        run(x)
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        if on_round is not None:
            on_round(r)
        for name in names[r % len(names):] + names[:r % len(names)]:
            run, own = variants[name], times[name]
            end = time.perf_counter() + seconds
            while True:
                start = time.perf_counter()
                run(x)
                stop = time.perf_counter()
                own.append(stop - start)
                if stop >= end:
                    break
    if on_round is not None:
        on_round(rounds)
    return {name: (statistics.median(ts), len(ts)) for name, ts in times.items()}
