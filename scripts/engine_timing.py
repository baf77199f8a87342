"""Per-image forward time of the Caffe engine's two modes on the face CNN (a quick check while
tuning the engine; the official figures come from `tracker --benchmark`).

    .venv/bin/python scripts/engine_timing.py [--batches 1,8,256] [--seconds 1.5] [--modes caffe,dl]
                                              [--threads N] [--workspace-mb 64]

Prints, per mode and batch size, the median per-image milliseconds over repeated forward passes
(at least 3 passes, at most 100, for about --seconds each) and the process's peak RSS so far
(run one mode per process to read each mode's own peak). Without --threads the engine picks
1 core or all cores per batch size by timing its own passes, as the backends do.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracker.model.caffe_io import load_net  # noqa: E402
from tracker.model.engine import Net  # noqa: E402
from tracker.model.spec import default_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,256")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--modes", default="caffe,dl")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workspace-mb", type=float, default=64)
    a = ap.parse_args()
    spec = default_model()
    netdef = load_net(spec.prototxt, spec.weights)
    batches = [int(b) for b in a.batches.split(",")]
    x0 = np.random.default_rng(0).standard_normal((max(batches), 1, 88, 88)).astype(np.float32)
    for mode in a.modes.split(","):
        net = Net(netdef, np.float32, mode, threads=a.threads, workspace_bytes=int(a.workspace_mb * 2**20))
        cells = []
        for b in batches:
            x = np.ascontiguousarray(x0[:b])
            net.forward(x, ["prob", "fc1"])
            times = []
            t_end = time.perf_counter() + a.seconds
            while (time.perf_counter() < t_end or len(times) < 3) and len(times) < 100:
                t = time.perf_counter()
                net.forward(x, ["prob", "fc1"])
                times.append(time.perf_counter() - t)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            cells.append(f"{b}:{1000 * float(np.median(times)) / b:.3f}ms(rss {rss:.0f}MB)")
        print(f"{mode:6s} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
