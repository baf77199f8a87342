"""The project's Caffe engine: runs a `NetDef` (from `caffe_io.load_net`) forward with numpy.

    net = Net(load_net(prototxt, caffemodel), dtype=np.float32, mode="dl")
    out = net.forward(x, ["prob", "fc1"])     # x (N, C, H, W); dict of (N, ...) arrays (copies)

Layer arithmetic is Caffe's (see `layers.py` and `ops.py`). Blob naming is Caffe's too: an
in-place layer (top == bottom) overwrites its blob, so reading "fc1" of the face CNN gives fc1
after its ReLU; every named blob (inputs and tops) can be read out.

Two execution modes, same results (within float rounding):

"caffe" -- Caffe's own CPU algorithm. Blobs are whole-batch NCHW arrays. Convolution loops over
    the images: im2col of one image into ONE column buffer shared by every convolution layer,
    then one sgemm per group through numpy's OpenBLAS, then the bias; ReLU is its own pass;
    InnerProduct is one GEMM over the batch; pooling is Caffe's ceil-mode pooling. OpenBLAS runs
    with `threads` threads, as Caffe linked to OpenBLAS does (threads=None: 1 or every core,
    whichever the timing of the Net's own passes shows faster; see `tuning.py`). Blobs no later
    layer reads are released, so peak memory is about two layers' activations for the batch.

"dl" -- the same layers executed for deep-learning shapes:
    * the batch is cut into chunks that fit ONE preallocated workspace (`workspace_bytes`, 64 MiB
      by default, shared by the worker threads); every activation and every large temporary of a
      chunk lives in it, at offsets planned once from the blobs' lifetimes (a slot is reused once
      no layer reads it);
    * convolution does one im2col for the whole chunk, straight from a strided view of the input
      into a (C*kh*kw, n*OH*OW) column buffer, and ONE GEMM (O, C*kh*kw) @ cols whose
      (O, n*OH*OW) result is the top blob itself, kept in (C, N, H, W) memory and passed on as its
      NCHW-shaped transposed view, so no layout transpose is ever copied (pooling and element-wise
      layers keep that memory order; InnerProduct gathers it once into rows);
    * the bias and an in-place ReLU that follows a Convolution/InnerProduct are applied in place
      on the GEMM output (the ReLU layer is then not run separately);
    * threads (see `Net._thread_plan`): BLAS is single-threaded; the cores are used by worker
      threads instead: several images are split between one worker per core (chunks claimed by
      whichever worker is free; each runs the whole net on its chunk, so im2col and pooling run
      in parallel too), and a single image has each Convolution's output rows (im2col band +
      GEMM) and each InnerProduct's outputs claimed by the workers. threads=None: 1 core or all
      cores, whichever the timing of the Net's own passes shows faster (see `tuning.py`).

BLAS thread limits are process-wide: `forward` sets them for its duration and restores them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from tracker.errors import InputError, ModelError
from tracker.machine import cores
from tracker.model import ops as O
from tracker.model import shapes as S
from tracker.model.tuning import ThreadTuner, batch_class

DEFAULT_WORKSPACE_BYTES = 64 << 20
_ALIGN = 64  # bytes; every workspace slot starts on a cache line
MODES = ("caffe", "dl")


# --------------------------------------------------------------------------------------------
# BLAS threads
# --------------------------------------------------------------------------------------------

_controller = None
_controller_lock = threading.Lock()


def _blas_controller():
    """threadpoolctl's controller, built once (it scans the loaded libraries)."""
    global _controller
    with _controller_lock:
        if _controller is None:
            from threadpoolctl import ThreadpoolController

            _controller = ThreadpoolController()
        return _controller


@contextmanager
def blas_threads(n: int):
    """Run the block with every loaded BLAS limited to `n` threads, then restore."""
    with _blas_controller().limit(limits=n, user_api="blas"):
        yield


class _Parallel:
    """Shares `parts` independent pieces of work between the calling thread and `workers - 1`
    helper threads of a pool, each with single-threaded BLAS.

    Pieces are claimed one by one from a shared counter, so a helper that the OS does not
    schedule in time (a busy machine) simply claims nothing and the calling thread does the
    rest: the worst case is the single-threaded time, never a wait for an idle helper to wake.
    The caller waits only for pieces a helper has already started.
    """

    def __init__(self, pool: ThreadPoolExecutor, workers: int):
        self.pool, self.workers = pool, workers

    def run(self, fn, parts: int) -> None:
        """Call fn(part, worker) for part in range(parts); worker is 0 for the calling thread and
        1..workers-1 for helpers (at most one piece at a time per worker)."""
        lock = threading.Lock()
        done = threading.Event()
        state = {"next": 0, "finished": 0}
        errors: list[BaseException] = []

        def work(worker: int) -> None:
            while True:
                with lock:
                    part = state["next"]
                    if part >= parts:
                        return
                    state["next"] = part + 1
                try:
                    fn(part, worker)
                except BaseException as err:  # noqa: BLE001 - re-raised on the calling thread
                    errors.append(err)
                with lock:
                    state["finished"] += 1
                    if state["finished"] == parts:
                        done.set()

        for worker in range(1, min(self.workers, parts)):
            self.pool.submit(work, worker)
        work(0)
        done.wait()
        if errors:
            raise errors[0]


# --------------------------------------------------------------------------------------------
# The "dl" workspace plan
# --------------------------------------------------------------------------------------------


@dataclass
class _Slot:
    """A region of the workspace: one blob storage or one temporary."""

    nbytes: int  # for a full chunk
    first: int  # index of the step that writes it first
    last: int  # index of the last step that reads or writes it
    offset: int = -1


@dataclass
class _Step:
    """One op as scheduled: where its tops and temporaries live and which blobs become final."""

    op: O.Op
    in_place: bool
    top_slot: int | None  # None: in place, the top is the first bottom's storage
    top_layout: str  # "nchw" or "cnhw" (memory order of a 4-D top)
    scratch_slots: list[int] = field(default_factory=list)
    finals: list[str] = field(default_factory=list)  # blobs whose value is final after this step


def _first_fit(slots: list[_Slot]) -> int:
    """Give every slot an offset so that slots alive at the same step never overlap; total bytes."""
    placed: list[_Slot] = []
    total = 0
    for slot in sorted(slots, key=lambda s: (s.first, -s.nbytes)):
        if slot.nbytes == 0:
            slot.offset = 0
            continue
        busy = sorted((s.offset, s.offset + s.nbytes) for s in placed if s.first <= slot.last and slot.first <= s.last)
        offset = 0
        for start, end in busy:
            if offset + slot.nbytes <= start:
                break
            offset = max(offset, -(-end // _ALIGN) * _ALIGN)
        slot.offset = offset
        placed.append(slot)
        total = max(total, offset + slot.nbytes)
    return total


# --------------------------------------------------------------------------------------------
# The net
# --------------------------------------------------------------------------------------------


class Net:
    """A Caffe net ready to run forward (see the module docstring for the two modes).

    netdef: from `caffe_io.load_net` (weights included). dtype: float32 (the product) or float64
    (the reference: `Net(netdef, np.float64, "caffe")`). mode: "caffe" or "dl".
    workspace_bytes: the "dl" workspace cap, shared by the worker threads (a chunk holds at least
    one image even if one image needs more). threads: cores to use (None: all this process may
    use; None: 1 or all of them, chosen per batch-size class by timing the Net's own passes):
    OpenBLAS threads in "caffe" mode, worker threads in "dl" mode. Not thread-safe: one forward
    at a time per Net; `close()` stops the "dl" worker threads.
    """

    def __init__(self, netdef, dtype=np.float32, mode: str = "caffe", *, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, threads: int | None = None):
        if mode not in MODES:
            raise InputError(f"engine mode: unknown {mode!r}; expected one of {', '.join(MODES)}")
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise InputError(f"engine dtype: {self.dtype} is not supported; expected float32 or float64")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise InputError(f"threads: {threads!r} is not a positive integer")
        if workspace_bytes < 1:
            raise InputError(f"workspace_bytes: {workspace_bytes!r} must be positive")
        self.mode = mode
        self.threads = threads  # None: tuned per batch-size class between 1 core and all cores
        self._tuner = ThreadTuner((threads,) if threads else (1, cores()))
        self.workspace_bytes = int(workspace_bytes)
        self.name = netdef.name
        if len(netdef.inputs) != 1:
            raise ModelError(f"net {netdef.name!r}: the engine runs nets with exactly one input; "
                             f"found {len(netdef.inputs)} ({', '.join(netdef.inputs)})")
        (self.input_name, declared), = netdef.inputs.items()
        self.input_shape: tuple[int, ...] = tuple(int(d) for d in declared)
        for layer in netdef.layers:
            if layer.type not in O.OPS:
                raise ModelError(f"layer {layer.name!r}: unknown layer type {layer.type!r}; the engine runs {', '.join(sorted(O.OPS))}")
        self._netdef = netdef
        layer_shapes = S.infer_layer_shapes(netdef, batch=1)
        self.ops = [O.OPS[layer.type](layer, self.dtype, mode, sh) for layer, sh in zip(netdef.layers, layer_shapes)]
        self.blob_names: tuple[str, ...] = tuple(dict.fromkeys([self.input_name] + [t for op in self.ops for t in op.tops]))
        self._shape_cache: dict[int, dict[str, tuple[int, ...]]] = {}
        self._steps = self._schedule()
        self._batch_coupled = self._couples_batch()
        # "caffe": the one column buffer every convolution shares (per-image sizes, lazily made).
        self._columns: np.ndarray | None = None
        # "dl": slot structure fixed once; offsets per chunk size; one arena shared by workers.
        self._intervals, self._input_slot = self._slot_structure() if mode == "dl" else ([], None)
        self._plans: dict[int, tuple[list[_Slot], int]] = {}
        self._workspace: np.ndarray | None = None  # "dl": the one arena, split between workers
        self._views: dict[tuple[int, int, int], dict] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._executor_size = 0

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
        lines = []
        for step in self._steps:
            op = step.op
            extra = " +ReLU" if getattr(op, "fuse_relu", False) else ""
            where = "in place" if step.in_place else step.top_layout
            lines.append(f"{op.name:<12} {op.type}{extra} -> {op.tops[0]} ({where})")
        return lines

    # ---------------------------------------------------------------- scheduling

    def _schedule(self) -> list[_Step]:
        """Steps in order; in "dl" mode Conv/InnerProduct absorb a following in-place ReLU."""
        steps: list[_Step] = []
        layout = {self.input_name: "nchw"}
        i = 0
        while i < len(self.ops):
            op = self.ops[i]
            top = op.tops[0]
            in_place = top == op.bottoms[0] and op.in_place_safe
            if self.mode == "dl" and isinstance(op, (O.Convolution, O.InnerProduct)) and top not in op.bottoms and i + 1 < len(self.ops):
                nxt = self.ops[i + 1]
                if isinstance(nxt, O.ReLU) and nxt.negative_slope == 0.0 and nxt.bottoms == (top,) and nxt.tops == (top,):
                    op.fuse_relu = True
                    i += 1  # the ReLU is done in place on the GEMM output
            ndim4 = len(op.shapes.tops[0]) == 4
            if isinstance(op, O.Convolution) and self.mode == "dl":
                top_layout = "cnhw"
            elif op.keeps_layout and ndim4 and layout.get(op.bottoms[0]) == "cnhw":
                top_layout = "cnhw"
            else:
                top_layout = "nchw"
            if in_place:
                top_layout = layout[op.bottoms[0]]
            layout[top] = top_layout
            steps.append(_Step(op, in_place, None, top_layout))
            i += 1
        last_writer = {self.input_name: -1}
        for idx, step in enumerate(steps):
            last_writer[step.op.tops[0]] = idx
        for name, idx in last_writer.items():
            if idx >= 0:
                steps[idx].finals.append(name)
        self._input_final = last_writer[self.input_name] == -1
        return steps

    def _couples_batch(self) -> bool:
        """True if some layer mixes images (an axis-0 op, batch statistics): no chunking then."""
        one, two = self.blob_shapes(1), self.blob_shapes(2)
        if any(one[b][:1] != (1,) or two[b][:1] != (2,) for b in one):
            return True
        for op in self.ops:
            if isinstance(op, (O.Softmax, O.Concat)) and op.axis == 0:
                return True
            if isinstance(op, O.BatchNorm) and not op.use_global_stats:
                return True
        return False

    # ---------------------------------------------------------------- forward

    def forward(self, x: np.ndarray, outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """Run the net on x (N, *input_shape[1:]), N >= 1; return {name: blob copy} for `outputs`.

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
            with blas_threads(cores):
                out = self._forward_caffe(x, names)
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
            raise InputError(f"input {self.input_name!r}: expected dtype float32; found {x.dtype}")
        return x

    # "caffe" ----------------------------------------------------------------------------------

    def _forward_caffe(self, x: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
        wanted = set(names)
        results: dict[str, np.ndarray] = {}
        blobs = {self.input_name: np.array(x, dtype=self.dtype, copy=True)}  # Caffe copies in
        if self._input_final and self.input_name in wanted:
            results[self.input_name] = blobs[self.input_name].copy()
        last_use: dict[str, int] = {}
        for idx, step in enumerate(self._steps):
            for b in (*step.op.bottoms, *step.op.tops):
                last_use[b] = idx
        for idx, step in enumerate(self._steps):
            op = step.op
            ins = [blobs[b] for b in op.bottoms]
            outs = [ins[0] if step.in_place else None]
            blobs[op.tops[0]] = op.run(ins, outs, self._caffe_scratch(op, ins))[0]
            for name in step.finals:
                if name in wanted:
                    results[name] = np.array(blobs[name], copy=True, order="C")
            for b in set(op.bottoms) | set(op.tops):
                if last_use[b] == idx:
                    del blobs[b]  # Caffe keeps every blob; dropping dead ones bounds memory
        return {n: results[n] for n in names}

    def _caffe_scratch(self, op, ins) -> list[np.ndarray]:
        sizes = op.scratch_sizes([a.shape for a in ins])
        total = sum(sizes)
        if total == 0:
            return [np.empty(0, self.dtype) for _ in sizes]
        if self._columns is None or self._columns.size < total:
            self._columns = np.empty(total, self.dtype)
        out, start = [], 0
        for size in sizes:
            out.append(self._columns[start : start + size])
            start += size
        return out

    # "dl" -------------------------------------------------------------------------------------

    def _slot_structure(self) -> tuple[list[tuple[int, int]], int | None]:
        """Assign workspace slots to the schedule once: each step's top (unless in place) and
        temporaries. Returns each slot's live interval (first, last step) and the input's slot
        (None when the caller's array can be read directly: no layer writes the input in place)."""
        intervals: list[list[int]] = []
        storage: dict[str, int] = {}
        input_slot = None
        if any(s.in_place and s.op.bottoms[0] == self.input_name for s in self._steps):
            input_slot = storage[self.input_name] = len(intervals)
            intervals.append([-1, -1])
        for idx, step in enumerate(self._steps):
            for name in (*step.op.bottoms, *(step.op.tops if step.in_place else ())):
                if name in storage:
                    intervals[storage[name]][1] = idx
            if not step.in_place:
                step.top_slot = storage[step.op.tops[0]] = len(intervals)
                intervals.append([idx, idx])
            n_scratch = len(step.op.scratch_sizes(step.op.shapes.bottoms))
            step.scratch_slots = list(range(len(intervals), len(intervals) + n_scratch))
            intervals.extend([idx, idx] for _ in range(n_scratch))
        return [(first, last) for first, last in intervals], input_slot

    def _plan(self, chunk: int) -> tuple[list[_Slot], int]:
        """Workspace slots (with offsets) for chunks of up to `chunk` images, and total bytes."""
        if chunk in self._plans:
            return self._plans[chunk]
        item = self.dtype.itemsize
        sizes = [0] * len(self._intervals)
        if self._input_slot is not None:
            sizes[self._input_slot] = math.prod(self.blob_shapes(chunk)[self.input_name]) * item
        for step, ls in zip(self._steps, self._op_shapes(chunk)):
            if step.top_slot is not None:
                sizes[step.top_slot] = math.prod(ls.tops[0]) * item
            for slot, size in zip(step.scratch_slots, step.op.scratch_sizes(ls.bottoms)):
                sizes[slot] = size * item
        slots = [_Slot(size, first, last) for size, (first, last) in zip(sizes, self._intervals)]
        total = _first_fit(slots)
        if len(self._plans) > 16:
            self._plans.clear()
        self._plans[chunk] = (slots, total)
        return slots, total

    def _op_shapes(self, batch: int) -> list[S.LayerShapes]:
        """LayerShapes of every scheduled step's op for `batch` images."""
        by_name = dict(zip((layer.name for layer in self._netdef.layers), S.infer_layer_shapes(self._netdef, batch)))
        return [by_name[step.op.name] for step in self._steps]

    def chunk_size(self, n: int, cores: int | None = None) -> int:
        """"dl": images per chunk for a batch of n on `cores` cores (default: the most this Net
        uses): what one worker's share of the workspace holds, and with several workers small
        enough that each gets about two chunks (chunks are claimed dynamically, so finer chunks
        balance the load)."""
        workers = self._thread_plan(n, cores or max(self._tuner.arms))[0]
        chunk = self._chunk_size(n, workers)
        return chunk if workers == 1 else max(1, min(chunk, -(-n // (2 * workers))))

    @property
    def workspace_nbytes(self) -> int:
        """"dl": bytes of workspace allocated so far (all workers); bounded by workspace_bytes
        unless a single image needs more."""
        return 0 if self._workspace is None else self._workspace.nbytes

    def _chunk_size(self, n: int, workers: int) -> int:
        """Images per chunk: as many as fit one worker's share of the workspace (at least 1)."""
        if self._batch_coupled:
            return n
        share = self.workspace_bytes // workers
        per_image = self._plan(1)[1]
        chunk = max(1, min(n, share // max(per_image, 1)))
        while chunk > 1 and self._plan(chunk)[1] > share:
            chunk -= 1
        return chunk

    def _reserve(self, workers: int, chunk: int) -> None:
        """Make the arena hold `workers` shares of a `chunk`-image plan (worker w uses bytes
        [w*total, (w+1)*total)). It only grows, to at most the cap, or to one image per worker if
        that is more (or to the whole batch for a net that mixes images); pages are touched on
        first use, so RSS follows what chunks really use."""
        need = workers * self._plan(chunk)[1]
        if self._workspace is None or self._workspace.nbytes < need:
            self._workspace = None  # release the old arena before making the new one
            self._views.clear()
            self._workspace = np.empty(need, np.uint8)

    def _arrays(self, worker: int, chunk: int, m: int) -> dict:
        """Views of worker `worker`'s share of the arena for a chunk of m <= chunk images,
        cached (`_reserve` must have made room)."""
        key = (worker, chunk, m)
        cached = self._views.get(key)
        if cached is not None:
            return cached
        slots, total = self._plan(chunk)
        assert self._workspace is not None  # _reserve made it
        ws = self._workspace[worker * total : (worker + 1) * total]

        def region(slot_idx: int, count: int) -> np.ndarray:
            offset = slots[slot_idx].offset
            return ws[offset : offset + count * self.dtype.itemsize].view(self.dtype)

        tops: list[np.ndarray | None] = []
        scratch: list[list[np.ndarray]] = []
        for step, ls in zip(self._steps, self._op_shapes(m)):
            top = None
            if step.top_slot is not None:
                shape = ls.tops[0]
                flat = region(step.top_slot, math.prod(shape))
                if step.top_layout == "cnhw":
                    top = flat.reshape(shape[1], shape[0], *shape[2:]).transpose(1, 0, 2, 3)
                else:
                    top = flat.reshape(shape)
            tops.append(top)
            sizes = step.op.scratch_sizes(ls.bottoms)
            scratch.append([region(slot, size) for slot, size in zip(step.scratch_slots, sizes)])
        input_arr = None
        if self._input_slot is not None:
            shape = self.blob_shapes(m)[self.input_name]
            input_arr = region(self._input_slot, math.prod(shape)).reshape(shape)
        if len(self._views) > 64:
            self._views.clear()
        self._views[key] = cached = {"tops": tops, "scratch": scratch, "input": input_arr}
        return cached

    def _thread_plan(self, n: int, cores: int) -> tuple[int, int, int]:
        """(image workers, layer workers, BLAS threads) for a batch of n images on `cores` cores.

        "dl" never relies on OpenBLAS's own threads: on the 2-core EPYC shared with other work, a
        2-thread sgemm that follows non-BLAS work (im2col, pooling) waited tens of ms for its
        spinning helper thread to be scheduled again (0.6 ms back to back, ~35 ms median after a
        1 ms pause). Worker threads that claim work from a shared counter instead:
        - n >= 2: chunks of images, one worker per core, each running the whole net on its chunk
          with single-threaded BLAS, so im2col, pooling and the element-wise passes run in
          parallel too;
        - n == 1: bands of output rows of every Convolution (each its own im2col columns and
          GEMM) and slices of the outputs of every InnerProduct.
        A net that mixes images (batch statistics, axis-0 layers) runs as one chunk on the calling
        thread with `cores` BLAS threads.
        """
        if self._batch_coupled:
            return 1, 1, cores
        if n == 1:
            return 1, cores, 1
        return min(cores, n), 1, 1

    def _forward_dl(self, x, names, cores: int):
        n = x.shape[0]
        workers, layer_workers, blas = self._thread_plan(n, cores)
        results = {name: np.empty(self.blob_shapes(n)[name], dtype=self.dtype) for name in names}
        chunk = self.chunk_size(n, cores)
        chunks = [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
        self._reserve(workers, chunk)
        for w in range(workers):  # views built here, never concurrently in the workers
            for m in {e - s for s, e in chunks}:
                self._arrays(w, chunk, m)
        with blas_threads(blas):
            if workers > 1:  # chunks claimed by whichever worker is free, each on its own workspace
                self._parallel(workers).run(lambda i, w: self._run_dl_chunk(w, chunk, x, *chunks[i], results, None), len(chunks))
            else:
                par = self._parallel(layer_workers) if layer_workers > 1 else None
                for s, e in chunks:
                    self._run_dl_chunk(0, chunk, x, s, e, results, par)
        return results

    def _parallel(self, workers: int) -> _Parallel:
        """A sharer for `workers` workers: the calling thread plus helpers from a pool kept
        across calls (grown when more are needed)."""
        if self._executor is None or self._executor_size < workers - 1:
            self.close()
            self._executor = ThreadPoolExecutor(max_workers=workers - 1, thread_name_prefix=f"engine-{self.name}")
            self._executor_size = workers - 1
        return _Parallel(self._executor, workers)

    def close(self) -> None:
        """Stop the "dl" worker threads (the Net stays usable; they restart on demand)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _run_dl_chunk(self, worker: int, chunk: int, x: np.ndarray, s: int, e: int, results: dict, par: _Parallel | None) -> None:
        """Run images [s, e) of x on worker `worker`'s workspace; copy the wanted blobs out."""
        xs, m = x[s:e], e - s
        arrays = self._arrays(worker, chunk, m)
        if arrays["input"] is not None:
            np.copyto(arrays["input"], xs)
            xs = arrays["input"]
        elif xs.dtype != self.dtype:
            xs = xs.astype(self.dtype)
        blobs = {self.input_name: xs}
        if self._input_final and self.input_name in results:
            np.copyto(results[self.input_name][s : s + m], xs)
        tops, scratch = arrays["tops"], arrays["scratch"]
        for idx, step in enumerate(self._steps):
            op = step.op
            ins = [blobs[b] for b in op.bottoms]
            out = ins[0] if step.in_place else tops[idx]
            blobs[op.tops[0]] = op.run(ins, [out], scratch[idx], par)[0]
            for name in step.finals:
                if name in results:
                    np.copyto(results[name][s : s + m], blobs[name])
