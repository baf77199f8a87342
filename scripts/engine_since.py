"""The Caffe engine of an earlier commit against this checkout's, stage by stage of the face CNN,
in alternating processes: issue 16's per-layer breakdown before and after, on one machine in one
session (the README's "The project's Caffe engine").

    .venv/bin/python scripts/engine_since.py [--before 6404998] [--modes dl,caffe] [--batches 1,8,64]
                                             [--threads 2] [--rounds 3] [--seconds 1.0]

--before names a commit (default: the last one before issue 16's first change to the engine). It is
checked out into a temporary git worktree, removed at the end. Each round runs one process on that
worktree's engine and one on this checkout's, the order alternating from round to round, and each
process times every mode and batch size: warm-up passes for --seconds, then passes for --seconds (at
least three) timing the whole pass, then as many timing each op. Both engines read this checkout's
prototxt and weights and run under the same bound on OpenBLAS's idle threads (`tracker.blas_idle`),
on --threads cores.

Prints, per mode and batch size, for each stage of the net and for the whole pass, the range over
the rounds of each commit's median milliseconds per image, and the median over the rounds of after /
before. A stage runs from one layer with weights to the next (conv1 to pool1, conv2 to pool2, conv3
to relu3, fc1 to relu4, fc2 to prob), whichever ops do its work: the engine has come to fuse layers
differently (conv1 with pool1, conv2's bias and ReLU after pool2), so layers are not comparable
across commits but stages are. A stage's time is the sum of its ops' `run` calls (with several
worker threads each running its own images, as the "dl" mode's do for batches of several, summed
over them, so about twice their wall time), timed in passes of their own; the whole pass is wall
time, in passes without that timing. A bad option (--before not a commit of this repository, an
unknown mode, a count or time that is not a positive number): one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
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


class OpTimer:
    """Times every op's `run` of a checkout's `tracker.model.ops`, summed per stage of the net, while
    installed: each `Op` subclass that defines `run` gets it wrapped (the ops of both commits are
    all defined there, and none runs another). A step's time is the wall time of its `run` on the
    thread that called it; with several worker threads, each running its own images, a stage's
    time is summed over them."""

    def __init__(self, ops, stage: dict[str, str]):
        self.classes = [cls for cls in vars(ops).values() if isinstance(cls, type) and issubclass(cls, ops.Op) and "run" in vars(cls)]
        self.stage = stage
        self.spent: dict[str, float] = defaultdict(float)
        self.lock = threading.Lock()

    def stage_of(self, op) -> str:
        """The stage of an op (a fused step, named "conv1+pool1", by its first layer)."""
        layer = op.name.split("+")[0]
        if layer not in self.stage:
            raise RuntimeError(f"op {op.name!r} names no layer of the net ({', '.join(self.stage)})")
        return self.stage[layer]

    def install(self) -> None:
        for cls in self.classes:
            cls.run = self._timed(cls.run)

    def remove(self) -> None:
        for cls in self.classes:
            cls.run = cls.run.__wrapped__

    def _timed(self, run):
        @functools.wraps(run)
        def wrapper(op, *args, **kwargs):
            start = time.perf_counter()
            try:
                return run(op, *args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                with self.lock:  # several workers' steps end on several threads
                    self.spent[self.stage_of(op)] += elapsed
        return wrapper


def time_tree(tree: Path, modes: list[str], batches: list[int], threads: int, seconds: float) -> dict:
    """In this process: the engine of the checkout at `tree` on the face CNN, every mode and batch
    size timed. Returns {"mode/batch": {"pass": [s, ...], "stages": {stage: [s, ...]}}}, seconds
    per image, one entry per timed pass: the stages' from passes with every op timed, the whole
    pass's from as many seconds of passes without (timing the ops costs about a microsecond a
    call). Must run before anything imports `tracker`."""
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
    stage_names = list(dict.fromkeys(stage.values()))  # in the net's order
    timer = OpTimer(ops, stage)
    (input_shape,) = netdef.inputs.values()
    x_all = np.random.default_rng(0).standard_normal((max(batches), *input_shape[1:])).astype(np.float32)

    def run_passes(net, x) -> list[tuple[float, dict[str, float]]]:
        """Passes of x for `seconds` (at least MIN_PASSES); per pass, its seconds per image and
        each stage's by the timer (0 while it is not installed)."""
        measured: list[tuple[float, dict[str, float]]] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or len(measured) < MIN_PASSES:
            timer.spent.clear()
            start = time.perf_counter()
            net.forward(x, ["prob"])
            n = x.shape[0]
            measured.append(((time.perf_counter() - start) / n, {name: timer.spent[name] / n for name in stage_names}))
        return measured

    results = {}
    for mode in modes:
        net = Net(netdef, np.float32, mode, threads=threads)
        for batch in batches:
            x = np.ascontiguousarray(x_all[:batch])
            run_passes(net, x)  # warm-up
            whole = [per_image for per_image, _ in run_passes(net, x)]
            timer.install()
            try:
                timed = [per_stage for _, per_stage in run_passes(net, x)]
            finally:
                timer.remove()
            results[f"{mode}/{batch}"] = {"pass": whole, "stages": {name: [p[name] for p in timed] for name in stage_names}}
    return results


@contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """A temporary git worktree of `commit`, detached, removed on leaving, however that happens
    (`usage_error` if `commit` is not a commit of this repository)."""
    check = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        usage_error(f"--before {commit!r} is not a commit of {REPO}; expected a commit id or ref, e.g. {ENGINE_BEFORE_ISSUE_16} "
                    "(in a shallow clone, `git fetch --unshallow` first)")
    sha = check.stdout.strip()
    with tempfile.TemporaryDirectory(prefix="engine-since-") as tmp:
        tree = Path(tmp) / "tree"
        try:
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(tree), sha], check=True)
            yield tree
        finally:  # --force: the tree may be half checked out; prune: or not there at all
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)
            subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], capture_output=True)


def run_child(tree: Path, commit: str, args) -> dict:
    """`time_tree` of `tree` (a checkout of `commit`) in a fresh process (this script with --child),
    its result."""
    cmd = [sys.executable, __file__, "--child", str(tree), "--modes", args.modes, "--batches", args.batches,
           "--threads", str(args.threads), "--seconds", str(args.seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit status {proc.returncode}"
        raise SystemExit(f"engine_since: timing the engine of {commit} failed: {last}")
    return json.loads(proc.stdout.splitlines()[-1])


def median_ms(results: list[dict], key: str, name: str) -> list[float]:
    """Per round, the median ms per image of stage `name` ("pass": the whole pass) of mode/batch
    `key` (both commits time the same stages: they come from this checkout's prototxt)."""
    def passes(result: dict) -> list[float]:
        return result[key]["pass"] if name == "pass" else result[key]["stages"][name]
    return [1000 * statistics.median(passes(result)) for result in results]


def report(rounds: dict[str, list[dict]], before: str) -> list[str]:
    """The printed table, from each commit's per-round results (see the module docstring)."""
    lines = []
    for key, first in rounds["after"][0].items():
        mode, batch = key.split("/")
        lines.append(f"{mode} batch {batch}: ms per image, range over {len(rounds['after'])} rounds ({before} -> this checkout)")
        for name in [*first["stages"], "pass"]:
            b, a = median_ms(rounds["before"], key, name), median_ms(rounds["after"], key, name)
            ratio = statistics.median(x / y for x, y in zip(a, b))
            label = "whole pass (wall)" if name == "pass" else name
            lines.append(f"  {label:18s} {min(b):7.3f}-{max(b):7.3f}  ->  {min(a):7.3f}-{max(a):7.3f}   x{ratio:.2f}")
    return lines


def usage_error(message: str) -> NoReturn:
    print(f"engine_since: {message}", file=sys.stderr)
    sys.exit(2)


class OneLineErrors(argparse.ArgumentParser):
    """argparse's errors as one line (`usage_error`), not the usage block and the error."""

    def error(self, message: str) -> NoReturn:
        usage_error(message)


def positive(kind):
    """An argparse type: `kind` (int or float) of the text, finite and above 0."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'a whole number' if kind is int else 'a number'}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
        return value
    return parse


def exit_on_signal(signum, frame) -> NoReturn:
    """SIGTERM or SIGHUP as an exit, so that the worktree is removed on the way out."""
    sys.exit(128 + signum)


def main() -> None:
    ap = OneLineErrors(description=__doc__.splitlines()[0])
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
    if args.child:  # --batches as the parent checked it (below): a child's tree may not have batch_list
        batches = [int(b) for b in args.batches.split(",")]
        print(json.dumps(time_tree(Path(args.child), modes, batches, args.threads, args.seconds)))
        return
    # this checkout's argument type and bound on OpenBLAS's idle threads, the latter inherited by
    # both commits' processes alike (imported here: a --child process must import `tracker` from its own tree)
    sys.path.insert(0, str(REPO))
    from tracker.arguments import batch_list
    from tracker.blas_idle import bound_idle_spin
    try:
        batch_list(args.batches)
    except argparse.ArgumentTypeError as e:
        usage_error(f"argument --batches: {e}")
    bound_idle_spin()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, exit_on_signal)
    rounds: dict[str, list[dict]] = {"before": [], "after": []}
    with worktree(args.before) as tree:
        checkouts = {"before": (tree, args.before), "after": (REPO, "this checkout")}
        for r in range(args.rounds):
            for which in ("before", "after") if r % 2 == 0 else ("after", "before"):
                print(f"round {r + 1}: {which}", file=sys.stderr, flush=True)
                rounds[which].append(run_child(*checkouts[which], args))
    print("\n".join(report(rounds, args.before)))


if __name__ == "__main__":
    main()
