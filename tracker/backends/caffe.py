"""The two backends on the project's own Caffe engine (`tracker.model.engine`).

caffe-openblas     Caffe's own CPU algorithm (configuration A of the study): per image, im2col
                   into one reused column buffer and one sgemm per layer through numpy's
                   OpenBLAS, separate bias and ReLU passes, Caffe's ceil-mode pooling. BLAS uses
                   `threads` threads; threads=None: 1 or every core, whichever the engine's
                   timing of its own passes finds faster on this machine under its current load.
caffe-openblas-dl  The same files and results executed for deep-learning shapes (configuration B):
                   one bounded workspace, im2col in cache-sized bands each followed by its GEMM
                   in the orientation OpenBLAS runs faster, outputs already in the next layer's
                   layout, bias and ReLU fused in place; several images split between worker
                   threads with single-threaded BLAS, one image's GEMMs split by OpenBLAS's own
                   threads; threads=None as above. See tracker/model/engine/ for the details.

Both read the prototxt and caffemodel of a `ModelSpec` and return the blobs it names.
Options: `workspace_mb` (caffe-openblas-dl only): the workspace cap in MiB (default 64);
`cache_dir` is accepted like every backend's and unused (the engine reads the Caffe files as they
are; there is nothing to convert or cache).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from tracker.backends.base import BackendBase, check_float32_batch
from tracker.errors import InputError, ModelError
from tracker.model.spec import ModelSpec
from tracker.types import Inference


class _CaffeEngine(BackendBase):
    """A backend running a Caffe classifier on the project's engine in one execution mode."""

    mode: ClassVar[str]
    options: ClassVar[tuple[str, ...]] = ("cache_dir",)

    def __init__(self, model: ModelSpec, *, precision: str = "fp32", threads: int | None = None, **options):
        from tracker.model.caffe_io import load_net
        from tracker.model.engine import DEFAULT_WORKSPACE_BYTES, Net

        if precision not in self.precisions:
            raise InputError(f"precision: backend {self.name!r} runs {', '.join(self.precisions)}; found {precision!r}")
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            expected = ", ".join(self.options) or "none"
            raise InputError(f"backend {self.name!r}: unknown option {unknown[0]!r}; expected options: {expected}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise InputError(f"threads: expected a positive integer or None; found {threads!r}")
        workspace = DEFAULT_WORKSPACE_BYTES
        if "workspace_mb" in options:
            mb = options["workspace_mb"]
            if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not mb > 0:
                raise InputError(f"workspace_mb: expected a positive number of MiB; found {mb!r}")
            workspace = int(mb * 2**20)
        self.model = model
        self._net: Net | None = Net(load_net(model.prototxt, model.weights), np.float32, self.mode,
                                    workspace_bytes=workspace, threads=threads)
        for role, blob in (("probs", model.probs), ("embedding", model.embedding)):
            if blob not in self._net.blob_names:
                raise ModelError(f"model {model.prototxt}: {role} blob {blob!r} is not in the net; blobs are {', '.join(self._net.blob_names)}")
        self.input_shape = self._net.input_shape

    def infer(self, x: np.ndarray) -> Inference:
        """x (N, C, H, W) float32 as the prototxt declares (any N >= 1) -> Inference (copies)."""
        check_float32_batch(self.name, x, self.input_shape)
        if self._net is None:
            raise InputError(f"{self.name}: the backend was closed")
        out = self._net.forward(x, [self.model.probs, self.model.embedding])
        n = x.shape[0]
        return Inference(out[self.model.probs].reshape(n, -1), out[self.model.embedding].reshape(n, -1))

    def close(self) -> None:
        net, self._net = getattr(self, "_net", None), None  # (absent when __init__ failed before it)
        if net is not None:
            net.close()


class CaffeOpenBLAS(_CaffeEngine):
    """caffe-openblas: Caffe's per-image im2col + sgemm algorithm (engine mode "caffe")."""

    name = "caffe-openblas"
    mode = "caffe"


class CaffeOpenBLASDL(_CaffeEngine):
    """caffe-openblas-dl: the engine's batched, fused, bounded-workspace mode (engine mode "dl")."""

    name = "caffe-openblas-dl"
    mode = "dl"
    options = ("cache_dir", "workspace_mb")
