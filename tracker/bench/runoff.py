"""The runoff: the fastest candidates of each batch size timed again, interleaved in one process,
before their times go into `auto`'s calibration profile.

Why: each cell runs alone in a child process of its own, minutes apart from the other backends'
cells of the same batch size. A host whose speed drifts (a shared VM's slow phases last seconds to
minutes) can slow one cell throughout, and the profile then ranks two engines by when they ran,
not by what they cost: on a 2-core EPYC VM, ONNX Runtime's batch-1 cell read 0.93 ms per image
where interleaved runs in the same session read 0.50-0.52, so `auto` ran LiteRT there at 1.37x
the fastest. Timed interleaved (tracker.bench.interleave), the candidates share whatever phase
the machine is in, and their ratio holds.

Who runs off: per precision and batch size, the backends with the fastest cell medians, at most
MAX_CANDIDATES of them, as many as fit in the memory available now when each takes its cell's
peak RSS; never `auto` (it is no candidate). A batch size with one candidate has no runoff. The
runoff's medians, rescaled to its candidates' cells (`profile_medians`), replace those cells'
medians in the profile; the table and the rows of results.json keep the cells' own figures, and
results.json's runoffs the runoff's own medians.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import exp, log

# Every candidate is loaded at once, so their number bounds the runoff's memory and time. No
# spread of cell times tells who is close: on the EPYC VM slow phases made LiteRT's int8 cell at
# batch 1 read 2.4x its interleaved time in one run (0.546 ms against 0.228 in the overhead
# script) and 1.96x its runoff's in the next (0.591 against 0.301; both outputs are in the git
# history of docs/benchmark-epyc-genoa-2core/, the second in second/benchmark.txt as of bf2ac0c).
MAX_CANDIDATES = 4
# rounds x candidates x seconds: 6 s of timing per runoff at four candidates, with every
# candidate called at least once per round (a batch-256 call of a slow engine takes ~0.4 s).
ROUNDS = 6
SECONDS_PER_ROUND = 0.25


@dataclass(frozen=True)
class Runoff:
    """One batch size's candidates at one precision, fastest cell first."""

    precision: str
    batch: int
    backends: tuple[str, ...]


def profile_medians(runoff_ms: dict[str, float], cell_ms: dict[str, float]) -> dict[str, float]:
    """What a runoff puts into the profile for its candidates: their runoff medians (ms per
    image), all multiplied by one factor so that their geometric mean equals that of the same
    candidates' cell medians.

    Why: the runoff ranks its candidates among themselves; the other backends of the batch size
    keep their cells' medians, measured in other phases of the machine. The runoff's own medians
    carry the phase it ran in, and a slow one put a backend it did not time ahead of all four: at
    fp32 batch 64, ONNX Runtime, TensorFlow, MXNet and LiteRT ran off at 0.96-1.29 ms per image
    against cells of 0.50-0.79, and caffe-openblas-dl's cell of 0.82 became the pick (EPYC VM,
    docs/benchmark-epyc-genoa-2core/runoff-unscaled/). Rescaled, the runoff keeps its order and
    the cells' level. Every name of `runoff_ms` must be in `cell_ms` (candidates come from cells)."""
    factor = exp(sum(log(cell_ms[n]) - log(ms) for n, ms in runoff_ms.items()) / len(runoff_ms))
    return {name: ms * factor for name, ms in runoff_ms.items()}


def plan_runoffs(rows: list[dict], available_mb: float | None) -> list[Runoff]:
    """The runoffs that a benchmark's rows (results.json rows, see tracker.bench) call for, by
    precision then batch size. available_mb: memory new processes can use now, None if unknown
    (then memory does not limit the candidates)."""
    cells: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        if row["status"] == "ok" and row["backend"] != "auto":
            cells.setdefault((row["precision"], row["batch"]), []).append(row)
    runoffs = []
    for (precision, batch), candidates in sorted(cells.items()):
        candidates.sort(key=lambda r: r["median_ms_per_image"])
        chosen: list[str] = []
        memory_mb = 0.0
        for row in candidates[:MAX_CANDIDATES]:
            rss_mb = row["peak_rss_mb"] or 0.0
            if available_mb is not None and memory_mb + rss_mb > available_mb:
                break  # a runoff without the faster ones would not decide the pick
            chosen.append(row["backend"])
            memory_mb += rss_mb
        if len(chosen) >= 2:
            runoffs.append(Runoff(precision, batch, tuple(chosen)))
    return runoffs
