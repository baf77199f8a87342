"""`nnpack`: PyTorch with its convolutions run by NNPACK, the configuration the study wanted.

Where PyTorch really uses NNPACK: its convolution dispatcher (aten/src/ATen/native/Convolution.cpp,
`ConvParams::use_nnpack`) picks NNPACK only if `torch.backends.nnpack` is enabled, the build has
it (`torch._nnpack_available()`: the x86-64 and aarch64 PyPI wheels do), the input is float32
NCHW on the CPU, there is no dilation, the kernel is at most 16x16, pad < kernel, and -- outside
mobile builds -- the batch is at least 16; and only when MKLDNN (oneDNN) was not chosen first,
which it is whenever it is enabled, as it is in both wheels. So a stock `F.conv2d` never reaches
NNPACK on either platform, and would not for the guard's small batches anyway. This backend
therefore enables `torch.backends.nnpack` and calls NNPACK's operator
(`torch._nnpack_spatial_convolution`) directly for every convolution it can run, at every batch
size (see tracker.model.convert.torch); pooling, fully connected layers and softmax are ordinary
PyTorch CPU ops. `nnpack_convs` lists the layers NNPACK runs.

The module is built straight from the Caffe files (torch is NCHW/OIHW like Caffe: nothing to
convert, so nothing is cached). Threads: NNPACK sizes its own thread pool once, at its first call,
from torch's intra-op thread count, for the life of the process. The backend sets that count to
`threads` (default: every core this process may use), runs one warm-up forward to create the
pool, then sets torch's intra-op (OpenMP) threads to 1: the convolutions run on NNPACK's pool,
and the rest -- pooling, ReLU, the two small matrix products, softmax -- on the calling thread.
Measured on a busy 2-core machine, OpenMP's 2-thread regions for those small ops made a batch of
1 take ~70 ms instead of ~7 ms (each region waits for a descheduled thread), and on the Pi the
guard's other stages compete for the cores the same way. torch's thread count is process-wide.
"""

from __future__ import annotations

from tracker.backends.base import BackendBase, check_batch, check_options
from tracker.backends.registry import missing_runtime
from tracker.errors import BackendUnavailable
from tracker.machine import cores
from tracker.model.convert import load_graph
from tracker.model.spec import ModelSpec
from tracker.types import Inference


class TorchNNPACK(BackendBase):
    """Options: cache_dir is accepted and unused (nothing is converted), so callers can pass
    it to every backend alike."""

    name = "nnpack"
    precisions = ("fp32",)

    @classmethod
    def check_runtime(cls) -> None:
        try:
            import torch
        except ImportError as err:
            raise missing_runtime(cls.name, err.name or "torch", err) from None
        if not torch._nnpack_available():  # also initialises NNPACK
            raise BackendUnavailable(f"backend {cls.name!r}: this PyTorch build or CPU has no NNPACK "
                                     f"(torch._nnpack_available() is False)")

    def __init__(self, model: ModelSpec, *, precision: str = "fp32", threads: int | None = None, **options):
        import torch

        from tracker.model.convert.torch import build_torch

        check_options(self.name, options, ("cache_dir",))
        self.check_runtime()
        self.precision = precision
        self.threads = threads or cores()
        torch.set_num_threads(self.threads)
        torch.backends.nnpack.set_flags(True)
        graph = load_graph(model)
        self._shape = graph.input_shape
        self._module = build_torch(graph, nnpack=True)
        self.nnpack_convs = tuple(self._module.nnpack_convs)
        self._torch = torch
        with torch.inference_mode():  # creates NNPACK's pool with `threads` threads (if not yet)
            self._module(torch.zeros((1, *self._shape)))
        torch.set_num_threads(1)

    def infer(self, x) -> Inference:
        x = check_batch(self.name, x, self._shape)
        with self._torch.inference_mode():
            prob, embedding = self._module(self._torch.from_numpy(x))
        return Inference(prob.numpy(), embedding.numpy())

    def close(self) -> None:
        self.__dict__.pop("_module", None)  # drop the torch module: a closed backend is not used again
