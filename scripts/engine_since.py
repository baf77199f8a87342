"""The Caffe engine of an earlier commit against this checkout's, stage by stage of the face CNN,
in alternating processes: issue 16's per-layer breakdown before and after, on one machine in one
session (the README's "The project's Caffe engine").

    .venv/bin/python scripts/engine_since.py [--before 6404998] [--modes dl,caffe] [--batches 1,8,64]
                                             [--threads 2] [--rounds 3] [--seconds 1.0]

--before names a commit (default: the last one before issue 16's first change to the engine). It
is checked out into a temporary git worktree, removed at the end. Each round runs one process on
that worktree's engine and one on this checkout's, the order alternating from round to round,
and each process times every mode and batch size: warm-up passes for --seconds, then timed passes
for --seconds (at least three). Both engines read this checkout's prototxt and weights and run under
the same bound on OpenBLAS's idle threads (`tracker.blas_idle`), on --threads cores.

Prints, per mode and batch size, for each stage of the net and for the whole pass, the range over
the rounds of each commit's median milliseconds per image, and the median over the rounds of
after / before. A stage runs from one layer with weights to the next (conv1 to pool1, conv2 to
pool2, conv3 to relu3, fc1 to relu4, fc2 to prob), whichever ops do its work: the engine has come
to fuse layers differently (conv1 with pool1, conv2's bias and ReLU after pool2), so layers are not
comparable across commits but stages are. A stage's time is the sum of its ops' `run` calls (with
several worker threads, summed over the workers, so about twice their wall time); the pass is
wall time. A bad option (--before not a commit of this repository, an unknown mode, a count below
1) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[1]

# the last commit before issue 16's first change to the engine (abade13, pixel-major convolutions)
ENGINE_BEFORE_ISSUE_16 = "6404998"
PROTOTXT = REPO / "models" / "face_cnn.prototxt"
WEIGHTS = REPO / "models" / "face_cnn.caffemodel"
MIN_PASSES = 3


def stage_of_layers(layers: list[tuple[str, str]]) -> dict[str, str]:
    """Each layer name -> its stage's name, "first..last": a stage starts at each layer with weights
    (Convolution, InnerProduct); layers before the first start one of their own. `layers`: (name,
    type) in the net's order."""
    stages: list[list[str]] = []
    for name, kind in layers:
        if not stages or kind in ("Convolution", "InnerProduct"):
            stages.append([])
        stages[-1].append(name)
    return {name: f"{names[0]}..{names[-1]}" if len(names) > 1 else names[0] for names in stages for name in names}


def time_tree(tree: Path, modes: list[str], batches: list[int], threads: int, seconds: float) -> dict:
    """In this process: the engine of the checkout at `tree` on the face CNN, every mode and batch
    size timed. Returns {"mode/batch": {"pass": [s, ...], "stages": {stage: [s, ...]}}}, seconds
    per image, one entry per timed pass. Must run before anything imports `tracker`."""
    sys.path.insert(0, str(tree))
    import numpy as np

    import tracker
    from tracker.model import ops
    from tracker.model.caffe_io import load_net
    from tracker.model.engine import Net

    if not Path(tracker.__file__).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"imported tracker from {tracker.__file__}, not from {tree}")
    netdef = load_net(PROTOTXT, WEIGHTS)
    stage = stage_of_layers([(layer.name, layer.type) for layer in netdef.layers])
    spent: dict[str, float] = defaultdict(float)
    lock, depth = threading.Lock(), threading.local()

    def timed(run):
        def wrapper(self, *args, **kwargs):
            # the outermost run only: an op may run another (a fused step's parts)
            if getattr(depth, "n", 0):
                return run(self, *args, **kwargs)
            depth.n = 1
            start = time.perf_counter()
            try:
                return run(self, *args, **kwargs)
            finally:
                depth.n = 0
                with lock:  # several workers' steps end on several threads
                    spent[stage[self.name.split("+")[0]]] += time.perf_counter() - start
        return wrapper

    for cls in list(vars(ops).values()):
        if isinstance(cls, type) and issubclass(cls, ops.Op) and "run" in vars(cls):
            cls.run = timed(cls.run)
    (input_shape,) = netdef.inputs.values()
    x_all = np.random.default_rng(0).standard_normal((max(batches), *input_shape[1:])).astype(np.float32)
    results = {}
    for mode in modes:
        net = Net(netdef, np.float32, mode, threads=threads)
        for batch in batches:
            x = np.ascontiguousarray(x_all[:batch])
            warm_end = time.perf_counter() + seconds
            while time.perf_counter() < warm_end:
                net.forward(x, ["prob"])
            passes, stages = [], defaultdict(list)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end or len(passes) < MIN_PASSES:
                spent.clear()
                start = time.perf_counter()
                net.forward(x, ["prob"])
                passes.append((time.perf_counter() - start) / batch)
                for name in sorted(set(stage.values())):
                    stages[name].append(spent[name] / batch)
            results[f"{mode}/{batch}"] = {"pass": passes, "stages": dict(stages)}
    return results


@contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """A temporary git worktree of `commit`, detached, removed on leaving (`usage_error` if
    `commit` is not a commit of this repository)."""
    check = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        usage_error(f"--before {commit!r} is not a commit of {REPO}; expected a commit id or ref, e.g. {ENGINE_BEFORE_ISSUE_16}")
    with tempfile.TemporaryDirectory(prefix="engine-since-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(tree), commit], check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=True)


def run_child(tree: Path, args) -> dict:
    """`time_tree` of `tree` in a fresh process (this script with --child), its result."""
    cmd = [sys.executable, __file__, "--child", str(tree), "--modes", args.modes, "--batches", args.batches,
           "--threads", str(args.threads), "--seconds", str(args.seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit status {proc.returncode}"
        raise SystemExit(f"engine_since: timing the engine of {tree} failed: {last}")
    return json.loads(proc.stdout.splitlines()[-1])


def median_ms(results: list[dict], key: str, name: str) -> list[float]:
    """Per round, the median ms per image of stage `name` ("pass": the whole pass) of mode/batch
    `key` (0 for a stage that round's commit did not time)."""
    def passes(result: dict) -> list[float]:
        return result[key]["pass"] if name == "pass" else result[key]["stages"].get(name, [0.0])
    return [1000 * statistics.median(passes(result)) for result in results]


def report(rounds: dict[str, list[dict]], before: str) -> list[str]:
    """The printed table, from each commit's per-round results (see the module docstring)."""
    lines = []
    for key, first in rounds["after"][0].items():
        mode, batch = key.split("/")
        lines.append(f"{mode} batch {batch}: ms per image, range over {len(rounds['after'])} rounds ({before} -> this checkout)")
        for name in [*first["stages"], "pass"]:
            b, a = median_ms(rounds["before"], key, name), median_ms(rounds["after"], key, name)
            ratios = [x / y for x, y in zip(a, b) if y > 0]
            ratio = f"x{statistics.median(ratios):.2f}" if ratios else "-"
            label = "whole pass (wall)" if name == "pass" else name
            lines.append(f"  {label:18s} {min(b):7.3f}-{max(b):7.3f}  ->  {min(a):7.3f}-{max(a):7.3f}   {ratio}")
    return lines


def usage_error(message: str) -> NoReturn:
    print(f"engine_since: {message}", file=sys.stderr)
    sys.exit(2)


def positive(kind):
    """An argparse type: `kind` of the text, at least 1 (0 excluded for floats)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value <= 0 or (kind is int and value < 1):
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value
    return parse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=ENGINE_BEFORE_ISSUE_16)
    ap.add_argument("--modes", default="dl,caffe")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--threads", type=positive(int), default=2)
    ap.add_argument("--rounds", type=positive(int), default=3)
    ap.add_argument("--seconds", type=positive(float), default=1.0)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    modes = args.modes.split(",")
    if not set(modes) <= {"caffe", "dl"}:
        usage_error(f"--modes {args.modes!r}: expected caffe, dl or both, comma-separated")
    try:
        batches = [positive(int)(b) for b in args.batches.split(",")]
    except argparse.ArgumentTypeError as e:
        usage_error(f"--batches {args.batches!r}: {e}; expected positive integers, comma-separated")
    if args.child:
        print(json.dumps(time_tree(Path(args.child), modes, batches, args.threads, args.seconds)))
        return
    # this checkout's bound on OpenBLAS's idle threads, inherited by both commits' processes alike
    # (imported here: a --child process must import `tracker` from its own tree)
    sys.path.insert(0, str(REPO))
    from tracker.blas_idle import bound_idle_spin
    bound_idle_spin()
    rounds: dict[str, list[dict]] = {"before": [], "after": []}
    with worktree(args.before) as tree:
        for r in range(args.rounds):
            order = [("before", tree), ("after", REPO)] if r % 2 == 0 else [("after", REPO), ("before", tree)]
            for which, path in order:
                print(f"round {r + 1}: {which}", file=sys.stderr, flush=True)
                rounds[which].append(run_child(path, args))
    print("\n".join(report(rounds, args.before)))


if __name__ == "__main__":
    main()
