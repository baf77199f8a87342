"""The lowered graph (`graph.Graph`) as a torch `nn.Module`, NCHW float32, for the `nnpack` backend.

Weights stay in Caffe's layouts (torch is NCHW/OIHW too), so nothing is permuted. With
`nnpack=True`, every convolution NNPACK can run is sent to it explicitly through
`torch._nnpack_spatial_convolution`, because PyTorch's own dispatcher
(aten/src/ATen/native/Convolution.cpp, `ConvParams::use_nnpack`) picks NNPACK only when MKLDNN
(oneDNN) is not chosen first -- oneDNN is built into the x86-64 and aarch64 wheels and wins
whenever it is enabled -- and, in non-mobile builds, only for batches of 16 or more. NNPACK takes
float32 NCHW, groups 1, no dilation, kernels up to 16x16 and pad < kernel; any other convolution
runs through `F.conv2d`. Inside that op, a batch of 1 or a stride > 1 runs image by image
(`nnp_convolution_inference`), larger stride-1 batches in one call (`nnp_convolution_output`).
NNPACK's thread pool is created on its first call with `torch.get_num_threads()` threads and
never resized, so the thread count must be set before the first forward. NNPACK itself is
initialised by `torch._nnpack_available()`; calling the op before that fails, so the module calls
it first (it is also how the backend learns whether this CPU is supported).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tracker.model.convert.graph import Activation, Conv, Dense, Flatten, Graph, Pool, Softmax


def nnpack_runs(op: Conv) -> bool:
    """Whether NNPACK can run convolution `op` (the limits its PyTorch binding checks)."""
    kh, kw = op.weight.shape[2:]
    return (op.group == 1 and op.dilation == (1, 1) and kh <= 16 and kw <= 16
            and op.pad[0] < kh and op.pad[1] < kw)


class CaffeModule(torch.nn.Module):
    """`forward(x)`: x (N, C, H, W) float32 -> (prob (N, P), embedding (N, D)) float32.

    Built once from a Graph; ops run in the graph's order from a table of closures. ReLUs run in
    place on a fresh conv/dense/pool result that nothing else reads (saves an allocation).
    """

    def __init__(self, graph: Graph, nnpack: bool = True):
        super().__init__()
        nnpack = nnpack and torch._nnpack_available()  # also initialises NNPACK
        self.graph_input = graph.input
        self.outputs = (graph.outputs["prob"], graph.outputs["embedding"])
        self.nnpack_convs = [op.name for op in graph.ops
                             if isinstance(op, Conv) and nnpack and nnpack_runs(op)]
        keep = {graph.input, *self.outputs}
        self._steps = []
        for i, op in enumerate(graph.ops):
            self._steps.append((op.src, op.dst, self._step(i, op, graph, keep, nnpack)))

    def _const(self, key: str, array: np.ndarray | None):
        """Register `array` as buffer `key`; a getter that reads the buffer at call time (so
        `.to(dtype)` / `.double()` reach the ops), or a getter of None."""
        if array is None:
            return lambda: None
        self.register_buffer(key, torch.from_numpy(np.array(array, dtype=np.float32)))
        buffers = self._buffers
        return lambda: buffers[key]

    def _step(self, i: int, op, graph: Graph, keep: set[str], nnpack: bool):
        if isinstance(op, Conv):
            w, b = self._const(f"w{i}", op.weight), self._const(f"b{i}", op.bias)
            if nnpack and nnpack_runs(op):
                pad, stride = list(op.pad), list(op.stride)
                return lambda x: torch._nnpack_spatial_convolution(x.contiguous(), w(), b(), pad, stride)
            return lambda x: F.conv2d(x, w(), b(), op.stride, op.pad, op.dilation, op.group)
        if isinstance(op, Pool):
            return self._pool(i, op)
        if isinstance(op, Activation):
            producer = next((p for p in graph.ops if p.dst == op.src), None)
            inplace = (isinstance(producer, (Conv, Dense, Pool)) and op.src not in keep
                       and len(graph.consumers.get(op.src, ())) == 1)
            if op.fn == "relu":
                if op.slope:
                    return lambda x: F.leaky_relu(x, op.slope, inplace=inplace)
                return lambda x: F.relu(x, inplace=inplace)
            return torch.sigmoid if op.fn == "sigmoid" else torch.tanh
        if isinstance(op, Flatten):
            return lambda x: x.flatten(1)
        if isinstance(op, Dense):
            w, b = self._const(f"w{i}", op.weight), self._const(f"b{i}", op.bias)
            return lambda x: F.linear(x, w(), b())
        assert isinstance(op, Softmax)
        return lambda x: F.softmax(x, dim=1)

    def _pool(self, i: int, op: Pool):
        cb, cr = op.crop
        top, left, bottom, right = op.pad
        scale = self._const(f"s{i}", op.scale)
        pool = F.max_pool2d if op.method == "max" else F.avg_pool2d
        mode = "replicate" if op.method == "max" else "constant"

        def run(x):
            if cb or cr:
                x = x[:, :, :x.shape[2] - cb, :x.shape[3] - cr]
            if any(op.pad):
                x = F.pad(x, (left, right, top, bottom), mode=mode)
            y = pool(x, op.kernel, op.stride)
            factor = scale()
            return y if factor is None else y * factor
        return run

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        env = {self.graph_input: x}
        for src, dst, fn in self._steps:
            env[dst] = fn(env[src])
        return env[self.outputs[0]], env[self.outputs[1]]


def build_torch(graph: Graph, nnpack: bool = True) -> CaffeModule:
    """A CaffeModule for `graph` in eval mode (see the module docstring for `nnpack`)."""
    return CaffeModule(graph, nnpack).eval()
