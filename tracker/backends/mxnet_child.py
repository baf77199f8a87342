"""The MXNet side of the MXNet backends: runs in the worker child on the MXNet interpreter.

Imports only numpy, mxnet and numpy-only tracker modules (errors, types), so that it runs in the
`.venv-mxnet` created by scripts/setup-mxnet: Python 3.11, mxnet 1.9.1, numpy 1.23 (MXNet 1.9.1,
the project's last release, fails with numpy >= 1.24). The network arrives already converted by
the parent (tracker.backends.mxnet): an MXNet symbol JSON file and an .npz of its float32 params.

The MKLDNN (oneDNN) choice is made by the parent through the environment before MXNet loads
(MXNET_MKLDNN_ENABLED, MXNET_SUBGRAPH_BACKEND); this class checks that the build has MKLDNN when
it is wanted and that the environment says what the backend claims.
"""

from __future__ import annotations

import collections
import os
import sys
from typing import Any

import numpy as np

from tracker.errors import BackendUnavailable, InputError
from tracker.types import Inference

SETUP_COMMAND = "scripts/setup-mxnet"
_MAX_EXECUTORS = 4  # executors kept for recent batch sizes besides the first (they share weights)


class MXNetSymbol:
    """An MXNet symbol + params run by a symbolic executor (simple_bind), one per batch size.

    Options (from the parent): symbol (path of the symbol JSON), params (path of the .npz; keys
    are the symbol's argument names), input_name (the data variable), mkldnn (bool, what the
    environment was set up for). Outputs of the symbol: [probs, embedding], reshaped to (N, -1).
    """

    name = "mxnet"

    @classmethod
    def check_runtime(cls) -> None:
        try:
            import mxnet  # noqa: F401
        except Exception as err:  # an ImportError, or an OSError from a missing shared library
            raise BackendUnavailable(
                f"MXNet is not importable in the worker's interpreter {sys.executable} ({err.__class__.__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}); create the MXNet environment with: {SETUP_COMMAND}"
            ) from None

    def __init__(self, model, *, precision: str = "fp32", threads=None, symbol: str, params: str,
                 input_name: str, mkldnn: bool):
        import mxnet as mx

        self._mx = mx
        built_with = mx.runtime.Features().is_enabled("MKLDNN")
        if mkldnn and not built_with:
            raise BackendUnavailable(f"this MXNet {mx.__version__} build has no MKLDNN (oneDNN); reinstall it with: {SETUP_COMMAND}")
        env = os.environ.get("MXNET_MKLDNN_ENABLED", "1")
        if (env != "0") != mkldnn:
            raise InputError(f"MXNET_MKLDNN_ENABLED={env!r} in the worker contradicts mkldnn={mkldnn}")
        self._symbol = mx.sym.load(symbol)
        with np.load(params) as stored:
            self._params = {key: mx.nd.array(stored[key], dtype="float32") for key in stored.files}
        self._input = input_name
        self._base: Any = None  # the first executor (an mxnet Executor): it holds the weights the others share
        self._recent: collections.OrderedDict = collections.OrderedDict()
        self.runtime_versions = {"mxnet_mkldnn": "on" if mkldnn else "off"}

    def _executor(self, x_shape: tuple[int, ...]):
        """An executor bound for this input shape; reshaped from the first one, so weights are shared."""
        if self._base is not None and self._base.arg_dict[self._input].shape == x_shape:
            return self._base
        if x_shape in self._recent:
            self._recent.move_to_end(x_shape)
            return self._recent[x_shape]
        if self._base is None:
            self._base = self._symbol.simple_bind(self._mx.cpu(), grad_req="null", **{self._input: x_shape})
            self._base.copy_params_from(self._params, allow_extra_params=False)
            return self._base
        executor = self._base.reshape(allow_up_sizing=True, **{self._input: x_shape})
        self._recent[x_shape] = executor
        if len(self._recent) > _MAX_EXECUTORS:
            self._recent.popitem(last=False)
        return executor

    def infer(self, x: np.ndarray) -> Inference:
        """x (N, C, H, W) float32 -> Inference of float32 copies."""
        n = x.shape[0]
        executor = self._executor(tuple(x.shape))
        executor.forward(is_train=False, **{self._input: x})
        probs, embedding = executor.outputs
        return Inference(probs.asnumpy().reshape(n, -1), embedding.asnumpy().reshape(n, -1))

    def close(self) -> None:
        self._base = None
        self._recent.clear()
