"""The order a net's ops run in, where each top lives, and the fusions.

`schedule(ops, input_name, mode, keep)` turns the ops of a net's layers (one per layer, in
prototxt order) into `Step`s, decided once per Net (and once more for callers who read a blob the
first schedule fuses away):

- in place: an op whose top is its first bottom and that may overwrite it (`Op.in_place_safe`)
  writes into that bottom's array, as Caffe's in-place layers do; other ops get a fresh top and
  the blob name is rebound;
- memory order ("dl"): a Convolution's top is its GEMM output, (C, N, H, W) in memory or, for a
  pixel-major one, (N, H, W, C), handed on as the NCHW-shaped transposed view; ops that keep the
  layout (`Op.keeps_layout`: pooling, element-wise) pass that order on, every other top is NCHW
  in memory;
- fusion ("dl"): a Convolution or InnerProduct followed by a plain ReLU (negative slope 0) that
  writes back onto its top becomes one new op (`with_relu`) that applies the ReLU to each band of
  its GEMM output while it is in cache; the ReLU's own step is dropped;
- pooled convolution ("dl"): a channel-major Convolution (ReLU fused or not) whose top only a MAX
  Pooling with windows that tile it reads becomes one `ops.PooledConvolution`, which never writes
  the convolution's top: that blob is `hidden`, unless the caller keeps it (`keep`);
- bias and ReLU after the pooling ("dl"): any other Convolution whose top only a MAX Pooling
  reads leaves its bias and fused ReLU to that pooling (`with_bias_relu_of`), which applies them
  to the pooled values only (a ninth as many for the face CNN's 3 x 3, stride-3 pool2; exact:
  both commute with a max), unless a pooling window lies wholly past the input (its -FLT_MAX is
  Caffe's value after the bias and ReLU). The convolution's top then lacks them: it is `hidden`
  too, unless kept;
- flattening in place ("dl"): an InnerProduct over a 4-D blob in (N, H, W, C) memory gets its
  weights permuted to that order (`reading_nhwc`) instead of gathering the blob each run;
- finals: after which step a blob holds its final value (what `forward` copies out).
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tracker.model import cache_aligned
from tracker.model import layers as L
from tracker.model import ops as O


@dataclass(frozen=True)
class Step:
    """One op as scheduled."""

    op: O.Op
    in_place: bool  # the top is written into the first bottom's array
    top_layout: str  # "nchw", "cnhw" or "nhwc": memory order of a 4-D top ("nchw" for any other)
    finals: tuple[str, ...]  # blobs whose value is final after this step


class Schedule(NamedTuple):
    """What `schedule` returns."""

    steps: tuple[Step, ...]
    input_final: bool  # no step writes the input blob: the caller's array holds its final value
    hidden: frozenset[str]  # blobs whose Caffe values no step gives (see the module docstring)


def schedule(ops: Sequence[O.Op], input_name: str, mode: str, keep: Collection[str] = ()) -> Schedule:
    """The steps that run `ops` (each layer's op, in order) in `mode` ("caffe" or "dl"); blobs
    in `keep` are written even where a fusion could skip them."""
    ops = list(ops)  # a pooling that takes over a convolution's bias and ReLU is replaced ahead
    placed: list[tuple[O.Op, bool, str]] = []  # (op, in place, top layout)
    layout = {input_name: "nchw"}
    hidden: set[str] = set()
    i = 0
    while i < len(ops):
        op = ops[i]
        in_place = op.tops[0] == op.bottoms[0] and op.in_place_safe
        if mode == "dl" and isinstance(op, (O.Convolution, O.InnerProduct)) and i + 1 < len(ops) and _plain_relu_on_top(op, ops[i + 1]):
            op = with_relu(op)
            i += 1  # the ReLU is done in place on the GEMM output
        pool = ops[i + 1] if i + 1 < len(ops) else None
        if (mode == "dl" and isinstance(op, O.Convolution) and isinstance(pool, O.Pooling)
                and _max_pooling_alone(op, pool, ops[i + 2 :], keep)):
            if O.PooledConvolution.fits(op, pool):
                hidden.add(op.tops[0])
                op = O.PooledConvolution(op, pool)
                i += 1  # the pooling is done on the GEMM output
            elif (op.bias is not None or op.fuse_relu) and not pool.has_empty_windows:
                hidden.add(op.tops[0])
                op, ops[i + 1] = with_bias_relu_of(op, pool)
        if (mode == "dl" and isinstance(op, O.InnerProduct) and op.axis == 1 and len(op.shapes.bottoms[0]) == 4
                and layout.get(op.bottoms[0]) == "nhwc"):
            op = reading_nhwc(op)
        layout[op.tops[0]] = _top_layout(op, mode, in_place, layout)
        placed.append((op, in_place, layout[op.tops[0]]))
        i += 1
    last_writer = {op.tops[0]: idx for idx, (op, _, _) in enumerate(placed)}
    steps = tuple(
        Step(op, in_place, top_layout, finals=(op.tops[0],) if last_writer[op.tops[0]] == idx else ())
        for idx, (op, in_place, top_layout) in enumerate(placed)
    )
    return Schedule(steps, input_final=input_name not in last_writer, hidden=frozenset(hidden))


def _plain_relu_on_top(op: O.Op, nxt: O.Op) -> bool:
    """True if `nxt` is a ReLU of slope 0 rewriting the top of `op` in place, and `op` writes
    that top as a new blob (so its output array is op's own)."""
    top = op.tops[0]
    return (top not in op.bottoms and isinstance(nxt, O.ReLU) and nxt.negative_slope == 0.0
            and nxt.bottoms == (top,) and nxt.tops == (top,))


def _max_pooling_alone(conv: O.Convolution, pool: O.Pooling, later: Sequence[O.Op], keep: Collection[str]) -> bool:
    """True if `pool` is a MAX pooling of conv's top and no other op (nor the caller: `keep`)
    reads or rewrites that top."""
    top = conv.tops[0]
    return (pool.method == L.POOL_MAX and pool.bottoms == (top,) and top not in pool.tops and top not in conv.bottoms
            and top not in keep and not any(top in (*op.bottoms, *op.tops) for op in later))


def with_relu(op: O.Convolution | O.InnerProduct) -> O.Convolution | O.InnerProduct:
    """A new op: `op` followed by a ReLU of slope 0, applied in place to each band of its output
    right after its GEMM and bias. It shares op's weights; op itself is left as it is."""
    fused = copy.copy(op)
    fused.fuse_relu = True
    return fused


def reading_nhwc(op: O.InnerProduct) -> O.InnerProduct:
    """A new op: `op` for a 4-D bottom in (N, H, W, C) memory flattened at axis 1, its weights
    permuted to (H, W, C) order once, so that the bottom is read as it lies instead of being
    gathered into (C, H, W) order on every run (the face CNN's fc1: 1-3% of the whole pass on one
    core, Intel Xeon, interleaved). The same products; the sums run in another order. `op` is
    a "dl" op, whose weights are (K, N) and (N, K) rows (see ops.InnerProduct)."""
    c, h, w = op.shapes.bottoms[0][1:]
    fused = copy.copy(op)
    fused.weight = cache_aligned.copy(op.weight.reshape(c, h, w, -1).transpose(1, 2, 0, 3).reshape(c * h * w, -1))
    rows = op.weight_rows
    assert rows is not None  # every "dl" InnerProduct has them
    fused.weight_rows = cache_aligned.copy(rows.reshape(-1, c, h, w).transpose(0, 2, 3, 1).reshape(rows.shape[0], -1))
    fused.bottom_nhwc = True
    return fused


def with_bias_relu_of(conv: O.Convolution, pool: O.Pooling) -> tuple[O.Convolution, O.Pooling]:
    """New ops: `conv` without its bias and fused ReLU, and `pool` (a MAX pooling of conv's top)
    that applies them to its output. They share the originals' weights; the originals are left
    as they are."""
    bare, then = copy.copy(conv), copy.copy(pool)
    if conv.bias is not None:
        then.then_bias = conv.bias.reshape(1, -1, 1, 1)
    then.then_relu = conv.fuse_relu
    bare.bias, bare.fuse_relu = None, False
    if conv.pixel_major:
        bare.bias_run = None
    return bare, then


def _top_layout(op: O.Op, mode: str, in_place: bool, layout: dict[str, str]) -> str:
    """Memory order of op's top, given the memory order of every blob so far."""
    if in_place:
        return layout[op.bottoms[0]]
    if isinstance(op, O.Convolution) and mode == "dl":
        return "nhwc" if op.pixel_major else "cnhw"
    if isinstance(op, O.PooledConvolution):
        return "cnhw"
    if op.keeps_layout and len(op.shapes.tops[0]) == 4 and layout.get(op.bottoms[0]) in ("cnhw", "nhwc"):
        return layout[op.bottoms[0]]
    return "nchw"


def mixes_images(ops: Sequence[O.Op], shapes_of_one: dict[str, tuple[int, ...]], shapes_of_two: dict[str, tuple[int, ...]]) -> bool:
    """True if some layer mixes the images of a batch: a blob whose first axis is not the batch
    (`shapes_of_one`/`shapes_of_two`: every blob's shape for batches of 1 and 2), an axis-0
    Softmax or Concat, a BatchNorm on the batch's own statistics. Such a net is never cut into
    chunks."""
    if any(shapes_of_one[b][:1] != (1,) or shapes_of_two[b][:1] != (2,) for b in shapes_of_one):
        return True
    for op in ops:
        if isinstance(op, (O.Softmax, O.Concat)) and op.axis == 0:
            return True
        if isinstance(op, O.BatchNorm) and not op.use_global_stats:
            return True
    return False


def describe(steps: Sequence[Step]) -> list[str]:
    """The executed schedule, one line per step (fusions and layouts shown)."""
    lines = []
    for step in steps:
        where = "in place" if step.in_place else step.top_layout
        lines.append(f"{step.op.name:<12} {label(step.op)} -> {step.op.tops[0]} ({where})")
    return lines


def label(op: O.Op) -> str:
    """op's type and what the schedule fused into it, e.g. "Pooling +bias +ReLU"."""
    extra = " +ReLU" if getattr(op, "fuse_relu", False) else ""
    if isinstance(op, O.Pooling):
        extra = " +bias" * (op.then_bias is not None) + " +ReLU" * op.then_relu
    if getattr(op, "bottom_nhwc", False):
        extra += " (weights in HWC order)"
    return op.type + extra
