#!/usr/bin/env python3
"""Where a backend's forward time goes, against the raw runtime it wraps (issue 16, item 1).

    .venv/bin/python scripts/backend_overhead.py [--backends onnxruntime,tf-neon-vfpv4,tf-vanilla,opencv-dnn,
                                                  caffe-openblas-dl,auto] [--precisions fp32,int8]
                                                 [--batches 1,8,64,256] [--seconds 0.5] [--rounds 5] [--json FILE]

For each backend, precision and batch size, four variants are timed in this one process,
interleaved: a round runs every variant for --seconds (at least one call), in an order that
rotates from round to round, for --rounds rounds; a variant's figure is the median of all its
per-call times, in milliseconds per image.

  raw      the runtime itself on the model of ../shared/bench/peer_bench.py (found through
           tracker.shared_data; the project's reference for speed ratios: random weights, the same
           shapes), loaded at run time: onnxruntime, litert-xnnpack (tf-neon-vfpv4), tensorflow
           (tf-vanilla), opencv-dnn, numpy-im2col (caffe-openblas*). fp32 only.
  file     the runtime with its default options on the backend's own converted file
           (onnxruntime, tf-neon-vfpv4, tf-vanilla). int8 has no raw: its int8 file is the reference.
  session  the backend's own runtime object called directly, without the wrapper's checks and
           conversions (ONNX Runtime session, LiteRT interpreter, tf.function, OpenCV net, engine Net).
  backend  backend.infer(x): the whole wrapper.

Prints one table: the four medians, backend/raw (the issue's target: within 1.10x), backend/file
(the reference for int8), and the wrapper's cost per call in microseconds (backend - session); "!"
marks a ratio above its target. An `auto` row per precision and batch times create_backend("auto")
against every raw runtime (int8: every int8 file) and every other backend of the run in the same
rounds: its ratio to the fastest of them (target 1.05x), the backend it picked (Auto.pick) and its
dispatch cost per call (auto - the picked backend's infer). Before the table, once per backend and
precision, what differs between the converted graph and the raw one (ops, layers, ONNX Runtime's
optimised graphs, session options, XNNPACK partitions, threads). Also printed: the machine, its
cores and the load average before and after. A missing runtime, a precision a backend lacks or a
missing peer_bench.py is one line, and the run goes on without it. --json FILE writes all of it.

The run's length: about variants x --rounds x --seconds per cell, plus one untimed call per
variant, except where one call takes longer than --seconds: numpy-im2col is several times slower
than the runtimes (~40 ms per image on a 2-core EPYC VM, so ~10 s per call at batch 256), and its
one call per round then sets the length of the caffe and the fp32 auto cells.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import io
import json
import os
import platform
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracker.blas_idle import bound_idle_spin  # noqa: E402

bound_idle_spin()  # before numpy loads OpenBLAS, as the `tracker` command does

import numpy as np  # noqa: E402

# TensorFlow's C++ info chatter off (tracker.backends.tensorflow does the same when it imports it).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tracker import shared_data  # noqa: E402
from tracker.arguments import ArgumentParser, batch_list, file_to_write, positive_float, positive_int  # noqa: E402
from tracker.backends import REGISTRY, availability, backend_class, create_backend  # noqa: E402
from tracker.bench.interleave import time_interleaved  # noqa: E402
from tracker.errors import TrackerError  # noqa: E402
from tracker.files import atomic_write  # noqa: E402
from tracker.machine import cores, cpu_model, load_average  # noqa: E402
from tracker.model.convert import convert  # noqa: E402
from tracker.model.spec import ModelSpec, default_model  # noqa: E402

PEER_BENCH = "bench/peer_bench.py"  # relative to the shared data folder
DEFAULT_BACKENDS = "onnxruntime,tf-neon-vfpv4,tf-vanilla,opencv-dnn,caffe-openblas-dl,auto"
# backend -> peer_bench's runner of the same runtime. The caffe backends run the project's own
# engine: numpy-im2col (per-image im2col + sgemm through numpy's BLAS) is Caffe's algorithm, raw.
RAW = {"onnxruntime": "onnxruntime", "tf-neon-vfpv4": "litert-xnnpack", "tf-vanilla": "tensorflow",
       "opencv-dnn": "opencv-dnn", "caffe-openblas-dl": "numpy-im2col", "caffe-openblas": "numpy-im2col"}
# backend -> the converter target of the file it runs (tracker.model.convert.TARGETS). opencv-dnn
# and the caffe backends read the Caffe files as they are: no file variant.
FILE_TARGET = {"onnxruntime": "onnx", "tf-neon-vfpv4": "tflite", "tf-vanilla": "tf"}
TARGET = 1.10  # issue 16: every backend within 1.10x of its raw runtime
AUTO_TARGET = 1.05  # ... and auto within 1.05x of the fastest raw runtime at each batch size
INPUT = (1, 88, 88)  # the face CNN's (C, H, W); peer_bench's runners are fixed to it
ORT_OPTIONS = ("intra_op_num_threads", "inter_op_num_threads", "execution_mode", "execution_order",
               "graph_optimization_level", "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse",
               "use_deterministic_compute", "use_per_session_threads")
ORT_CONFIG_ENTRIES = ("session.intra_op.spin_duration_us", "session.force_spinning_stop", "session.intra_op.allow_spinning",
                      "session.inter_op.allow_spinning")

Runner = Callable[[np.ndarray], Any]  # f(x), x (N, 1, 88, 88) float32 NCHW; the result is not used


# ---- arguments --------------------------------------------------------------------------


def name_list(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    """argparse type: a comma-separated list of names out of `allowed`; repeats dropped."""

    def parse(text: str) -> list[str]:
        values = [item.strip() for item in text.split(",")]
        bad = [v for v in values if v not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"bad value {bad[0]!r}; expected a comma-separated list out of {', '.join(allowed)}")
        return list(dict.fromkeys(values))

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options (module docstring); a bad one raises InputError (one line, exit 2)."""
    p = ArgumentParser(prog="backend_overhead.py", description=__doc__.splitlines()[0])
    p.add_argument("--backends", type=name_list(tuple(REGISTRY)), default=name_list(tuple(REGISTRY))(DEFAULT_BACKENDS),
                   help=f"comma list (default {DEFAULT_BACKENDS})")
    p.add_argument("--precisions", type=name_list(("fp32", "int8")), default=["fp32", "int8"], help="comma list (default fp32,int8)")
    p.add_argument("--batches", type=batch_list, default=[1, 8, 64, 256], help="comma list (default 1,8,64,256)")
    p.add_argument("--seconds", type=positive_float, default=0.5, help="per variant per round (default 0.5)")
    p.add_argument("--rounds", type=positive_int, default=5, help="rounds over the variants (default 5)")
    # checked now, not after the whole run
    p.add_argument("--json", type=file_to_write("a file to write in an existing folder"), help="also write the results to this file")
    return p.parse_args(argv)


# ---- the runners --------------------------------------------------------------------------


def nhwc(x: np.ndarray) -> np.ndarray:
    """x (N, 1, H, W) as (N, H, W, 1): with one channel NCHW -> NHWC is a reshape, not a copy."""
    n, _, h, w = x.shape
    return x.reshape(n, h, w, 1)


def load_peer_bench() -> tuple[ModuleType | None, str]:
    """peer_bench.py from the shared data, imported as a module: (module, its path), or (None, the
    one line saying why there is no raw column)."""
    path = shared_data.find(PEER_BENCH)
    if path is None:
        looked = ", ".join(str(p) for p in shared_data.candidates(PEER_BENCH)) or f"${shared_data.ENV} is not set"
        return None, f"raw: {PEER_BENCH} not found in the shared data (looked in {looked}); going on without the raw column"
    try:
        spec = importlib.util.spec_from_file_location("peer_bench", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # registered as imported: TensorFlow's AutoGraph looks a function's module up there to
        # compile its tf.function (the tensorflow runner's), and runs it unconverted otherwise
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    except Exception as err:  # whatever the file does wrong, the rest of the run does not need it
        return None, f"raw: cannot import {path} ({type(err).__name__}: {err}); going on without the raw column"
    return module, str(path)


class RawRunners:
    """peer_bench's runners by runtime name, each made on first use and kept for the whole run
    (one model per runtime, like peer_bench itself). get() is None where peer_bench is missing
    or the runtime cannot be made (said once, in one line)."""

    def __init__(self, peer: ModuleType | None, tmpdir: str):
        self._makers: dict[str, Callable[[], Runner]] = peer.runners(tmpdir) if peer is not None else {}
        self._made: dict[str, Runner | None] = {}

    @property
    def names(self) -> list[str]:
        return list(self._makers)

    def get(self, runtime: str) -> Runner | None:
        if runtime not in self._made:
            maker, runner = self._makers.get(runtime), None
            if maker is not None:
                try:
                    # Keras's exporter prints the saved model's signature when LiteRT's is converted
                    with contextlib.redirect_stdout(io.StringIO()):
                        runner = maker()
                except Exception as err:  # a missing or broken runtime: peer_bench reports and skips it too
                    print(f"raw {runtime}: unavailable ({type(err).__name__}: {err})", flush=True)
            self._made[runtime] = runner
        return self._made[runtime]


def captured(runner: Runner | None, name: str) -> Any:
    """The variable `name` that a peer_bench runner closes over (it keeps its model objects --
    the LiteRT flatbuffer, the OpenCV net -- only there), or None."""
    try:
        return inspect.getclosurevars(runner).nonlocals.get(name) if runner is not None else None
    except TypeError:
        return None


def litert_runner(content: bytes) -> Runner:
    """A LiteRT interpreter with its default options (XNNPACK applied by LiteRT, num_threads = the
    cores) on a flatbuffer. Its shapes are fixed: it is made and resized once per batch size, at
    the first call with that size (the warm-up call), and re-made only when the size changes."""
    from ai_edge_litert.interpreter import Interpreter

    state: dict[str, Any] = {"n": None}

    def run(x: np.ndarray):
        if state["n"] != x.shape[0]:
            it = Interpreter(model_content=content, num_threads=cores())
            data = it.get_input_details()[0]["index"]
            it.resize_tensor_input(data, list(nhwc(x).shape))
            it.allocate_tensors()
            state.update(n=x.shape[0], it=it, data=data, outputs=[d["index"] for d in it.get_output_details()])
        it = state["it"]
        it.set_tensor(state["data"], nhwc(x))
        it.invoke()
        return [it.get_tensor(i) for i in state["outputs"]]

    return run


def file_runner(name: str, spec: ModelSpec, precision: str) -> Runner | None:
    """The runtime with its default options on backend `name`'s converted file (the converter
    cache's, the same file the backend loaded), or None where the backend runs no converted file."""
    target = FILE_TARGET.get(name)
    if target is None:
        return None
    path = convert(spec, target, precision)
    if target == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda x: session.run(None, {"data": x})
    if target == "tflite":
        return litert_runner(path.read_bytes())
    import keras
    import tensorflow as tf

    import tracker.model.convert.keras  # noqa: F401  (registers the model's custom layers)

    model = keras.saving.load_model(path, compile=False)
    fn = tf.function(lambda t: model(t, training=False))  # traced per batch size, at the warm-up call
    return lambda x: {k: v.numpy() for k, v in fn(tf.constant(nhwc(x))).items()}


def session_runner(name: str, backend, spec: ModelSpec, n: int) -> Runner | None:
    """Backend `name`'s own runtime object, called as its infer() calls it but without the input
    checks and the output conversions, for batches of `n`; None where
    there is no such object (a worker backend, nnpack). For `auto`: the infer() of the backend it
    picked for `n` (so backend - session is auto's dispatch). It reads the backends' private
    attributes (`_session`, `_interpreter`, `_fn`, `_net`, ...): this is a measuring tool, and
    must follow the backends when they change."""
    if name == "onnxruntime":
        session, names = backend._session, ["prob", "embedding"]
        return lambda x: session.run(names, {"data": x})
    if name == "tf-neon-vfpv4":
        it = backend._interpreter(n)  # the interpreter infer() uses for this batch size
        data, outputs = backend._input, (backend._prob, backend._embedding)

        def invoke(x: np.ndarray):
            it.set_tensor(data, nhwc(x))
            it.invoke()
            return [it.get_tensor(i) for i in outputs]

        return invoke
    if name == "tf-vanilla":
        fn, tf = backend._fn, backend._tf
        return lambda x: {k: v.numpy() for k, v in fn(tf.constant(nhwc(x))).items()}
    if name == "opencv-dnn":
        net, blobs = backend._net, backend._outputs

        def forward(x: np.ndarray):
            net.setInput(x)
            return net.forward(blobs)

        return forward
    if name in ("caffe-openblas", "caffe-openblas-dl"):
        engine, wanted = backend._net, [spec.probs, spec.embedding]
        return lambda x: engine.forward(x, wanted)
    if name == "auto":
        return backend._backend(n).infer
    return None


# ---- timing --------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def measure_backend(name: str, precision: str, backend, spec: ModelSpec, x: np.ndarray, raw: RawRunners,
                    files: dict[tuple[str, str], Runner | None], args: argparse.Namespace) -> dict:
    """One table row: the raw, file, session and backend variants of (name, precision) at x's batch size."""
    n = x.shape[0]
    variants: dict[str, Runner] = {}
    runtime = RAW.get(name) if precision == "fp32" else None  # peer_bench's models are float
    raw_runner = raw.get(runtime) if runtime else None
    if raw_runner is not None:
        variants["raw"] = raw_runner
    if (name, precision) not in files:
        files[(name, precision)] = file_runner(name, spec, precision)
    file = files[(name, precision)]
    if file is not None:
        variants["file"] = file
    session = session_runner(name, backend, spec, n)
    if session is not None:
        variants["session"] = session
    variants["backend"] = backend.infer
    timed = time_interleaved(variants, x, args.seconds, args.rounds)
    ms = {v: 1000 * s / n for v, (s, _) in timed.items()}
    wrapper = 1000 * n * (ms["backend"] - ms["session"]) if "session" in ms else None  # us per call
    return {"backend": name, "precision": precision, "batch": n, "ms_per_image": ms,
            "calls": {v: c for v, (_, c) in timed.items()}, "raw_runtime": runtime if raw_runner is not None else None,
            "reference": "raw" if "raw" in ms else "file" if "file" in ms else None,
            "ratio_raw": ratio(ms["backend"], ms.get("raw")), "ratio_file": ratio(ms["backend"], ms.get("file")),
            "wrapper_us": wrapper, "target": TARGET}


def measure_auto(precision: str, auto, spec: ModelSpec, x: np.ndarray, references: dict[str, Runner],
                 args: argparse.Namespace) -> dict:
    """The `auto` row at x's batch size: auto, the backend it picked (session) and the references
    (fp32: "raw:<runtime>" for every peer_bench runtime; int8: "file:<backend>" for every int8
    file; both: "backend:<name>" for every other backend timed in this run) in the same rounds;
    ratio_raw is auto / the fastest reference."""
    n = x.shape[0]
    variants: dict[str, Runner] = dict(references)
    picked = session_runner("auto", auto, spec, n)
    assert picked is not None  # auto always has the backend it picked
    variants["session"] = picked
    variants["backend"] = auto.infer
    timed = time_interleaved(variants, x, args.seconds, args.rounds)
    ms = {v: 1000 * s / n for v, (s, _) in timed.items()}
    fastest = min(references, key=lambda r: ms[r]) if references else None
    return {"backend": "auto", "precision": precision, "batch": n, "ms_per_image": ms,
            "calls": {v: c for v, (_, c) in timed.items()}, "picked": auto.pick(n), "reference": fastest,
            "ratio_raw": ratio(ms["backend"], ms[fastest]) if fastest else None, "ratio_file": None,
            "wrapper_us": 1000 * n * (ms["backend"] - ms["session"]), "target": AUTO_TARGET}


# ---- what differs between the converted graph and the raw one -----------------------------


def op_difference(raw_ops: list[str], converted_ops: list[str]) -> str:
    """"only in raw: ...; only in converted: ..." counting repeats (Conv x2)."""
    def show(counts: Counter) -> str:
        return ", ".join(f"{op} x{k}" if k > 1 else op for op, k in sorted(counts.items())) or "nothing"

    raw, conv = Counter(raw_ops), Counter(converted_ops)
    return f"only in raw: {show(raw - conv)}; only in converted: {show(conv - raw)}"


def ort_optimized_ops(path: Path, tmpdir: str) -> list[str]:
    """The op types of `path` after ONNX Runtime's default graph optimisation (what a default
    session executes): "nchwc:Conv" for an op of the com.microsoft.nchwc domain, "FusedGemm" for
    com.microsoft's own."""
    import onnx
    import onnxruntime as ort

    out = Path(tmpdir) / f"optimized-{path.name}"
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(out)
    options.log_severity_level = 3  # its warning: the saved graph holds this CPU's layout ops (what is shown)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = []
    for node in onnx.load(str(out)).graph.node:
        domain = node.domain.removeprefix("com.microsoft").strip(".")
        names.append(f"{domain}:{node.op_type}" if domain else node.op_type)
    return names


def describe_onnx(backend, precision: str, spec: ModelSpec, peer: ModuleType | None, tmpdir: str) -> list[str]:
    import onnx
    import onnxruntime as ort

    files = {"converted": convert(spec, "onnx", precision)}
    if peer is not None:
        files["raw"] = Path(peer.onnx_model(os.path.join(tmpdir, "raw-describe.onnx")))
    lines = []
    ops = {k: [node.op_type for node in onnx.load(str(p)).graph.node] for k, p in files.items()}
    optimized = {k: ort_optimized_ops(p, tmpdir) for k, p in files.items()}
    for k in files:
        lines.append(f"{k} graph ({files[k].name}): {' '.join(ops[k])}")
    if "raw" in files:
        lines.append(op_difference(ops["raw"], ops["converted"]))
    for k in files:
        lines.append(f"{k} graph as a default session runs it: {' '.join(optimized[k])}")
    if "raw" in files:
        lines.append(f"optimised, {op_difference(optimized['raw'], optimized['converted'])}")
    used, default = backend._session.get_session_options(), ort.SessionOptions()
    differ = [f"{a} {getattr(used, a)} (default {getattr(default, a)})" for a in ORT_OPTIONS
              if str(getattr(used, a)) != str(getattr(default, a))]
    differ += [f"{key} {value} (default unset)" for key in ORT_CONFIG_ENTRIES if (value := config_entry(used, key)) is not None]
    lines.append(f"backend's session options that differ from the defaults (raw and file use the defaults; "
                 f"0 threads: one per physical core): {', '.join(differ) or 'none'}")
    return lines


def config_entry(options, key: str) -> str | None:
    """An ONNX Runtime session's config entry (add_session_config_entry), None where it is not set."""
    try:
        return options.get_session_config_entry(key)
    except RuntimeError:  # ONNX Runtime's answer for a key that was never set
        return None


def tflite_ops(content: bytes) -> tuple[list[str], int]:
    """The ops of a flatbuffer and the number of XNNPACK partitions (DELEGATE nodes) LiteRT made."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=content, num_threads=cores())
    ops = [op["op_name"] for op in it._get_ops_details()]
    it.allocate_tensors()  # LiteRT applies its default delegate here
    return ops, sum(op["op_name"] == "DELEGATE" for op in it._get_ops_details())


def describe_litert(backend, precision: str, spec: ModelSpec, raw_runner: Runner | None) -> list[str]:
    from ai_edge_litert.interpreter import Interpreter

    contents = {"converted": convert(spec, "tflite", precision).read_bytes()}
    buf = captured(raw_runner, "buf")
    if isinstance(buf, bytes):
        contents["raw"] = buf
    lines, ops = [], {}
    for k, content in contents.items():
        ops[k], partitions = tflite_ops(content)
        it = Interpreter(model_content=content)
        outputs = [f"{d['name']} {d['shape'].tolist()}" for d in it.get_output_details()]
        lines.append(f"{k} graph: {' '.join(ops[k])}; XNNPACK partitions: {partitions}; outputs: {', '.join(outputs)}")
    if "raw" in ops:
        lines.append(op_difference(ops["raw"], ops["converted"]))
    elif raw_runner is not None:
        lines.append("raw graph: peer_bench's LiteRT runner no longer keeps its flatbuffer as `buf`; not shown")
    lines.append(f"threads: backend {backend.threads}, raw {os.cpu_count()} (os.cpu_count), file {cores()}")
    return lines


def describe_tf(backend, peer: ModuleType | None) -> list[str]:
    import tensorflow as tf

    layers = {"converted": [type(layer).__name__ for layer in backend._model.layers]}
    if peer is not None:
        layers["raw"] = [type(layer).__name__ for layer in peer.keras_model().layers]
    lines = [f"{k} Keras layers: {' '.join(v)}" for k, v in layers.items()]
    if "raw" in layers:
        lines.append(op_difference(layers["raw"], layers["converted"]))
    lines.append(f"TensorFlow's thread pools are process-wide (raw and file share the backend's): intra-op "
                 f"{tf.config.threading.get_intra_op_parallelism_threads()}, inter-op "
                 f"{tf.config.threading.get_inter_op_parallelism_threads()} (0: TensorFlow's default)")
    return lines


def describe_opencv(backend, raw_runner: Runner | None) -> list[str]:
    import cv2

    nets = {"converted": backend._net}
    raw_net = captured(raw_runner, "net")
    if raw_net is not None:
        nets["raw"] = raw_net
    types = {k: [net.getLayer(name).type for name in net.getLayerNames()] for k, net in nets.items()}
    lines = ["converted is the Caffe files read by readNetFromCaffe; raw is peer_bench's ONNX model read by readNetFromONNX"]
    lines += [f"{k} layers: {' '.join(v)}" for k, v in types.items()]
    if "raw" in types:
        lines.append(op_difference(types["raw"], types["converted"]))
    lines.append(f"outputs: backend forward({backend._outputs}) (two blobs), raw forward() (the last layer's); "
                 f"threads (process-wide): {cv2.getNumThreads()}")
    return lines


def describe_caffe(backend) -> list[str]:
    net = backend._net
    return [f"engine mode {net.mode!r}, threads {net.threads or 'tuned per batch size (1 or all cores)'}; schedule:"] \
        + [f"  {step}" for step in net.describe()] \
        + ["raw (numpy-im2col): per image, im2col + one matmul per convolution, bias and ReLU as separate numpy passes, "
           "pooling by reshape + max, numpy's BLAS threads"]


def describe(name: str, precision: str, backend, spec: ModelSpec, peer: ModuleType | None, raw: RawRunners, tmpdir: str) -> list[str]:
    """Lines saying how backend `name`'s graph and settings differ from the raw runtime's."""
    raw_runner = raw.get(RAW[name]) if name in RAW else None
    if name == "onnxruntime":
        return describe_onnx(backend, precision, spec, peer, tmpdir)
    if name == "tf-neon-vfpv4":
        return describe_litert(backend, precision, spec, raw_runner)
    if name == "tf-vanilla":
        return describe_tf(backend, peer)
    if name == "opencv-dnn":
        return describe_opencv(backend, raw_runner)
    if name in ("caffe-openblas", "caffe-openblas-dl"):
        return describe_caffe(backend)
    return ["nothing to compare (no raw runtime in peer_bench for it)"]


# ---- output -------------------------------------------------------------------------------


def print_table(rows: list[dict]) -> None:
    """The results, one row per backend, precision and batch (see the module docstring)."""
    def ms(v: float | None) -> str:
        return f"{v:.4f}" if v is not None else "-"

    def times(v: float | None, target: float) -> str:
        return "-" if v is None else f"{v:.3f}{'!' if v > target else ' '}"

    print(f"\n{'backend':<18} {'prec':<4} {'batch':>5} {'raw':>8} {'file':>8} {'session':>8} {'backend':>8} "
          f"{'be/raw':>7} {'be/file':>7} {'wrap us':>8}  note")
    for row in rows:
        m = row["ms_per_image"]
        if row["backend"] == "auto":
            ref = row["reference"]
            raw_ms, note = m.get(ref) if ref else None, f"picks {row['picked']}; fastest reference {ref or 'none'}"
        else:
            raw_ms = m.get("raw")
            note = f"raw {row['raw_runtime']}" if row["raw_runtime"] else "reference: the int8 file" \
                if row["precision"] == "int8" and "file" in m else "no raw"
        wrap = f"{row['wrapper_us']:.1f}" if row["wrapper_us"] is not None else "-"
        print(f"{row['backend']:<18} {row['precision']:<4} {row['batch']:>5} {ms(raw_ms):>8} {ms(m.get('file')):>8} "
              f"{ms(m.get('session')):>8} {ms(m['backend']):>8} {times(row['ratio_raw'], row['target']):>7} "
              f"{times(row['ratio_file'], row['target']):>7} {wrap:>8}  {note}")
    print(f"ms per image (median per call / batch). be/raw: backend / raw, target <= {TARGET} (auto: / the fastest "
          f"reference, target <= {AUTO_TARGET}); int8 has no raw: be/file is its ratio. ! = above target. "
          "wrap us: backend - session per call (auto: auto - the picked backend).")


def run(args: argparse.Namespace) -> int:
    spec = default_model()
    result: dict[str, Any] = {
        "machine": {"cpu": cpu_model(), "cores": cores(), "cpu_count": os.cpu_count(), "arch": platform.machine(),
                    "system": platform.platform(), "load_average": {"start": load_average(), "end": None}},
        "settings": {k: getattr(args, k) for k in ("backends", "precisions", "batches", "seconds", "rounds")},
        "skipped": [], "graphs": {}, "rows": []}
    m = result["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores (os.cpu_count {m['cpu_count']}), {m['arch']}, {m['system']}")
    print(f"load average at start (1, 5, 15 min): {m['load_average']['start']}")
    print(f"settings: --seconds {args.seconds} per variant per round, --rounds {args.rounds}, batches {args.batches}")
    peer, where = load_peer_bench()
    result["peer_bench"] = where if peer is not None else None
    print(f"raw reference: {where}" if peer is not None else where, flush=True)
    x0 = np.random.default_rng(0).standard_normal((max(args.batches), *INPUT), dtype=np.float32)

    def skip(name: str, precision: str | None, why: str) -> None:
        print(f"skip {name}{' ' + precision if precision else ''}: {why}", flush=True)
        result["skipped"].append({"backend": name, "precision": precision, "why": why})

    # Every backend is created before any raw runner: TensorFlow fixes its thread pools when its
    # runtime starts (peer_bench's LiteRT and TF runners start it), and tf-vanilla sets them.
    backends: dict[tuple[str, str], Any] = {}
    for name in args.backends:
        why = availability(name)
        if why:
            skip(name, None, why)
            continue
        for precision in args.precisions:
            having = backend_class(name).precisions
            if precision not in having:
                skip(name, precision, f"it has no {precision} model (it runs {', '.join(having)})")
                continue
            try:
                backends[(name, precision)] = create_backend(name, spec, precision=precision)
            except TrackerError as err:
                skip(name, precision, str(err))
                continue
            if name == "auto":  # it creates what it picks on first use: now, for the same reason
                for n in args.batches:
                    backends[(name, precision)].infer(x0[:n])
    with tempfile.TemporaryDirectory() as tmpdir:
        raw = RawRunners(peer, tmpdir)
        for (name, precision), backend in backends.items():
            if name == "auto":
                continue
            try:
                lines = describe(name, precision, backend, spec, peer, raw, tmpdir)
            except Exception as err:  # the comparison is a diagnostic: the timing goes on without it
                lines = [f"cannot compare ({type(err).__name__}: {err})"]
            result["graphs"][f"{name} {precision}"] = lines
            print(f"\n{name} {precision}: converted against raw")
            print("\n".join(f"  {line}" for line in lines), flush=True)

        files: dict[tuple[str, str], Runner | None] = {}
        for (name, precision), backend in backends.items():
            for n in args.batches if name != "auto" else ():
                print(f"timing {name} {precision} batch {n}", file=sys.stderr, flush=True)
                result["rows"].append(measure_backend(name, precision, backend, spec, x0[:n], raw, files, args))
        for precision in args.precisions:
            auto = backends.get(("auto", precision))
            if auto is None:
                continue
            if precision == "fp32":
                references = {f"raw:{r}": f for r in raw.names if (f := raw.get(r)) is not None}
            else:  # no int8 raw: every int8 file a backend here can run
                references = {}
                for name in FILE_TARGET:
                    if precision in backend_class(name).precisions and availability(name) is None:
                        if (name, precision) not in files:
                            files[(name, precision)] = file_runner(name, spec, precision)
                        if (f := files[(name, precision)]) is not None:
                            references[f"file:{name}"] = f
            # ... and every backend timed here: a runtime's file with default options can be slower
            # than its backend (ONNX Runtime's int8), and auto must keep up with the backends too.
            references |= {f"backend:{name}": b.infer for (name, p), b in backends.items() if p == precision and name != "auto"}
            for n in args.batches:
                print(f"timing auto {precision} batch {n}", file=sys.stderr, flush=True)
                result["rows"].append(measure_auto(precision, auto, spec, x0[:n], references, args))
    for backend in backends.values():
        backend.close()
    print_table(result["rows"])
    m["load_average"]["end"] = load_average()
    print(f"load average at end (1, 5, 15 min): {m['load_average']['end']}")
    if args.json is not None:
        try:
            atomic_write(args.json, (json.dumps(result, indent=1, default=str) + "\n").encode())
        except OSError as err:
            print(f"--json {str(args.json)!r}: cannot write ({err.strerror or err}); expected a writable file path", file=sys.stderr)
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(parse_args(argv))
    except TrackerError as err:  # a bad option (exit 2), a bad model file: one line, no traceback
        print(str(err), file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
