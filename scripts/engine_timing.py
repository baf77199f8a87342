"""Per-image forward time of the Caffe engine's two modes on the face CNN, layer by layer if asked
(a tool for tuning the engine; the official figures come from `tracker --benchmark`).

    .venv/bin/python scripts/engine_timing.py [--batches 1,8,256] [--seconds 1.5] [--modes caffe,dl]
                                              [--threads N] [--workspace-mb 64] [--layers] [--gemms]
                                              [--elementwise] [--against onnxruntime] [--scaling]
                                              [--phases SECONDS] [--idle-cpu]

Prints, per mode and batch size, the median per-image milliseconds over repeated forward passes
(at least 3 passes, at most 100, for about --seconds each) and the process's peak RSS so far
(run one mode per process to read each mode's own peak). Without --threads the engine picks
1 core or all cores per batch size by timing its own passes, as the backends do.

--layers (with --threads) adds, per mode and batch size, each step's median milliseconds per
image (a step is a layer, or a layer with its ReLU fused) and, for steps that run GEMMs, the
time of those GEMMs alone: the same matrix products on arrays of the same shapes in the same
orientation, on as many BLAS threads as the engine gives them, so that the rest of the step
(im2col, bias, ReLU, Python) is the difference. Then, from a second run in which every numpy
call of the engine's operators is timed (`NumpyCalls`), each step's numpy calls per image and
their milliseconds per image by kind of work: GEMMs (in the pass, on the columns it just wrote),
copies (im2col, layout), element-wise (bias, ReLU, pooling, softmax), other (allocations, the
pooling's sort of its axes by stride); and outside numpy, the rest of the step's time: its
Python and the views it makes. With several worker threads (several images) a step's time is
summed over the workers that ran it.

--elementwise first times what the engine's element-wise and chunking choices rest on: the ReLU of
conv1's output at batch 8 as np.maximum(x, 0) and as tracker.model.layers.relu; conv2's bias
added over rows of 48 and of 36 x 48 floats; fc1's GEMM on one thread for 1, 2, 4 and 8 images,
its weights as Caffe stores them and as the "dl" mode does; and fc1 of one image from a cold
cache (32 MB rewritten between calls), on one and two threads, on the (K, N) weights and on
Caffe's (N, K) rows (which the "dl" mode reads for one image).

--against BACKEND (e.g. onnxruntime) times that backend on the same batches, in 5 alternating
rounds with the engine (each of the two for about twice --seconds in all), and prints the engine's
ratio to it: on a shared host whose speed drifts, separate runs cannot give that ratio.

--scaling first times what a second core gains the "dl" mode at batch 8 (one chunk of 4 images
per worker), and where the rest is lost: one worker alone (a Net on one core running 4 images),
the engine's two workers (batch 8 on two cores), two threads each running its own one-core Net on
4 images at once (the same work without the engine's sharing), and two processes doing so (the
same again without sharing the Python interpreter's lock). Each is timed for --seconds, in
alternating rounds, and printed as throughput against one worker alone (2.00x: no loss).

--phases SECONDS first watches, for SECONDS, what decides the speed of OpenBLAS's two threads on
this host: in rounds, the cost of reading data that the other core has just written (median ns
per 64-byte line: a process forked once, pinned to one CPU and asleep between rounds, writes
PROBE_KB of shared memory, this process on another CPU copies it; beside it, the same copy of
data this process wrote itself), then the "caffe" mode at batch 8 on two BLAS threads and on
one, and the "dl" mode at batch 8 on its two workers (about --seconds / 2 each); one line per
round. On the AMD EPYC VM of the README, the read cost and the two-thread pass moved together:
while the host ran the VM's two cores far apart (the other core's data 1.8-2.8x as slow to read
as its own), the "caffe" pass on two threads took twice its time. Needs two CPUs.

--idle-cpu first measures what OpenBLAS's idle threads cost between frames (see tracker.blas_idle):
per mode, IDLE_PASSES batch-1 forward passes IDLE_GAP_S apart on every usable core, and the
seconds spent in them against the process CPU time over them. This script, like the `tracker`
command, bounds OpenBLAS's idle polling first unless OPENBLAS_THREAD_TIMEOUT is set; run it with
OPENBLAS_THREAD_TIMEOUT=28 for OpenBLAS's own default.

--gemms first times the GEMM of every convolution of the face CNN in both orientations
(`tracker.model.ops`: channel-major (O, K) @ (K, P), pixel-major (P, K) @ (K, O)), one
thread, at 1 and 8 images, and the face CNN's conv3 pixel-major GEMM before and after
`warm_blas` (see tracker.model.engine.parallel: only meaningful as the process's first BLAS use,
which it is here), and two threads' throughput on it with one and with two warm buffers.
"""

from __future__ import annotations

import argparse
import math
import mmap
import os
import resource
import signal
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracker.blas_idle import bound_idle_spin  # noqa: E402

bound_idle_spin()  # before numpy loads OpenBLAS, as the `tracker` command does

import numpy as np  # noqa: E402

from tracker.arguments import (  # noqa: E402
    ArgumentParser,
    batch_list,
    comma_names,
    float_between,
    positive_float,
    positive_int,
    words,
)
from tracker.backends import REGISTRY, create_backend  # noqa: E402
from tracker.bench.interleave import time_interleaved  # noqa: E402
from tracker.errors import TrackerError  # noqa: E402
from tracker.machine import cores  # noqa: E402
from tracker.model import cache_aligned  # noqa: E402
from tracker.model import layers as L  # noqa: E402
from tracker.model import ops as O  # noqa: E402
from tracker.model import shapes as S  # noqa: E402
from tracker.model.caffe_io import load_net  # noqa: E402
from tracker.model.engine import MODES, Net  # noqa: E402
from tracker.model.engine.parallel import blas_threads, thread_plan, warm_blas  # noqa: E402
from tracker.model.engine.schedule import label  # noqa: E402
from tracker.model.spec import default_model  # noqa: E402


def median_ms(fn, seconds: float, before=None) -> float:
    """Median wall milliseconds of fn() over repeated calls (one untimed call first; at least 3
    timed calls, at most 100, for about `seconds`); before(), if given, runs untimed before each
    timed call."""
    fn()
    times: list[float] = []
    t_end = time.perf_counter() + seconds
    while (time.perf_counter() < t_end or len(times) < 3) and len(times) < 100:
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times))


AGAINST_ROUNDS = 5  # --against: rounds over the engine and the other backend
MAX_WORKSPACE_MB = 4096  # --workspace-mb: a bound on what a typo may ask the engine to allocate


def gemm_shapes(op: O.Op, shapes: S.LayerShapes, mode: str, blas: int) -> list[tuple[tuple[int, int], tuple[int, int], str]]:
    """The GEMMs one run of `op` makes for a batch of `shapes` with the BLAS on `blas` threads:
    ((rows, inner), (inner, cols), orientation) for each product, as ops.py makes them (a stack
    of products: ((stack, rows, inner), ...)); [] for an op without GEMMs."""
    n = shapes.bottoms[0][0]
    if isinstance(op, O.PooledConvolution):
        rows = op.rows_per_band(blas)
        bands = n * -(-op.out_hw[0] // rows)
        return [(op.weight.shape, (op.weight.shape[1], rows * op.out_hw[1]), "channel-major")] * bands
    if isinstance(op, O.Convolution):
        o_g, pixels = op.out_c // op.group, math.prod(op.out_hw)
        if mode == "caffe":  # with the bias as one more column of weights, if it is folded in
            k = op.k_g if op.weight_and_bias is None else op.k_g + 1
            return [((o_g, k), (k, pixels), "channel-major")] * (op.group * n)
        path = op.dl_path(blas)
        if path == "1x1":
            return [((o_g, op.k_g), (op.k_g, n * pixels), "channel-major")] * op.group
        if path == "rows":  # one GEMM per output row, stacked
            return [((*op.out_hw, op.k_g), (op.k_g, op.out_c), "pixel-major by rows")] * n
        if path == "kernel rows":  # one GEMM per group of kernel rows
            run = op.kernel[1] * op.in_c
            depths = [(b - a) * run for a, b in op.kernel_row_groups()]
            return [((pixels, k), (k, op.out_c), "pixel-major by kernel rows") for k in depths] * n
        rows = op.rows_per_band(blas)
        bands = n * -(-op.out_hw[0] // rows)
        if op.pixel_major:
            return [((rows * op.out_hw[1], op.k_g), (op.k_g, op.out_c), "pixel-major")] * bands
        return [((o_g, op.k_g), (op.k_g, rows * op.out_hw[1]), "channel-major")] * (bands * op.group)
    if isinstance(op, O.InnerProduct):
        m, k = math.prod(shapes.bottoms[0][: op.axis]), math.prod(shapes.bottoms[0][op.axis:])
        n_out = op.weight.shape[1 if op.transpose else 0]
        rows = not op.transpose or (op.weight_rows is not None and m == 1)  # (N, K) weights read transposed
        return [((m, k), (k, n_out), "x @ W.T" if rows else "x @ W")]
    return []


def time_gemms(gemms, seconds: float, blas: int = 1) -> float:
    """Milliseconds of running these products once each, the BLAS on `blas` threads, on random
    float32 operands on cache lines, as the engine's weights and workspace are
    (`tracker.model.cache_aligned`)."""
    rng = np.random.default_rng(0)
    operands = {}
    for a_shape, b_shape, how in gemms:
        if (a_shape, b_shape) not in operands:
            a = cache_aligned.copy(rng.standard_normal(a_shape, dtype=np.float32))
            # "x @ W.T": an InnerProduct's (N, K) weights read transposed, as ops.py reads them
            b = cache_aligned.copy(rng.standard_normal(b_shape[::-1] if how == "x @ W.T" else b_shape, dtype=np.float32))
            operands[(a_shape, b_shape)] = (a, b.T if how == "x @ W.T" else b, cache_aligned.empty((*a_shape[:-1], b_shape[1]), np.float32))

    def run() -> None:
        for a_shape, b_shape, _ in gemms:
            a, b, out = operands[(a_shape, b_shape)]
            np.matmul(a, b, out=out)

    with blas_threads(blas):
        return median_ms(run, seconds)


# numpy functions by the kind of work --layers files their calls under; ufuncs not named here are
# "element-wise", any other function "other" (allocations, and the pooling's sort of its axes by stride)
WORK_KINDS = {"matmul": "gemm", "dot": "gemm", "copyto": "copies", "concatenate": "copies",
              "ascontiguousarray": "copies", "max": "element-wise", "min": "element-wise", "sum": "element-wise"}
KIND_COLUMNS = ("gemm", "copies", "element-wise", "other")


class NumpyCalls:
    """While active (a context manager), times every call that `tracker.model.ops` and
    `tracker.model.layers` make to a numpy function, ufuncs included, by step and kind of work
    (WORK_KINDS): those modules' name `np` is bound to a stand-in that wraps each function in a
    timer. Each call is timed around the real call, so the wrapper's own cost is left out of it;
    the thread's current step is `current.step` (set by whoever runs the steps). Not seen, so
    counted outside numpy: array operators and methods (`a += b`, `a.sum()`; the face CNN's paths
    make their arithmetic numpy calls, see tracker.model.ops), a ufunc's methods
    (`np.multiply.outer`), fills by slice assignment (the "caffe" column buffer's row of ones,
    once per batch) and views (`as_strided`)."""

    MODULES = (O, L)

    def __init__(self) -> None:
        self.current = threading.local()
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)  # (step, kind) -> seconds
        self.calls: dict[str, int] = defaultdict(int)  # step -> calls
        self._lock = threading.Lock()
        self._wrappers: dict[str, object] = {}
        self._replaced: list = []

    def __enter__(self) -> NumpyCalls:
        self._replaced = [module.np for module in self.MODULES]
        for module in self.MODULES:
            module.np = _TimedNumpy(self)
        return self

    def __exit__(self, *exc) -> None:
        for module, replaced in zip(self.MODULES, self._replaced):
            module.np = replaced

    def take(self) -> tuple[dict[tuple[str, str], float], dict[str, int]]:
        """The seconds and calls recorded since the last take, and start again from none."""
        with self._lock:
            taken = dict(self.seconds), dict(self.calls)
            self.seconds.clear()
            self.calls.clear()
        return taken

    def wrapper(self, name: str, function):
        """A timed stand-in for numpy's `function`, made once per name."""
        if name not in self._wrappers:
            kind = WORK_KINDS.get(name, "element-wise" if isinstance(function, np.ufunc) else "other")
            self._wrappers[name] = _TimedCall(self, function, kind)
        return self._wrappers[name]

    def record(self, kind: str, seconds: float) -> None:
        step = getattr(self.current, "step", "(no step)")
        with self._lock:
            self.seconds[(step, kind)] += seconds
            self.calls[step] += 1

    @staticmethod
    def wrapping_cost(calls: int = 2000) -> float:
        """Seconds per call that timing a call adds outside the time recorded for it (looking the
        function up on the stand-in, the wrapper, recording): the median of 5 runs of `calls`
        calls of a ufunc on one float, on a timer of its own, by one thread (with several, the
        calls also wait for the interpreter's lock and the timer's, which this leaves in)."""
        timer, one = NumpyCalls(), np.zeros(1, np.float32)
        timed_numpy = _TimedNumpy(timer)
        costs = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(calls):
                timed_numpy.add(one, one, out=one)
            wall = time.perf_counter() - t
            costs.append((wall - sum(timer.take()[0].values())) / calls)
        return float(np.median(costs))


class _TimedNumpy:
    """numpy, with its functions (not its types, modules or constants) wrapped by `NumpyCalls`."""

    def __init__(self, timer: NumpyCalls) -> None:
        self._timer = timer

    def __getattr__(self, name: str):
        value = getattr(np, name)
        if callable(value) and not isinstance(value, type):
            return self._timer.wrapper(name, value)
        return value


class _TimedCall:
    """One numpy function, timed on every call; its attributes (a ufunc's `outer`) are the real
    function's, untimed."""

    def __init__(self, timer: NumpyCalls, function, kind: str) -> None:
        self._timer, self._function, self._kind = timer, function, kind

    def __call__(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return self._function(*args, **kwargs)
        finally:
            self._timer.record(self._kind, time.perf_counter() - t)

    def __getattr__(self, name: str):
        return getattr(self._function, name)


def layer_breakdown(net: Net, netdef, x: np.ndarray, seconds: float, cores: int) -> list[str]:
    """Per step of `net` running on `cores` cores, ms per image: one line with its median time
    and its GEMMs' time alone, on as many BLAS threads as the engine gives them; then, from a
    second run with its numpy calls timed (`NumpyCalls`), a block with the step's numpy calls
    per image, their time by kind of work and outside numpy: in each pass of that run, the
    step's time less its numpy calls' and less what timing them cost (`wrapping_cost` per call),
    so its Python and the views it makes (with several workers, also their waits for the
    interpreter's lock). Each column is a median over the passes.

    Times steps by wrapping each step's op.run (a private part of Net: this is a tuning tool).
    """
    numpy_calls = NumpyCalls()
    step_times = time_steps(net, x, seconds, numpy_calls)
    wrapping = NumpyCalls.wrapping_cost()
    with numpy_calls:
        timed_calls = time_steps(net, x, seconds, numpy_calls)
    n = x.shape[0]
    layer_shapes = dict(zip((layer.name for layer in netdef.layers), S.infer_layer_shapes(netdef, n)))
    lines, kinds = [], [f"    {'step':<11} {'calls':>6} " + " ".join(f"{k:>12}" for k in KIND_COLUMNS) + f" {'outside numpy':>14}"]
    for step in net._plan.steps:
        op = step.op
        ms = 1000 * median_of(step_times, (op.name, "time")) / n
        blas = cores if net.mode == "caffe" else thread_plan(n, cores, False)[1]
        gemms = gemm_shapes(op, layer_shapes[op.layer_names[0]], net.mode, blas)
        gemm = f"  gemm {time_gemms(gemms, seconds / 4, blas) / n:7.3f} ({gemms[0][2]})" if gemms else ""
        lines.append(f"    {op.name:<11} {label(op):<42} {ms:7.3f}{gemm}")
        for one in timed_calls:
            one[(op.name, "outside")] = (one.get((op.name, "time"), 0.0) - one.get((op.name, "calls"), 0) * wrapping
                                         - sum(one.get((op.name, k), 0.0) for k in KIND_COLUMNS))
        calls = median_of(timed_calls, (op.name, "calls")) / n
        spent = [1000 * median_of(timed_calls, (op.name, k)) / n for k in (*KIND_COLUMNS, "outside")]
        kinds.append(f"    {op.name:<11} {calls:6.2f} " + " ".join(f"{v:12.3f}" for v in spent[:-1]) + f" {spent[-1]:14.3f}")
    return lines + [f"  {net.mode} batch {n}: numpy calls per image and ms per image by kind of work "
                    f"(a second run, each call's timing cost of {1e6 * wrapping:.2f} us taken out)", *kinds]


def median_of(passes: list[dict[tuple[str, str], float]], key: tuple[str, str]) -> float:
    """The median over passes of one figure of `time_steps` (0 in a pass that lacks it)."""
    return float(np.median([one.get(key, 0.0) for one in passes]))


def time_steps(net: Net, x: np.ndarray, seconds: float, numpy_calls: NumpyCalls) -> list[dict[tuple[str, str], float]]:
    """Forward passes of x for about `seconds`, each step's op.run wrapped to time it and to name
    the step to `numpy_calls` (which records only while active). Per timed pass, its figures for
    the batch by (step name, what): "time" the step's seconds, a kind of work (KIND_COLUMNS) its
    numpy calls' seconds of that kind, "calls" how many it made."""
    passes: list[dict[tuple[str, str], float]] = []
    step_times: dict[tuple[str, str], float] = defaultdict(float)
    lock = threading.Lock()  # with several workers, steps end on several threads
    originals = []
    for step in net._plan.steps:
        op = step.op
        originals.append((op, op.run))

        def timed(ins, outs, scratch, threads=1, _run=op.run, _name=op.name):
            numpy_calls.current.step = _name
            t = time.perf_counter()
            try:
                return _run(ins, outs, scratch, threads)
            finally:
                took = time.perf_counter() - t
                with lock:
                    step_times[(_name, "time")] += took

        op.run = timed

    def forward() -> None:
        step_times.clear()
        numpy_calls.take()
        net.forward(x, ["prob", "fc1"])
        seconds_by_kind, calls = numpy_calls.take()
        passes.append({**step_times, **seconds_by_kind, **{(name, "calls"): count for name, count in calls.items()}})

    try:
        median_ms(forward, seconds)
    finally:
        for op, run in originals:
            op.run = run
    return passes[1:]  # the first was median_ms's untimed warm-up


def concurrent_gain(a_shape: tuple[int, int], b_shape: tuple[int, int], calls: int = 200) -> float:
    """Throughput of two threads each making `calls` single-threaded (a_shape) @ (b_shape)
    products at once, against one thread making them alone."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape, dtype=np.float32), rng.standard_normal(b_shape, dtype=np.float32)

    def calls_alone() -> None:
        out = np.empty((a_shape[0], b_shape[1]), np.float32)
        for _ in range(calls):
            np.matmul(a, b, out=out)

    with blas_threads(1):
        t = time.perf_counter()
        calls_alone()
        alone = time.perf_counter() - t
        pair = [threading.Thread(target=calls_alone) for _ in range(2)]
        t = time.perf_counter()
        for thread in pair:
            thread.start()
        for thread in pair:
            thread.join()
        return 2 * alone / (time.perf_counter() - t)


def gemm_orientations(netdef, seconds: float) -> None:
    """Each convolution's GEMM in both orientations, one thread, 1 and 8 images (see --gemms)."""
    convs = [O.Convolution(layer, np.float32, "dl", ls) for layer, ls in zip(netdef.layers, S.infer_layer_shapes(netdef, 1))
             if layer.type == "Convolution"]
    conv3 = next(op for op in convs if op.name == "conv3")
    pm = [((math.prod(conv3.out_hw), conv3.k_g), (conv3.k_g, conv3.out_c), "pixel-major")]
    before = time_gemms(pm, seconds)
    warm_blas(1)
    after = time_gemms(pm, seconds)
    print(f"conv3 pixel-major GEMM {pm[0][0]} @ {pm[0][1]}: {before:.3f} ms before warm_blas, {after:.3f} after")
    one_buffer = concurrent_gain(pm[0][0], pm[0][1])
    warm_blas(2)
    print(f"  two threads at once, throughput against one: {one_buffer:.2f}x with one warm buffer, "
          f"{concurrent_gain(pm[0][0], pm[0][1]):.2f}x after warm_blas(2)")
    for op in convs:
        for n in (1, 8):
            p = n * math.prod(op.out_hw)
            flops = 2 * op.out_c * op.k_g * p
            cells = []
            for name, a, b in (("channel-major", (op.out_c, op.k_g), (op.k_g, p)), ("pixel-major", (p, op.k_g), (op.k_g, op.out_c))):
                ms = time_gemms([(a, b, name)], seconds)
                cells.append(f"{name} {ms / n:.3f} ms/image ({flops / ms / 1e6:.1f} GFLOP/s)")
            print(f"{op.name} x{n}: " + ", ".join(cells), flush=True)


def elementwise_costs(seconds: float) -> None:
    """The costs behind the element-wise and chunking choices of tracker.model (see --elementwise),
    on random float32 of the face CNN's shapes, one thread."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16, 82, 82), dtype=np.float32)  # conv1's output, batch 8
    scalar = median_ms(lambda: np.maximum(x, 0, out=x), seconds)
    zeros = median_ms(lambda: L.relu(x, out=x), seconds)
    print(f"ReLU of conv1's output at batch 8 {x.shape}: np.maximum(x, 0) {scalar:.3f} ms, layers.relu {zeros:.3f} ms")
    r = rng.standard_normal((36 * 36, 48), dtype=np.float32)  # conv2's pixel-major output, one image
    bias = rng.standard_normal(48, dtype=np.float32)
    rows, run = r.reshape(36, 36 * 48), np.tile(bias, 36)
    narrow = median_ms(lambda: np.add(r, bias, out=r), seconds)
    wide = median_ms(lambda: np.add(rows, run, out=rows), seconds)
    print(f"conv2's bias, one image: over rows of 48 {1000 * narrow:.1f} µs, over rows of 36 x 48 {1000 * wide:.1f} µs")
    w = rng.standard_normal((128, 6144), dtype=np.float32)  # fc1's weights as Caffe stores them
    w_kn = np.ascontiguousarray(w.T)  # as the "dl" engine stores them
    warm_blas(1)
    with blas_threads(1):
        for name, right in (("Caffe's (N, K) read transposed", w.T), ('"dl"\'s contiguous (K, N)', w_kn)):
            cells = []
            for m in (1, 2, 4, 8):
                a, out = rng.standard_normal((m, 6144), dtype=np.float32), np.empty((m, 128), np.float32)
                cells.append(f"M={m} {median_ms(lambda a=a, out=out, right=right: np.matmul(a, right, out=out), seconds):.3f} ms")
            print(f"fc1 (M, 6144) @ (6144, 128), weights {name}, one thread: " + ", ".join(cells), flush=True)
    # One image, as inside a forward pass: the weights have left the cache since the last call.
    evict = np.ones(8 << 20, np.float32)  # 32 MB, more than this machine's caches keep for one core
    a, out = rng.standard_normal((1, 6144), dtype=np.float32), np.empty((1, 128), np.float32)
    for name, right in (('"dl"\'s (K, N)', w_kn), ("Caffe's (N, K) rows", w.T)):
        cells = []
        for threads in (1, 2):
            with blas_threads(threads):
                ms = median_ms(lambda right=right: np.matmul(a, right, out=out), seconds, before=lambda: np.add(evict, 1.0, out=evict))
                cells.append(f"{threads} thread(s) {ms:.3f} ms")
        print(f"fc1 of one image from a cold cache, weights {name}: " + ", ".join(cells), flush=True)


SCALING_ROUNDS = 3  # --scaling: rounds over the four ways of running


def _one_core_loop(netdef, x: np.ndarray, seconds: float, start, results) -> None:
    """Run a one-core "dl" Net on x, repeatedly, from `start` (a barrier) for `seconds`; put its
    median seconds per image into `results` (a queue or a list)."""
    net = Net(netdef, np.float32, "dl", threads=1)
    net.forward(x, ["prob", "fc1"])
    start.wait()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t = time.perf_counter()
        net.forward(x, ["prob", "fc1"])
        times.append(time.perf_counter() - t)
    results.put(float(np.median(times)) / x.shape[0])


def _two_at_once(netdef, x: np.ndarray, seconds: float, processes: bool) -> float:
    """Median seconds per image of each of two one-core Nets running x at once, averaged over
    the two; in two threads of this process or in two processes."""
    import multiprocessing
    import queue

    if processes:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no lock shared with this one
        start, results = ctx.Barrier(2), ctx.Queue()
        workers = [ctx.Process(target=_one_core_loop, args=(netdef, x, seconds, start, results)) for _ in range(2)]
    else:
        start, results = threading.Barrier(2), queue.Queue()
        workers = [threading.Thread(target=_one_core_loop, args=(netdef, x, seconds, start, results)) for _ in range(2)]
    for worker in workers:
        worker.start()
    each = [results.get(timeout=60 + 10 * seconds) for _ in workers]
    for worker in workers:
        worker.join()
    return sum(each) / 2


def two_core_scaling(netdef, seconds: float) -> None:
    """What a second core gains the "dl" mode at batch 8, and where the rest goes (see --scaling)."""
    x8 = np.random.default_rng(0).standard_normal((8, 1, 88, 88)).astype(np.float32)
    engine = Net(netdef, np.float32, "dl", threads=2)
    chunk = engine.chunk_size(8)
    x = np.ascontiguousarray(x8[:chunk])
    alone = Net(netdef, np.float32, "dl", threads=1)
    ways = {
        "one worker alone": lambda: median_ms(lambda: alone.forward(x, ["prob", "fc1"]), seconds) / 1000 / chunk,
        "the engine's two workers": lambda: median_ms(lambda: engine.forward(x8, ["prob", "fc1"]), seconds) / 1000 / 8,
        "two threads, a Net each": lambda: _two_at_once(netdef, x, seconds, processes=False) / 2,
        "two processes, a Net each": lambda: _two_at_once(netdef, x, seconds, processes=True) / 2,
    }
    per_image: dict[str, list[float]] = defaultdict(list)
    names = list(ways)
    for r in range(SCALING_ROUNDS):
        for name in names[r:] + names[:r]:
            per_image[name].append(ways[name]())
    base = per_image["one worker alone"]
    print(f"two cores at batch 8 (chunks of {chunk}), throughput against one worker alone, per round "
          f"(ms per image of the whole: one worker alone {', '.join(f'{1000 * t:.3f}' for t in base)}):")
    for name in names[1:]:
        print(f"  {name}: " + ", ".join(f"{b / t:.2f}x" for b, t in zip(base, per_image[name])), flush=True)


PROBE_KB = 256  # --phases: the data one core writes and the other reads (within either core's L2)
PROBE_ROUNDS = 300
PROBE_WAIT_S = 10.0  # the longest wait for the other side's turn, either way (it takes microseconds)


class CrossCoreProbe:
    """How long CPU cpus[1] takes to copy PROBE_KB of float32 that CPU cpus[0] has just written
    (its lines come from the other core's cache, or through memory), against copying data it has
    just written itself: `read_ns()`, one probe of PROBE_ROUNDS turns.

    One writer process, forked here and pinned to cpus[0], serves every probe. Between probes it
    sleeps on a pipe, so it takes no CPU from the passes timed between them, and it leaves when
    the pipe closes: at `close()`, or when this process dies. Forking once also leaves OpenBLAS's
    threads alone during the watch: a fork stops them (OpenBLAS's atfork handler) and the next GEMM
    starts them again. Within a probe the two processes take turns through a counter in shared
    memory (timing only: the values are not read). Use it as a context manager."""

    def __init__(self, cpus: tuple[int, int]) -> None:
        self.cpus = cpus
        shared = mmap.mmap(-1, mmap.PAGESIZE + PROBE_KB * 1024)
        self.turn = np.frombuffer(shared, np.int64, 1, 0)  # 2i - 1: the writer's turn in round i; 2i: the reader's
        self.data = np.frombuffer(shared, np.float32, PROBE_KB * 256, mmap.PAGESIZE)
        self.copy = np.empty_like(self.data)
        wake, self.go = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.go)
            self._serve(wake)
        os.close(wake)

    def _serve(self, wake: int) -> None:
        """The writer: a probe per byte on `wake`, until it reads the end of the pipe."""
        try:
            os.sched_setaffinity(0, {self.cpus[0]})
            while os.read(wake, 1):
                for i in range(1, PROBE_ROUNDS + 1):
                    if not self._wait_for_turn(2 * i - 1):  # the reader was killed mid-probe: leave rather than spin on
                        os._exit(1)
                    self.data.fill(i)
                    self.turn[0] = 2 * i
        finally:
            os._exit(0)

    def _wait_for_turn(self, value: int) -> bool:
        """Spin until the shared counter reads `value`: True, or False after PROBE_WAIT_S (the
        other process is gone, or was never scheduled)."""
        deadline = time.monotonic() + PROBE_WAIT_S
        while self.turn[0] != value:
            if time.monotonic() > deadline:
                return False
        return True

    def read_ns(self) -> tuple[float, float]:
        """(the other core's data, this core's own): median ns per 64-byte line of one probe.
        Raises RuntimeError, with this process's CPU affinity as it was, if the writer is gone."""
        unanswered = f"--phases: the writer process on CPU {self.cpus[0]} did not answer"
        other: list[int] = []
        own: list[int] = []
        affinity = os.sched_getaffinity(0)
        self.turn[0] = 0
        try:
            os.write(self.go, b"\1")
            os.sched_setaffinity(0, {self.cpus[1]})
            for i in range(1, PROBE_ROUNDS + 1):
                self.turn[0] = 2 * i - 1
                if not self._wait_for_turn(2 * i):
                    raise RuntimeError(f"{unanswered} within {PROBE_WAIT_S:g} s")
                t = time.perf_counter_ns()
                np.copyto(self.copy, self.data)
                other.append(time.perf_counter_ns() - t)
                self.data.fill(-i)
                t = time.perf_counter_ns()
                np.copyto(self.copy, self.data)
                own.append(time.perf_counter_ns() - t)
        except BrokenPipeError:  # it had already left
            raise RuntimeError(f"{unanswered} (it has exited)") from None
        finally:
            os.sched_setaffinity(0, affinity)
        lines = PROBE_KB * 1024 / 64
        return float(np.median(other)) / lines, float(np.median(own)) / lines

    def close(self) -> None:
        """End the writer: asleep, it leaves at the pipe's end; interrupted mid-probe, it would
        spin for its turn until PROBE_WAIT_S, so it is killed."""
        os.close(self.go)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)

    def __enter__(self) -> CrossCoreProbe:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def watch_phases(netdef, total_seconds: float, seconds: float) -> None:
    """Rounds of a `CrossCoreProbe`, the "caffe" mode at batch 8 on 2 and 1 BLAS threads and the
    "dl" mode at batch 8 on 2 workers, for about total_seconds (see --phases)."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    with CrossCoreProbe((cpus[0], cpus[1])) as probe:  # its writer forked before the Nets start threads
        two, one = Net(netdef, np.float32, "caffe", threads=2), Net(netdef, np.float32, "caffe", threads=1)
        workers = Net(netdef, np.float32, "dl", threads=2)
        x = np.random.default_rng(0).standard_normal((8, 1, 88, 88)).astype(np.float32)
        print(f"phases: CPU {cpus[1]} reading {PROBE_KB} KB that CPU {cpus[0]} wrote, against its own writes (ns per "
              f"64-byte line); batch 8, ms per image: \"caffe\" on 2 and on 1 BLAS threads, \"dl\" on 2 workers:", flush=True)
        end = time.monotonic() + total_seconds
        while True:
            other, own = probe.read_ns()
            ms2 = median_ms(lambda: two.forward(x, ["prob", "fc1"]), seconds / 2) / 8
            ms1 = median_ms(lambda: one.forward(x, ["prob", "fc1"]), seconds / 2) / 8
            dl = median_ms(lambda: workers.forward(x, ["prob", "fc1"]), seconds / 2) / 8
            print(f"  {time.strftime('%H:%M:%S')} read {other:.2f} against {own:.2f} ns ({other / own:.1f}x); "
                  f"caffe {ms2:.3f} ms on 2 threads, {ms1:.3f} on 1 ({ms2 / ms1:.2f}x); dl {dl:.3f} on 2 workers", flush=True)
            if time.monotonic() >= end:
                break


IDLE_PASSES, IDLE_GAP_S = 20, 0.05  # --idle-cpu: a camera's pace, faster than the default poll ends


def idle_cpu(netdef) -> None:
    """--idle-cpu: per mode, IDLE_PASSES batch-1 passes IDLE_GAP_S apart on every usable core; the
    seconds in the passes and the process CPU seconds over the whole run."""
    threads = cores()
    x = np.random.default_rng(0).standard_normal((1, 1, 88, 88)).astype(np.float32)
    timeout = os.environ.get("OPENBLAS_THREAD_TIMEOUT", "unset (OpenBLAS's default, 28)")
    print(f"idle: OPENBLAS_THREAD_TIMEOUT {timeout}; {IDLE_PASSES} batch-1 passes {1000 * IDLE_GAP_S:.0f} ms apart "
          f"on {threads} BLAS threads:", flush=True)
    for mode in ("caffe", "dl"):
        net = Net(netdef, np.float32, mode, threads=threads)
        for _ in range(5):
            net.forward(x, ["prob"])
        time.sleep(0.5)  # the warm-up's polling over (on x86 at least) before the count starts
        busy, cpu = 0.0, time.process_time()
        for _ in range(IDLE_PASSES):
            start = time.perf_counter()
            net.forward(x, ["prob"])
            busy += time.perf_counter() - start
            time.sleep(IDLE_GAP_S)
        print(f"  {mode:5s} {busy:.3f} s in forward passes, {time.process_time() - cpu:.3f} s of process CPU time", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options (module docstring), every one checked before any timing (the first ones take
    minutes): a bad one raises InputError (one line, exit 2). `modes` is a list of MODES."""
    ap = ArgumentParser(prog="engine_timing.py", description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=batch_list, default=[1, 8, 256], help="comma list (default 1,8,256)")
    ap.add_argument("--seconds", type=positive_float, default=1.5)
    ap.add_argument("--modes", default="caffe,dl", help=f"comma list of {', '.join(MODES)}, or all (default caffe,dl)")
    ap.add_argument("--threads", type=positive_int, default=None)
    ap.add_argument("--workspace-mb", type=float_between(0, MAX_WORKSPACE_MB, above_low=True, what="a number of MB"),
                    default=64)
    ap.add_argument("--layers", action="store_true", help="also each step's time and its GEMMs' time (needs --threads)")
    ap.add_argument("--gemms", action="store_true", help="first, each convolution's GEMM in both orientations")
    ap.add_argument("--elementwise", action="store_true", help="first, the ReLU, bias and fc1 costs behind the engine's choices")
    ap.add_argument("--scaling", action="store_true", help="first, what a second core gains the dl mode at batch 8, and where the rest goes")
    ap.add_argument("--against", metavar="BACKEND", type=words("a backend name"),
                    help="also the engine's ratio to this backend (e.g. onnxruntime), the two timed in alternating rounds")
    ap.add_argument("--phases", type=float_between(0, what="a number of seconds"), metavar="SECONDS",
                    help="first, for SECONDS, rounds of the cost of reading another core's writes, the caffe mode on 2 and 1 "
                         "threads and the dl mode on 2 workers")
    ap.add_argument("--idle-cpu", action="store_true", help="first, the process CPU time of batch-1 passes at a camera's pace")
    a = ap.parse_args(argv)
    a.modes = comma_names(a.modes, MODES, "engine_timing.py: --modes", "engine mode")[0]
    if a.against is not None and a.against not in REGISTRY:
        ap.error(f"argument --against: unknown backend {a.against!r}; expected one of {', '.join(REGISTRY)}")
    if a.layers and a.threads is None:
        ap.error("--layers: needs --threads N (the GEMMs alone are timed on the threads the engine gives them)")
    if a.phases is not None and (usable := cores()) < 2:
        ap.error(f"--phases: needs two CPUs; this process may run on {usable}")
    return a


def main(argv: list[str] | None = None) -> int:
    try:
        run(parse_args(argv))
    except TrackerError as err:  # a bad option (exit 2), a backend that cannot run here: one line, no traceback
        print(str(err), file=sys.stderr)
        return err.exit_code
    return 0


def run(a: argparse.Namespace) -> None:
    spec = default_model()
    # made first: a backend that cannot run here is said before the minutes of the other timings
    other = create_backend(a.against, spec, threads=a.threads) if a.against else None
    netdef = load_net(spec.prototxt, spec.weights)
    if a.gemms:
        gemm_orientations(netdef, a.seconds / 2)
    if a.elementwise:
        elementwise_costs(a.seconds / 2)
    if a.scaling:
        two_core_scaling(netdef, a.seconds)
    if a.phases is not None:
        watch_phases(netdef, a.phases, a.seconds)
    if a.idle_cpu:
        idle_cpu(netdef)
    batches = a.batches
    x0 = np.random.default_rng(0).standard_normal((max(batches), 1, 88, 88)).astype(np.float32)
    for mode in a.modes:
        net = Net(netdef, np.float32, mode, threads=a.threads, workspace_bytes=int(a.workspace_mb * 2**20))
        cells, details = [], []
        for b in batches:
            x = np.ascontiguousarray(x0[:b])
            if other is None:
                ms = median_ms(lambda net=net, x=x: net.forward(x, ["prob", "fc1"]), a.seconds)
                against = ""
            else:
                timed = time_interleaved({"engine": lambda x, net=net: net.forward(x, ["prob", "fc1"]),
                                          a.against: other.infer}, x, 2 * a.seconds / AGAINST_ROUNDS, AGAINST_ROUNDS)
                ms, other_ms = 1000 * timed["engine"][0], 1000 * timed[a.against][0]
                against = f" against {a.against} {other_ms / b:.3f}ms = {ms / other_ms:.2f}x"
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            cells.append(f"{b}:{ms / b:.3f}ms(rss {rss:.0f}MB){against}")
            if a.layers:
                details += [f"  {mode} batch {b}: ms per image, by step", *layer_breakdown(net, netdef, x, a.seconds, a.threads)]
        print(f"{mode:6s} " + " ".join(cells), flush=True)
        for line in details:
            print(line)


if __name__ == "__main__":
    raise SystemExit(main())
