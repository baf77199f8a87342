"""mxnet-openblas and mxnet-openblas-dl: MXNet 1.9.1 in a worker on its own interpreter.

MXNet is retired upstream; its last release, 1.9.1, publishes wheels for Python <= 3.11 only and
fails with numpy >= 1.24, so it cannot share an interpreter with the product (numpy 2). It runs
in `.venv-mxnet` (Python 3.11, mxnet 1.9.1, numpy 1.23.5), created by `scripts/setup-mxnet`,
always behind the worker (tracker.backends.worker). Only x86-64: the aarch64 wheel of 1.9.1
fails to import without Arm Performance Libraries, which pip does not ship.

Conversion happens here, in the parent (numpy 2, protobuf): `caffe_to_mxnet` turns the checked
NetDef into an MXNet symbol JSON (the format `mx.sym.load` reads) and an .npz of its float32
params, cached under `<cache_dir>/<caffemodel sha256>/mxnet-symbol-fp32.json` and
`mxnet-params-fp32.npz` (tracker.model.convert.cache). The child (tracker.backends.mxnet_child)
binds the symbol with `simple_bind` and runs it.

mxnet-openblas     MKLDNN disabled (MXNET_MKLDNN_ENABLED=0, MXNET_SUBGRAPH_BACKEND=NONE in the
                   child): MXNet's own CPU operators, convolution as im2col + OpenBLAS sgemm (the
                   OpenBLAS bundled in the wheel), pooling and activations as plain loops: the
                   study's configuration E.
mxnet-openblas-dl  MKLDNN (oneDNN 2.4, compiled into the 1.9.1 wheel) enabled with its graph
                   pass (MXNET_SUBGRAPH_BACKEND=MKLDNN: convolution+ReLU fused into one oneDNN
                   primitive, blocked layouts, JIT kernels): MXNet's deep-learning CPU path,
                   configuration F.
Threads: OMP_NUM_THREADS (and OpenBLAS's) in the child = `threads` (default: every usable core).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import ClassVar

import numpy as np

from tracker.backends.base import BackendBase
from tracker.errors import BackendUnavailable, InputError, ModelError
from tracker.files import load_npz
from tracker.machine import cores
from tracker.model.spec import ModelSpec
from tracker.types import Inference

ROOT = Path(__file__).resolve().parents[2]
SETUP_COMMAND = "scripts/setup-mxnet"
PYTHON_ENV = "TRACKER_MXNET_PYTHON"  # overrides the interpreter (default: <repo>/.venv-mxnet/bin/python)
MXNET_VERSION = 10901  # written into the symbol JSON, as mx.sym.save does
SUPPORTED = ("Convolution", "Pooling", "ReLU", "Sigmoid", "TanH", "InnerProduct", "Softmax", "Dropout", "Flatten")
_POOL_MAX, _POOL_AVE = 0, 1  # caffe PoolingParameter.PoolMethod
_ROUND_FLOOR = 1  # caffe PoolingParameter.RoundMode


def mxnet_python() -> Path:
    """The MXNet environment's interpreter: $TRACKER_MXNET_PYTHON, else <repo>/.venv-mxnet/bin/python."""
    env = os.environ.get(PYTHON_ENV)
    return Path(env).expanduser() if env else ROOT / ".venv-mxnet" / "bin" / "python"



# ----------------------------------------------------------------------------- conversion


def _tuple(values) -> str:
    """MXNet's attribute syntax for a shape-like tuple: "(7, 7)"."""
    return "(" + ", ".join(str(int(v)) for v in values) + ")"


class _SymbolWriter:
    """Builds the node list of an MXNet symbol JSON: variables ("null" ops) and operators."""

    def __init__(self) -> None:
        self.nodes: list[dict] = []
        self.arg_nodes: list[int] = []

    def var(self, name: str) -> int:
        self.nodes.append({"op": "null", "name": name, "inputs": []})
        self.arg_nodes.append(len(self.nodes) - 1)
        return len(self.nodes) - 1

    def op(self, op: str, name: str, inputs: list[int], **attrs) -> int:
        node: dict[str, object] = {"op": op, "name": name, "inputs": [[i, 0, 0] for i in inputs]}
        if attrs:
            node["attrs"] = {k: str(v) for k, v in attrs.items()}
        self.nodes.append(node)
        return len(self.nodes) - 1

    def json(self, heads: list[int]) -> str:
        return json.dumps({"nodes": self.nodes, "arg_nodes": self.arg_nodes, "heads": [[h, 0, 0] for h in heads],
                           "attrs": {"mxnet_version": ["int", MXNET_VERSION]}}, indent=1)


def caffe_to_mxnet(netdef, probs: str, embedding: str) -> tuple[str, dict[str, np.ndarray]]:
    """Convert a loaded Caffe net to (symbol JSON, params); the data variable is the input blob's name.

    The symbol's outputs are [probs, embedding]: the last versions of those blobs (read after
    in-place layers, as Caffe reads them). Params are float32, named "<layer>_weight" /
    "<layer>_bias" in MXNet's layouts, which for these layers are Caffe's: convolution
    (O, I/group, kh, kw), fully connected (num_output, K) (Caffe's `transpose` undone here).
    Caffe semantics kept exactly:
    - Pooling rounds up (Caffe's CEIL, MXNet pooling_convention "full"; FLOOR -> "valid"); where
      Caffe also drops a last window that would start in the padding, a slice_axis drops it;
      AVE divides by the window clipped to size + pad, which is MXNet's count_include_pad=True.
    - InnerProduct flattens from axis 1 (MXNet FullyConnected flatten=True); Flatten from axis 1.
    - ReLU with negative_slope becomes LeakyReLU; Dropout is the identity at test time.
    Raises ModelError naming the layer for anything else (other layer types, e.g. LRN or
    Concat; N-d convolution; other axes; STOCHASTIC pooling; more than one input).
    """
    from tracker.model.shapes import conv_geometry, infer_shapes, pool_geometry

    if len(netdef.inputs) != 1:
        raise ModelError(f"net {netdef.name!r}: {len(netdef.inputs)} inputs; the MXNet converter takes exactly one (N, C, H, W) input")
    input_name, input_shape = next(iter(netdef.inputs.items()))
    if len(input_shape) != 4:
        raise ModelError(f"net {netdef.name!r}: input {input_name!r} has shape {input_shape}; the MXNet converter expects (N, C, H, W)")
    shapes = infer_shapes(netdef, 1)
    w = _SymbolWriter()
    blob = {input_name: w.var(input_name)}  # blob name -> node producing its current version
    params: dict[str, np.ndarray] = {}

    def unsupported(layer, what: str) -> ModelError:
        return ModelError(f"layer {layer.name!r} ({layer.type}): {what} is not supported by the MXNet converter")

    def weights(layer, arrays: dict[str, np.ndarray]) -> list[int]:
        ids = []
        for suffix, array in arrays.items():
            key = f"{layer.name}_{suffix}"
            params[key] = np.ascontiguousarray(array, np.float32)
            ids.append(w.var(key))
        return ids

    for layer in netdef.layers:
        if layer.type not in SUPPORTED:
            raise ModelError(f"layer {layer.name!r}: type {layer.type!r} is not supported by the MXNet converter; "
                             f"supported: {', '.join(SUPPORTED)}")
        if len(layer.bottoms) != 1 or len(layer.tops) != 1:
            raise unsupported(layer, f"{len(layer.bottoms)} bottoms and {len(layer.tops)} tops (expected 1 and 1)")
        src, top = blob[layer.bottoms[0]], layer.tops[0]
        bottom_shape = shapes[layer.bottoms[0]]
        t = layer.type
        if t == "Convolution":
            p = layer.param.convolution_param
            if p.axis != 1 or len(bottom_shape) != 4:
                raise unsupported(layer, f"a convolution over axis {p.axis} of a {len(bottom_shape)}-D blob (expected 2-D NCHW)")
            g = conv_geometry(layer, 2)
            arrays = {"weight": layer.blobs[0]}
            if p.bias_term:
                arrays["bias"] = layer.blobs[1]
            node = w.op("Convolution", layer.name, [src, *weights(layer, arrays)], kernel=_tuple(g.kernel),
                        stride=_tuple(g.stride), pad=_tuple(g.pad), dilate=_tuple(g.dilation), num_filter=p.num_output,
                        num_group=p.group, no_bias=not p.bias_term)
        elif t == "Pooling":
            p = layer.param.pooling_param
            if p.pool not in (_POOL_MAX, _POOL_AVE):
                raise unsupported(layer, "STOCHASTIC pooling")
            pg = pool_geometry(layer, bottom_shape)
            convention = "valid" if p.round_mode == _ROUND_FLOOR else "full"
            node = w.op("Pooling", layer.name, [src], kernel=_tuple(pg.kernel), stride=_tuple(pg.stride), pad=_tuple(pg.pad),
                        pool_type="max" if p.pool == _POOL_MAX else "avg", pooling_convention=convention,
                        count_include_pad=True)
            for axis, size, k, s, pad, want in zip((2, 3), bottom_shape[2:], pg.kernel, pg.stride, pg.pad, pg.out):
                span = size + 2 * pad - k
                got = (span // s if convention == "valid" else -(-span // s)) + 1
                if got != want:  # Caffe's clip of a window starting in the padding
                    node = w.op("slice_axis", f"{layer.name}_clip{axis}", [node], axis=axis, begin=0, end=want)
        elif t == "ReLU":
            slope = layer.param.relu_param.negative_slope
            node = (w.op("Activation", layer.name, [src], act_type="relu") if slope == 0
                    else w.op("LeakyReLU", layer.name, [src], act_type="leaky", slope=repr(float(slope))))
        elif t in ("Sigmoid", "TanH"):
            node = w.op("Activation", layer.name, [src], act_type="sigmoid" if t == "Sigmoid" else "tanh")
        elif t == "InnerProduct":
            p = layer.param.inner_product_param
            if p.axis != 1:
                raise unsupported(layer, f"axis {p.axis} (expected 1)")
            arrays = {"weight": layer.blobs[0].T if p.transpose else layer.blobs[0]}
            if p.bias_term:
                arrays["bias"] = layer.blobs[1]
            node = w.op("FullyConnected", layer.name, [src, *weights(layer, arrays)], num_hidden=p.num_output,
                        no_bias=not p.bias_term, flatten=True)
        elif t == "Softmax":
            axis = layer.param.softmax_param.axis
            node = w.op("softmax", layer.name, [src], axis=axis if axis >= 0 else axis + len(bottom_shape))
        elif t == "Dropout":
            node = src
        else:  # Flatten
            p = layer.param.flatten_param
            if p.axis != 1 or p.end_axis not in (-1, len(bottom_shape) - 1):
                raise unsupported(layer, f"flattening axes {p.axis}..{p.end_axis} (expected 1..-1)")
            node = w.op("Flatten", layer.name, [src])
        blob[top] = node
    for role, name in (("probs", probs), ("embedding", embedding)):
        if name not in blob:
            raise ModelError(f"net {netdef.name!r}: {role} blob {name!r} is not in the net; blobs are {', '.join(blob)}")
    return w.json([blob[probs], blob[embedding]]), params


def convert(model: ModelSpec, cache_dir: Path | None = None) -> tuple[Path, Path, str, tuple[int, ...]]:
    """(symbol JSON path, params .npz path, input name, input (C, H, W)) for `model`, from the cache
    or converted now. The input is read from the prototxt, which the cache key covers."""
    from tracker.model.caffe_io import load_net
    from tracker.model.convert.cache import entry_for, fetch

    converted: dict = {}

    def converted_net():
        if not converted:
            netdef = load_net(model.prototxt, model.weights)
            converted["net"] = caffe_to_mxnet(netdef, model.probs, model.embedding)
        return converted["net"]

    def write_symbol(path: Path) -> None:
        path.write_text(converted_net()[0], encoding="utf-8")

    def write_params(path: Path) -> None:
        with open(path, "wb") as f:  # a file object: np.savez would append ".npz" to the temporary name
            np.savez(f, **converted_net()[1])

    def check_symbol(path: Path) -> Path:
        graph = json.loads(path.read_text(encoding="utf-8"))
        if not graph.get("nodes") or not graph.get("heads"):
            raise ValueError("not an MXNet symbol")
        return path

    def check_params(path: Path) -> Path:
        with load_npz(path) as stored:
            stored.files  # noqa: B018 - reading the index proves the archive is whole
        return path

    symbol = fetch(entry_for(model, "mxnet-symbol", "fp32", ".json", None, cache_dir), write_symbol, check_symbol)
    params = fetch(entry_for(model, "mxnet-params", "fp32", ".npz", None, cache_dir), write_params, check_params)
    structure = load_net(model.prototxt, None)
    input_name, input_shape = next(iter(structure.inputs.items()))
    return symbol, params, input_name, tuple(input_shape[1:])


# ----------------------------------------------------------------------------- backends


class _MXNet(BackendBase):
    """An MXNet configuration: the converted net run in a worker child on the MXNet interpreter."""

    runs_in_worker: ClassVar[bool] = True
    mkldnn: ClassVar[bool]
    options: ClassVar[tuple[str, ...]] = ("cache_dir", "python", "worker_options")

    @classmethod
    def check_runtime(cls) -> None:
        machine = platform.machine().lower()
        if machine not in ("x86_64", "amd64"):
            raise BackendUnavailable(
                f"backend {cls.name!r}: MXNet 1.9.1 runs only on x86-64 here (this machine is {machine}); its aarch64 "
                f"wheel needs Arm Performance Libraries, which pip does not ship")
        python = mxnet_python()
        if not python.exists():
            raise BackendUnavailable(
                f"backend {cls.name!r}: the MXNet environment is missing ({python} does not exist); "
                f"create it with: {SETUP_COMMAND}")
        if not list(python.parent.parent.glob("lib/python3*/site-packages/mxnet/__init__.py")):
            raise BackendUnavailable(
                f"backend {cls.name!r}: MXNet is not installed in the environment of {python}; "
                f"create it with: {SETUP_COMMAND}")

    def __init__(self, model: ModelSpec, *, precision: str = "fp32", threads: int | None = None, cache_dir=None,
                 python=None, worker_options: dict | None = None, **unknown):
        from tracker.backends.worker import WorkerBackend

        if unknown:
            raise InputError(f"backend {self.name!r}: unknown option {sorted(unknown)[0]!r}; expected options: {', '.join(self.options)}")
        if precision not in self.precisions:
            raise InputError(f"precision: backend {self.name!r} runs {', '.join(self.precisions)}; found {precision!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise InputError(f"threads: expected a positive integer or None; found {threads!r}")
        self.model = model
        symbol, params, input_name, chw = convert(model, Path(cache_dir) if cache_dir is not None else None)
        n = threads or cores()
        env = {
            # the child must see its own environment's numpy, never the product's
            "PYTHONPATH": None, "PYTHONHOME": None,
            "OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
            "MXNET_MKLDNN_ENABLED": int(self.mkldnn),
            "MXNET_SUBGRAPH_BACKEND": "MKLDNN" if self.mkldnn else "NONE",
            # without MKLDNN, MXNet warns on every operator that it falls back to its own kernels
            "MXNET_STORAGE_FALLBACK_LOG_VERBOSE": 0,
        }
        self._worker = WorkerBackend(
            self.name, model, precision, threads, target="tracker.backends.mxnet_child:MXNetSymbol",
            options={"symbol": str(symbol), "params": str(params), "input_name": input_name, "mkldnn": self.mkldnn},
            python=python or mxnet_python(), env=env, input_shape=chw, **(worker_options or {}))
        self.input_shape = self._worker.input_shape
        self.runtime_versions = self._worker.runtime_versions

    @property
    def worker(self):
        """The WorkerBackend running this configuration (pid, output_text())."""
        return self._worker

    def interrupt(self) -> None:
        """The guard is stopping: its worker's waits end (WorkerBackend.interrupt)."""
        self._worker.interrupt()

    def child_peak_rss_kb(self) -> int | None:
        """Peak resident memory (KiB) of the MXNet worker child (see WorkerBackend)."""
        return self._worker.child_peak_rss_kb()

    def infer(self, x: np.ndarray) -> Inference:
        """x (N, C, H, W) float32 -> Inference; WorkerFailure (a BackendFailure) if the child fails."""
        return self._worker.infer(x)

    def close(self) -> None:
        self._worker.close()


class MXNetOpenBLAS(_MXNet):
    """mxnet-openblas: MXNet's own operators with OpenBLAS, MKLDNN off (configuration E)."""

    name = "mxnet-openblas"
    mkldnn = False


class MXNetOpenBLASDL(_MXNet):
    """mxnet-openblas-dl: MXNet with MKLDNN (oneDNN) operators and graph fusion on (configuration F)."""

    name = "mxnet-openblas-dl"
    mkldnn = True
