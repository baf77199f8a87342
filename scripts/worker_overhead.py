#!/usr/bin/env python3
"""What the backend worker costs: run with the product's venv from the repository root,

    .venv/bin/python scripts/worker_overhead.py [--calls 200] [--mxnet-rss] [--bench-runs 5 [--passes 100]]

1. transport: the round trip of one infer call through the worker with the shared-memory and the
   pipe transport, at batch 1 and 8 of face-CNN-sized arrays (1x88x88 in; 848 + 128 floats out),
   with a backend that computes nothing (`Echo` below), against the same backend in-process.
   A call costs two wake-ups of a process blocked on another core (request, reply): on a
   virtual machine each is a halted vCPU woken by an IPI, ~0.1 ms; on bare metal far less.
   The worker's cost on a real backend: `tracker --benchmark` with and without --worker.
2. with --bench-runs N: `tracker --benchmark --backend caffe-openblas-dl --batches 1,8` run N
   times without and with --worker, alternately (a busy machine slows both alike); prints each
   run's mean ms/image and the ratio of the medians (worker / in-process).
3. with --mxnet-rss: peak RSS (VmHWM) of the MXNet worker child after one batch of 1, 64 and 256
   for both MXNet configurations (the benchmark's RSS column counts only the cell's process).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tracker.blas_idle import bound_idle_spin  # noqa: E402

bound_idle_spin()  # before numpy loads OpenBLAS, as the `tracker` command does

import numpy as np  # noqa: E402

from tracker.arguments import ArgumentParser, int_between, one_line_errors, positive_int  # noqa: E402
from tracker.backends import create_backend  # noqa: E402
from tracker.backends.base import BackendBase  # noqa: E402
from tracker.backends.worker import WorkerBackend  # noqa: E402
from tracker.model.spec import default_model  # noqa: E402
from tracker.types import Inference  # noqa: E402


class Echo(BackendBase):
    """Computes nothing: returns fixed face-CNN-shaped outputs (the transport is all that is timed)."""

    name = "echo"

    def __init__(self, model, **options):
        self._probs = np.full((256, 848), 1 / 848, np.float32)
        self._embedding = np.zeros((256, 128), np.float32)

    def infer(self, x):
        n = x.shape[0]
        return Inference(self._probs[:n].copy(), self._embedding[:n].copy())


def _per_call_us(backend, x, calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        backend.infer(x)
    return (time.perf_counter_ns() - start) / calls / 1e3


def transport(calls: int) -> None:
    print("1. transport round trip (Echo backend, no compute), microseconds per call, median of 5 runs")
    print(f"{'batch':>5} {'in-process':>11} {'shm':>8} {'pipe':>8}")
    local = Echo(None)
    workers = {t: WorkerBackend("echo", default_model(), target="worker_overhead:Echo", transport=t,
                                env={"PYTHONPATH": str(HERE)}) for t in ("shm", "pipe")}
    try:
        for n in (1, 8):
            x = np.random.default_rng(0).standard_normal((n, 1, 88, 88), dtype=np.float32)
            times = {name: statistics.median(_per_call_us(b, x, calls) for _ in range(5))
                     for name, b in (("local", local), *workers.items())}
            print(f"{n:>5} {times['local']:>11.1f} {times['shm']:>8.1f} {times['pipe']:>8.1f}")
    finally:
        for w in workers.values():
            w.close()


def bench_runs(runs: int, passes: int) -> None:
    import json
    import subprocess
    import tempfile

    print(f"\n2. caffe-openblas-dl, tracker --benchmark --passes {passes}, {runs} runs each way (mean ms/image)")
    tracker = Path(sys.executable).with_name("tracker")
    means: dict[tuple[int, bool], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tracker.yaml"
        config.write_text(f"state_dir: {tmp}/state\n")  # keep the calibration profile out of the way
        for run in range(runs):
            for worker in (False, True):
                out = Path(tmp) / f"run{run}-{int(worker)}"
                subprocess.run([str(tracker), "--config", str(config), "--benchmark", "--backend", "caffe-openblas-dl",
                                "--batches", "1,8", "--passes", str(passes), "--out", str(out)] + (["--worker"] if worker else []),
                               check=True, capture_output=True)
                for row in json.loads((out / "results.json").read_text())["rows"]:
                    means.setdefault((row["batch"], worker), []).append(row["ms_per_image"])
    print(f"{'batch':>5} {'in-process runs':>36} {'worker runs':>36} {'ratio of medians':>17}")
    for n in (1, 8):
        local, remote = means[(n, False)], means[(n, True)]
        ratio = statistics.median(remote) / statistics.median(local)
        print(f"{n:>5} {' '.join(f'{v:6.2f}' for v in local):>36} {' '.join(f'{v:6.2f}' for v in remote):>36} {ratio:>17.3f}")


def mxnet_rss() -> None:
    print("\n3. peak RSS of the MXNet worker child (MB) after one batch")
    print(f"{'backend':>18} {'batch':>5} {'VmHWM MB':>9}")
    for name in ("mxnet-openblas", "mxnet-openblas-dl"):
        for n in (1, 64, 256):
            backend = create_backend(name)
            try:
                backend.infer(np.random.default_rng(0).standard_normal((n, 1, 88, 88), dtype=np.float32))
                print(f"{name:>18} {n:>5} {backend.child_peak_rss_kb() / 1024:>9.0f}")
            finally:
                backend.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, every one checked before any timing: a bad one raises InputError (one line,
    exit 2). --calls 0 divided by zero; --bench-runs -1 timed nothing and then looked its rows up."""
    parser = ArgumentParser(prog="worker_overhead.py", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=positive_int, default=200, help="calls per batch size and configuration")
    parser.add_argument("--bench-runs", type=int_between(0), default=0,
                        help="also compare caffe-openblas-dl in the benchmark with and without --worker, this many runs each")
    # tracker --benchmark's own bound on --passes
    parser.add_argument("--passes", type=int_between(1, 10_000), default=100, help="benchmark passes per run (with --bench-runs)")
    parser.add_argument("--mxnet-rss", action="store_true", help="also measure the MXNet child's peak RSS")
    return parser.parse_args(argv)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transport(args.calls)
    if args.bench_runs:
        bench_runs(args.bench_runs, args.passes)
    if args.mxnet_rss:
        mxnet_rss()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
