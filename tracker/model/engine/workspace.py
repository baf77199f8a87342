"""The engine's workspace: one preallocated arena that holds every activation and every large
temporary of a chunk of images ("caffe" mode: of the whole batch, one chunk), at offsets
planned from the blobs' lifetimes.

Slots: each step's top (unless the step runs in place) and each of its temporaries is a slot, live
from the step that writes it to the last step that reads it; an input that some layer overwrites
in place gets a slot too, so the caller's array is never written. A plan, made once per chunk
size, gives every slot a byte offset, first fit in the order of first use, so that slots live at
the same step never overlap and a slot's bytes are reused once no step reads it; every slot starts
on a 64-byte cache line. The arena holds one plan per worker, side by side; it only grows ("dl":
to the cap, or to one image per worker if that is more) until released, and its pages are touched
on first use, so RSS follows what chunks really use. The arrays a chunk runs on are views of it,
made once and cached.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tracker.model import cache_aligned
from tracker.model import shapes as S
from tracker.model.engine.schedule import Step
from tracker.model.netdef import NetDef

DEFAULT_WORKSPACE_BYTES = 64 << 20
_ALIGN = cache_aligned.CACHE_LINE  # every workspace slot starts on a cache line


@dataclass
class Slot:
    """A region of the workspace: one blob's storage or one temporary."""

    nbytes: int  # for a full chunk
    first: int  # index of the step that writes it first (-1: the input, before any step)
    last: int  # index of the last step that reads or writes it
    offset: int = -1


def first_fit(slots: list[Slot]) -> int:
    """Give every slot an offset so that slots alive at the same step never overlap; total bytes,
    rounded up to a cache line (so that the next worker's share starts on one)."""
    placed: list[Slot] = []
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
            offset = max(offset, _aligned(end))
        slot.offset = offset
        placed.append(slot)
        total = max(total, offset + slot.nbytes)
    return _aligned(total)


def _aligned(nbytes: int) -> int:
    """nbytes rounded up to a multiple of _ALIGN."""
    return -(-nbytes // _ALIGN) * _ALIGN


@dataclass(frozen=True)
class ChunkArrays:
    """One worker's arrays for a chunk of m images, every one a view of its share of the arena."""

    tops: list[np.ndarray | None]  # per step: its top, NCHW-shaped in the step's memory order (None: in place)
    scratch: list[list[np.ndarray]]  # per step: its temporaries, flat
    input: np.ndarray | None  # where the input is copied first (None: the caller's array is read)


class Workspace:
    """The arena, its plans and its views for one Net's schedule.

    steps: the Net's schedule; netdef and input_name: its net (for the shapes of a chunk); dtype:
    the engine's float dtype; cap_bytes: the arena's cap, shared by the workers, which
    `images_per_chunk` applies ("dl"; "caffe" prepares one chunk of its whole batch).
    """

    def __init__(self, netdef: NetDef, steps: Sequence[Step], input_name: str, dtype: np.dtype, cap_bytes: int):
        self._netdef, self._steps, self._input_name = netdef, steps, input_name
        self._dtype, self.cap_bytes = dtype, cap_bytes
        self._intervals, self._input_slot, self._top_slots, self._scratch_slots = _assign_slots(steps, input_name)
        self._plans: dict[int, tuple[list[Slot], int]] = {}
        self._arena: np.ndarray | None = None
        self._views: dict[tuple[int, int, int], ChunkArrays] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of arena allocated so far (all workers)."""
        return 0 if self._arena is None else self._arena.nbytes

    def plan(self, chunk: int) -> tuple[list[Slot], int]:
        """Slots (with offsets) for chunks of up to `chunk` images, and their total bytes."""
        if chunk in self._plans:
            return self._plans[chunk]
        item = self._dtype.itemsize
        sizes = [0] * len(self._intervals)
        if self._input_slot is not None:
            sizes[self._input_slot] = math.prod(S.infer_shapes(self._netdef, chunk)[self._input_name]) * item
        for step, top_slot, scratch_slots, ls in zip(self._steps, self._top_slots, self._scratch_slots, self._step_shapes(chunk)):
            if top_slot is not None:
                sizes[top_slot] = math.prod(ls.tops[0]) * item
            for slot, size in zip(scratch_slots, step.op.scratch_sizes(ls.bottoms)):
                sizes[slot] = size * item
        slots = [Slot(size, first, last) for size, (first, last) in zip(sizes, self._intervals)]
        total = first_fit(slots)
        if len(self._plans) > 16:
            self._plans.clear()
        self._plans[chunk] = (slots, total)
        return slots, total

    def _step_shapes(self, batch: int) -> list[S.LayerShapes]:
        """LayerShapes of every step's op for `batch` images: the bottoms of the first layer it
        runs, the tops of the last."""
        by_name = dict(zip((layer.name for layer in self._netdef.layers), S.infer_layer_shapes(self._netdef, batch)))
        shapes = []
        for step in self._steps:
            first, last = by_name[step.op.layer_names[0]], by_name[step.op.layer_names[-1]]
            shapes.append(S.LayerShapes(first.bottoms, last.tops, first.params))
        return shapes

    def images_per_chunk(self, n: int, workers: int) -> int:
        """Images per chunk of a batch of n: as many as fit one worker's share of the cap (at
        least 1)."""
        share = self.cap_bytes // workers
        per_image = self.plan(1)[1]
        chunk = max(1, min(n, share // max(per_image, 1)))
        while chunk > 1 and self.plan(chunk)[1] > share:
            chunk -= 1
        return chunk

    def prepare(self, workers: int, chunk: int, sizes: set[int]) -> None:
        """Make the arena hold `workers` plans for `chunk` images (worker w uses bytes
        [w*total, (w+1)*total)) and make every worker's views for chunks of each of `sizes`
        images, here rather than concurrently in the workers."""
        need = workers * self.plan(chunk)[1]
        if self._arena is None or self._arena.nbytes < need:
            self._arena = None  # release the old arena before making the new one
            self._views.clear()
            self._arena = cache_aligned.empty(need, np.uint8)
        for worker in range(workers):
            for m in sizes:
                self.arrays(worker, chunk, m)

    def release(self) -> None:
        """Free the arena (the next `prepare` makes it again)."""
        self._arena = None
        self._views.clear()

    def arrays(self, worker: int, chunk: int, m: int) -> ChunkArrays:
        """Views of worker `worker`'s share of the arena for a chunk of m <= chunk images, cached
        (`prepare` must have made room)."""
        key = (worker, chunk, m)
        cached = self._views.get(key)
        if cached is not None:
            return cached
        slots, total = self.plan(chunk)
        assert self._arena is not None  # prepare made it
        share = self._arena[worker * total : (worker + 1) * total]

        def region(slot_idx: int, count: int) -> np.ndarray:
            offset = slots[slot_idx].offset
            return share[offset : offset + count * self._dtype.itemsize].view(self._dtype)

        tops: list[np.ndarray | None] = []
        scratch: list[list[np.ndarray]] = []
        for step, top_slot, scratch_slots, ls in zip(self._steps, self._top_slots, self._scratch_slots, self._step_shapes(m)):
            top = None
            if top_slot is not None:
                shape = ls.tops[0]
                flat = region(top_slot, math.prod(shape))
                if step.top_layout == "cnhw":
                    top = flat.reshape(shape[1], shape[0], *shape[2:]).transpose(1, 0, 2, 3)
                elif step.top_layout == "nhwc":
                    top = flat.reshape(shape[0], *shape[2:], shape[1]).transpose(0, 3, 1, 2)
                else:
                    top = flat.reshape(shape)
            tops.append(top)
            sizes = step.op.scratch_sizes(ls.bottoms)
            scratch.append([region(slot, size) for slot, size in zip(scratch_slots, sizes)])
        input_arr = None
        if self._input_slot is not None:
            shape = S.infer_shapes(self._netdef, m)[self._input_name]
            input_arr = region(self._input_slot, math.prod(shape)).reshape(shape)
        if len(self._views) > 64:
            self._views.clear()
        self._views[key] = cached = ChunkArrays(tops, scratch, input_arr)
        return cached


def _assign_slots(steps: Sequence[Step], input_name: str) -> tuple[list[tuple[int, int]], int | None, list[int | None], list[list[int]]]:
    """Slots for a schedule: each step's top (unless in place) and temporaries, and the input's
    if a layer writes it in place. Returns each slot's live interval (first, last step), the
    input's slot (None: the caller's array is read directly), each step's top slot (None: in
    place) and each step's temporary slots."""
    intervals: list[list[int]] = []
    storage: dict[str, int] = {}
    input_slot = None
    if any(s.in_place and s.op.bottoms[0] == input_name for s in steps):
        input_slot = storage[input_name] = len(intervals)
        intervals.append([-1, -1])
    top_slots: list[int | None] = []
    scratch_slots: list[list[int]] = []
    for idx, step in enumerate(steps):
        for name in (*step.op.bottoms, *(step.op.tops if step.in_place else ())):
            if name in storage:
                intervals[storage[name]][1] = idx
        top_slot = None
        if not step.in_place:
            top_slot = storage[step.op.tops[0]] = len(intervals)
            intervals.append([idx, idx])
        top_slots.append(top_slot)
        n_scratch = len(step.op.scratch_sizes(step.op.shapes.bottoms))
        scratch_slots.append(list(range(len(intervals), len(intervals) + n_scratch)))
        intervals.extend([idx, idx] for _ in range(n_scratch))
    return [(first, last) for first, last in intervals], input_slot, top_slots, scratch_slots
