"""`Net`: a Caffe net ready to run forward in one of the engine's two modes (see the package
docstring): the checks, the choice of cores per batch, and the two forward paths."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import NamedTuple

import numpy as np

from tracker.errors import InputError, ModelError
from tracker.machine import cores
from tracker.model import ops as O
from tracker.model import shapes as S
from tracker.model.engine.parallel import HelperThreads, blas_threads, thread_plan, warm_blas
from tracker.model.engine.schedule import Step, describe, mixes_images, schedule
from tracker.model.engine.workspace import DEFAULT_WORKSPACE_BYTES, Workspace
from tracker.model.netdef import NetDef
from tracker.model.tuning import ThreadTuner, batch_class

MODES = ("caffe", "dl")
# With several workers, chunks are cut to about two per worker, but not below this many images
# (unless that leaves a worker idle): every chunk runs the fully connected layers once, and each
# run reads all their weights (OpenBLAS packs them per call). Single-threaded on the EPYC dev
# machine, the face CNN's fc1 ((M, 6144) @ (6144, 128), weights (K, N)) takes 0.15 ms for M = 2
# and 0.23 for M = 8 (`scripts/engine_timing.py --elementwise`); on 2 cores, alternating in one
# process, 4 or 2 as the floor ran batch 16 in chunks of 4 at 1.04x the time of chunks of 8, and
# 2 ran batch 8 in chunks of 2 at 1.13x the time of chunks of 4.
MIN_SHARED_CHUNK = 8


class Plan(NamedTuple):
    """A schedule of the Net's ops and the workspace its steps run in."""

    steps: tuple[Step, ...]
    input_final: bool  # no step writes the input blob
    hidden: frozenset[str]  # blobs whose Caffe values the steps never give (see schedule.py)
    workspace: Workspace


class Net:
    """A Caffe net ready to run forward (see the package docstring for the two modes).

    netdef: from `caffe_io.load_net` (weights included). dtype: float32 (the product) or float64
    (the reference: `Net(netdef, np.float64, "caffe")`). mode: "caffe" or "dl".
    workspace_bytes: the "dl" workspace cap, shared by the worker threads (a chunk holds at least
    one image even if one image needs more; "caffe" mode's workspace holds its whole batch).
    threads: cores to use (None: 1 or all the cores this process may use, chosen per batch-size
    class by timing the Net's own passes): OpenBLAS threads in "caffe" mode; in "dl" mode worker
    threads for several images and OpenBLAS threads for one. Not thread-safe: one forward at a
    time per Net; `close()` stops the "dl" worker threads.

    A "dl" forward that asks for a blob the schedule fuses away (the top of a convolution pooled
    as it is computed, or of one whose bias and ReLU its pooling applies) runs a second schedule
    that writes it, in a workspace of its own; the other schedule's workspace is released, so
    one is allocated at a time.
    """

    def __init__(self, netdef: NetDef, dtype=np.float32, mode: str = "caffe", *,
                 workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, threads: int | None = None):
        self.dtype = _check_settings(mode, dtype, threads, workspace_bytes)
        self.mode = mode
        self.threads = threads  # None: tuned per batch-size class between 1 core and all cores
        self._tuner = ThreadTuner((threads,) if threads else (1, cores()))
        self.workspace_bytes = int(workspace_bytes)
        self.name = netdef.name
        self.input_name, self.input_shape = _single_input(netdef)
        self._netdef = netdef
        self.ops = _operators(netdef, self.dtype, mode, _layer_shapes(netdef))
        self.blob_names: tuple[str, ...] = tuple(dict.fromkeys([self.input_name] + [t for op in self.ops for t in op.tops]))
        self._shape_cache: dict[int, dict[str, tuple[int, ...]]] = {}
        self._mixes_images = mixes_images(self.ops, self.blob_shapes(1), self.blob_shapes(2))
        self._plan = self._make_plan(())  # what every forward runs unless it reads a hidden blob
        self._unfused: Plan | None = None  # made on first need: the same ops, no blob hidden
        self._helpers = HelperThreads(self.name)  # "dl": the worker threads besides the caller
        if mode == "dl":
            warm_blas(max(self._tuner.arms))

    # ---------------------------------------------------------------- introspection

    def blob_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        """Shape of every blob for a batch of `batch` images (final shapes of in-place blobs)."""
        if batch not in self._shape_cache:
            if len(self._shape_cache) > 16:
                self._shape_cache.clear()
            self._shape_cache[batch] = S.infer_shapes(self._netdef, batch)
        return self._shape_cache[batch]

    def describe(self) -> list[str]:
        """The executed schedule, one line per step (fusions and layouts shown)."""
        return describe(self._plan.steps)

    def _make_plan(self, keep: Collection[str]) -> Plan:
        steps, input_final, hidden = schedule(self.ops, self.input_name, self.mode, keep)
        workspace = Workspace(self._netdef, steps, self.input_name, self.dtype, self.workspace_bytes)
        return Plan(steps, input_final, hidden, workspace)

    def _plan_for(self, names: Collection[str]) -> Plan:
        """The plan that writes every blob of `names`; the other plan's workspace is released."""
        if self._plan.hidden.isdisjoint(names):
            plan, other = self._plan, self._unfused
        else:
            if self._unfused is None:
                self._unfused = self._make_plan(self._plan.hidden)
            plan, other = self._unfused, self._plan
        if other is not None:
            other.workspace.release()
        return plan

    def chunk_size(self, n: int, cores: int | None = None, plan: Plan | None = None) -> int:
        """"dl": images per chunk for a batch of n on `cores` cores (default: the most this Net
        uses): what one worker's share of the workspace holds, and with several workers small
        enough that each gets about two chunks (chunks are claimed dynamically, so finer chunks
        balance the load) but no smaller than MIN_SHARED_CHUNK images unless each worker then
        gets one. A net that mixes images runs its batch as one chunk. plan: whose workspace
        (default: the schedule every forward runs unless it reads a hidden blob)."""
        workers = thread_plan(n, cores or max(self._tuner.arms), self._mixes_images)[0]
        workspace = (plan or self._plan).workspace
        chunk = n if self._mixes_images else workspace.images_per_chunk(n, workers)
        if workers == 1:
            return chunk
        two_each, one_each = -(-n // (2 * workers)), -(-n // workers)
        return min(chunk, max(two_each, min(one_each, MIN_SHARED_CHUNK)))

    @property
    def workspace_nbytes(self) -> int:
        """Bytes of workspace allocated now (all workers). "dl": bounded by workspace_bytes unless
        a single image needs more; "caffe": at most twice what its last batch needed
        (workspace_bytes does not apply: Caffe's blobs hold the whole batch)."""
        return sum(plan.workspace.nbytes for plan in (self._plan, self._unfused) if plan is not None)

    def close(self) -> None:
        """Stop the "dl" worker threads (the Net stays usable; they restart on demand)."""
        self._helpers.close()

    # ---------------------------------------------------------------- forward

    def forward(self, x: np.ndarray, outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """Run the net on x (N, *input_shape[1:]), N >= 1, float32 or float64 (computed in the Net's
        dtype); return {name: blob copy} for `outputs`.

        Raises InputError for an input of the wrong shape or dtype, or an unknown blob name.
        """
        x = self._check_input(x)
        names = list(dict.fromkeys(outputs))
        unknown = [n for n in names if n not in self.blob_names]
        if unknown:
            raise InputError(f"net {self.name!r}: no blob named {unknown[0]!r}; blobs are {', '.join(self.blob_names)}")
        key = batch_class(x.shape[0])
        cores = self._tuner.choose(key)
        start = time.perf_counter()
        if self.mode == "caffe":
            out = self._forward_caffe(x, names, cores)
        else:
            out = self._forward_dl(x, names, cores)
        self._tuner.record(key, cores, (time.perf_counter() - start) / x.shape[0])
        return out

    def _check_input(self, x) -> np.ndarray:
        want = ("N",) + self.input_shape[1:]
        if not isinstance(x, np.ndarray):
            raise InputError(f"input {self.input_name!r}: expected a numpy array of shape {want}; found {type(x).__name__}")
        if x.ndim != len(self.input_shape) or x.shape[1:] != self.input_shape[1:] or x.shape[0] < 1:
            raise InputError(f"input {self.input_name!r}: expected shape {want} with N >= 1; found {x.shape}")
        if x.dtype not in (np.float32, np.float64):
            raise InputError(f"input {self.input_name!r}: expected dtype float32 or float64 (this net "
                             f"computes in {self.dtype}); found {x.dtype}")
        return x

    def _result_arrays(self, n: int, names: list[str]) -> dict[str, np.ndarray]:
        """The arrays a forward of n images copies the blobs `names` into (both modes)."""
        return {name: np.empty(self.blob_shapes(n)[name], dtype=self.dtype) for name in names}

    # "caffe" ----------------------------------------------------------------------------------

    def _forward_caffe(self, x: np.ndarray, names: list[str], cores: int) -> dict[str, np.ndarray]:
        """The whole batch through every layer in turn, OpenBLAS on `cores` threads. Its blobs
        and temporaries live in the workspace, planned for the batch as "dl" plans a chunk (a
        blob's memory is reused once no later layer reads it, so the peak is about two layers'
        activations) and kept for the next forward, as Caffe keeps its blobs: pages the kernel
        maps afresh on every pass cost the face CNN at batch 256 about a tenth of its time (AMD
        EPYC dev machine). Unlike Caffe's blobs, which only grow, an arena over twice what this
        batch needs (a larger batch's) is freed first, so that one large batch does not hold its
        memory for good; batch sizes that alternate that far apart pay the fresh pages again."""
        n = x.shape[0]
        workspace = self._plan.workspace
        if workspace.nbytes > 2 * workspace.plan(n)[1]:
            workspace.release()
        workspace.prepare(1, n, {n})
        results = self._result_arrays(n, names)
        with blas_threads(cores):
            self._run_chunk(self._plan, 0, n, x, 0, n, results, cores)
        return results

    # "dl" -------------------------------------------------------------------------------------

    def _forward_dl(self, x: np.ndarray, names: list[str], cores: int) -> dict[str, np.ndarray]:
        """Chunks of the batch, each run through the whole net in one worker's workspace share."""
        n = x.shape[0]
        plan = self._plan_for(names)
        workers, blas = thread_plan(n, cores, self._mixes_images)
        results = self._result_arrays(n, names)
        chunk = self.chunk_size(n, cores, plan)
        chunks = [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
        plan.workspace.prepare(workers, chunk, {e - s for s, e in chunks})
        with blas_threads(blas):
            if workers > 1:  # chunks claimed by whichever worker is free, each on its own workspace
                self._helpers.sharing(workers).run(lambda i, w: self._run_chunk(plan, w, chunk, x, *chunks[i], results, blas), len(chunks))
            else:
                for s, e in chunks:
                    self._run_chunk(plan, 0, chunk, x, s, e, results, blas)
        return results

    def _run_chunk(self, plan: Plan, worker: int, chunk: int, x: np.ndarray, s: int, e: int, results: dict, blas: int) -> None:
        """Run images [s, e) of x through `plan` on worker `worker`'s workspace, the BLAS on
        `blas` threads; copy the wanted blobs out ("caffe": the whole batch, on worker 0)."""
        xs, m = x[s:e], e - s
        arrays = plan.workspace.arrays(worker, chunk, m)
        if arrays.input is not None:
            np.copyto(arrays.input, xs)
            xs = arrays.input
        elif xs.dtype != self.dtype:
            xs = xs.astype(self.dtype)
        blobs = {self.input_name: xs}
        if plan.input_final and self.input_name in results:
            np.copyto(results[self.input_name][s : s + m], xs)
        tops, scratch = arrays.tops, arrays.scratch
        for idx, step in enumerate(plan.steps):
            op = step.op
            ins = [blobs[b] for b in op.bottoms]
            out = tops[idx]
            if out is None:  # the step runs in place
                out = ins[0]
            blobs[op.tops[0]] = op.run(ins, [out], scratch[idx], blas)[0]
            for name in step.finals:
                if name in results:  # a net that mixes images runs its whole batch as one chunk
                    np.copyto(results[name] if self._mixes_images else results[name][s : s + m], blobs[name])


def _check_settings(mode: str, dtype, threads: int | None, workspace_bytes: int) -> np.dtype:
    """The engine dtype, after checking the Net's settings (InputError naming the bad one)."""
    if mode not in MODES:
        raise InputError(f"engine mode: unknown {mode!r}; expected one of {', '.join(MODES)}")
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise InputError(f"engine dtype: {dtype} is not supported; expected float32 or float64")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise InputError(f"threads: {threads!r} is not a positive integer")
    if workspace_bytes < 1:
        raise InputError(f"workspace_bytes: {workspace_bytes!r} must be positive")
    return dtype


MAX_IMAGE_ACTIVATIONS_BYTES = 256 << 20  # the face CNN's blobs hold 0.5 MB an image; the Pi has 1 GB in all


def check_net(netdef: NetDef) -> None:
    """ModelError for a net `Net` would refuse in either mode (several inputs, a layer or a setting
    of one it does not run: STOCHASTIC pooling), found as `Net` finds it but without its threads,
    workspace or BLAS warm-up, and for one whose forward needs more than MAX_IMAGE_ACTIVATIONS_BYTES
    for one image in either mode: its blobs, checked before any operator is built (a 1x1
    convolution padded by 30,000 asked for 40 GB at its first forward, and building a wide
    pixel-major convolution allocates a row of its output), then its workspace, blobs and
    temporaries together (a kernel of 88 padded by 87 passed with 0.15 MB of blobs and took 921 MB
    of im2col columns at its first forward). For the checks before a run (tracker.preflight)."""
    input_name, _ = _single_input(netdef)
    layer_shapes = _layer_shapes(netdef)
    shapes = S.infer_shapes(netdef, batch=1)
    need = 4 * sum(int(np.prod(shape, dtype=object)) for shape in shapes.values())
    if need > MAX_IMAGE_ACTIVATIONS_BYTES:
        largest = max(shapes, key=lambda name: int(np.prod(shapes[name], dtype=object)))
        raise ModelError(f"net {netdef.name!r}: its blobs need {need / 2**20:,.0f} MB for one image (blob {largest!r} "
                         f"is {shapes[largest]}); expected at most {MAX_IMAGE_ACTIVATIONS_BYTES >> 20} MB")
    float32 = np.dtype(np.float32)
    for mode in MODES:
        ops = _operators(netdef, float32, mode, layer_shapes)
        steps, _, hidden = schedule(ops, input_name, mode, ())
        for plan in [steps, *([schedule(ops, input_name, mode, hidden)[0]] if hidden else [])]:  # both may run
            need = Workspace(netdef, plan, input_name, float32, MAX_IMAGE_ACTIVATIONS_BYTES).plan(1)[1]
            if need > MAX_IMAGE_ACTIVATIONS_BYTES:
                raise ModelError(f"net {netdef.name!r}: its {mode!r} forward needs {need / 2**20:,.0f} MB of blobs and "
                                 "temporaries (im2col columns, padded copies) for one image; expected at most "
                                 f"{MAX_IMAGE_ACTIVATIONS_BYTES >> 20} MB")


def _single_input(netdef: NetDef) -> tuple[str, tuple[int, ...]]:
    """The net's one input: its name and declared shape (ModelError if it has several or none)."""
    if len(netdef.inputs) != 1:
        raise ModelError(f"net {netdef.name!r}: the engine runs nets with exactly one input; "
                         f"found {len(netdef.inputs)} ({', '.join(netdef.inputs)})")
    (name, declared), = netdef.inputs.items()
    return name, tuple(int(d) for d in declared)


def _layer_shapes(netdef: NetDef) -> list[S.LayerShapes]:
    """Each layer's shapes for one image, once the engine is known to run every layer (ModelError
    for a layer type it does not run, or one over the batch axis)."""
    for layer in netdef.layers:
        if layer.type not in O.OPS:
            raise ModelError(f"layer {layer.name!r}: unknown layer type {layer.type!r}; the engine runs {', '.join(sorted(O.OPS))}")
    layer_shapes = S.infer_layer_shapes(netdef, batch=1)
    for layer, one, two in zip(netdef.layers, layer_shapes, S.infer_layer_shapes(netdef, batch=2)):
        # The engine runs any batch size with one set of weights, and flattens each image: a layer
        # whose weights are sized by the batch, or a Flatten from axis 0, failed at its first
        # forward, past the checks. (Layers that mix images, a Softmax over axis 0, a Concat on
        # it, batch statistics, run as Caffe runs them.)
        if one.params != two.params:
            raise ModelError(f"layer {layer.name!r} ({layer.type}): its weights' shape depends on the batch size "
                             f"({one.params} for one image, {two.params} for two); expected a layer over each "
                             "image's own axes (not axis 0)")
        if layer.type == "Flatten" and S.canonical_axis(layer, layer.param.flatten_param.axis, len(one.bottoms[0])) == 0:
            raise ModelError(f"layer {layer.name!r} (Flatten): flattens from axis 0, the batch; expected axis 1 "
                             "or later (each image flattened on its own)")
    return layer_shapes


def _operators(netdef: NetDef, dtype: np.dtype, mode: str, layer_shapes: list[S.LayerShapes]) -> list[O.Op]:
    """One op per layer, in order, from `_layer_shapes(netdef)` (ModelError for a setting of a
    layer `mode` does not run)."""
    return [O.OPS[layer.type](layer, dtype, mode, sh) for layer, sh in zip(netdef.layers, layer_shapes)]
