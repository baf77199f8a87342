"""Caffe -> other engines: `tracker convert` and the cached conversions the backends load.

    tracker convert --to tf|tflite|onnx [--precision fp32|int8] [--prototxt P --weights W]
                    [--probs BLOB] [--embedding BLOB] [--calibration DIR] [--cache-dir D] [--out PATH]

Targets (each a single file, cached under `<cache_dir>/<caffemodel sha256>/`, see .cache; --out
for tf must end .keras, as keras.models.load_model reads no other name):
    tf      Keras 3 model (.keras), NHWC input "data", outputs {"prob", "embedding"}   fp32
    tflite  LiteRT flatbuffer (.tflite) from that Keras model, NHWC input               fp32, int8
    onnx    ONNX opset 17 (.onnx), NCHW input "data", outputs "prob", "embedding"      fp32, int8
int8 tflite is integer-only between its float parts (below): int8 ops, per-channel int8 weights,
one QUANTIZE in and a DEQUANTIZE before each float output or op; int8 onnx is ONNX Runtime static
quantisation (QDQ, per-channel int8 weights, uint8 activations). Both are calibrated on face crops
(.calibration: the face chips shipped with the package by default, or --calibration DIR), and both
have the outputs of fp32, "prob" and "embedding" in float32. Both keep two parts in float32
(graph.int8_float_ops says why): the final softmax, on the dequantised logits, and the layers
before the first pooling when the first convolution reads fewer than 4 channels (conv1 on the grey
image).

The pipeline: caffe_io.load_net -> graph.lower (Caffe's semantics made explicit, see .graph) ->
an emitter per engine (.keras, .onnx, .torch). Runtimes are imported only inside the functions
that need them. Without --out the command prints the cached file's path; with --out it also
copies the file there.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from tracker.arguments import ArgumentParser, path_to, refuse_overwriting
from tracker.errors import BackendUnavailable, InputError
from tracker.files import atomic_write, probe_writable
from tracker.model.convert.cache import default_cache_dir, entry_for, fetch
from tracker.native_stderr import tensorflow_chatter_left_out

T = TypeVar("T")

# target -> (file suffix, precisions, pip extra, modules building it needs (int8 adds the 4th))
TARGETS: dict[str, tuple[str, tuple[str, ...], str, tuple[str, ...], tuple[str, ...]]] = {
    "tf": (".keras", ("fp32",), "tf", ("tensorflow",), ()),
    "tflite": (".tflite", ("fp32", "int8"), "litert", ("tensorflow",), ("ai_edge_litert",)),
    "onnx": (".onnx", ("fp32", "int8"), "onnx", ("onnx",), ("onnxruntime",)),
}


def load_graph(model):
    """The lowered graph (.graph.Graph) of `model`, a ModelSpec; ModelError for bad files, and for
    a net the engine would refuse (`check_net`: its blobs' memory bound among them; lowering a
    300-megapixel input allocated gigabytes)."""
    from tracker.model.caffe_io import load_net
    from tracker.model.convert.graph import lower
    from tracker.model.engine import check_net

    netdef = load_net(model.prototxt, model.weights)
    check_net(netdef)
    return lower(netdef, model.probs, model.embedding)


def require_runtime(target: str, precision: str = "fp32") -> None:
    """BackendUnavailable (exit 3) naming the extra if building `target` cannot import what it
    needs. Only building needs these: a cached model is loaded by the runtime alone (the Pi runs
    a cached .tflite with ai-edge-litert, without TensorFlow's ~0.5 GB)."""
    _, _, extra, modules, int8_modules = TARGETS[target]
    for module in modules + (int8_modules if precision == "int8" else ()):
        if module == "tensorflow":  # fewer of TF's C++ info/warning lines, unless the user set a level (absl's
            # start-up lines come regardless: `convert` builds with them left out, tracker.native_stderr)
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        try:
            __import__(module)
        except ImportError as err:
            raise BackendUnavailable(
                f"convert --to {target}: module {module!r} is not importable "
                f"({err.__class__.__name__}: {err}); install it with: pip install -e '.[{extra}]'") from None


def convert(model, target: str, precision: str = "fp32", *,
            calibration: Path | np.ndarray | None = None, cache_dir: Path | None = None,
            load: Callable[[Path], T] | None = None):
    """`model` converted to `target` in `precision`, from the cache (built when missing, stale
    or corrupt). Returns load(path) -- the loader is how the cache verifies a file before use --
    or the path when `load` is None (then only the checksum is verified).

    calibration (int8 only): a folder of face images or an (N, C, H, W) array; default the
    shipped face chips. InputError for an unknown target or precision.
    """
    if target not in TARGETS:
        raise InputError(f"--to: unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    ext, precisions = TARGETS[target][:2]
    if precision not in precisions:
        having = [t for t, spec in TARGETS.items() if precision in spec[1]]
        raise InputError(f"--precision: target {target!r} has no {precision!r} form; targets "
                         f"with {precision!r}: {', '.join(having)}")
    from tracker.model.convert.calibration import sample_set

    samples = sample_set(calibration) if precision == "int8" else None
    entry = entry_for(model, target, precision, ext, samples.set_id if samples else None, cache_dir)
    builders = {"tf": _build_tf, "tflite": _build_tflite, "onnx": _build_onnx}

    def build(path: Path) -> None:
        with tensorflow_chatter_left_out():  # TensorFlow's, when the target needs it: its import and start
            require_runtime(target, precision)
            builders[target](load_graph(model), path, precision, samples)
    return fetch(entry, build, load or (lambda path: path))


@contextlib.contextmanager
def _quiet_stdout():
    """Keras's exporter prints to stdout; `tracker convert` keeps stdout for the result path."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


@contextlib.contextmanager
def _tensorflow_warnings_only():
    """TensorFlow's Python logger at WARNING for the block: the LiteRT converter writes a SavedModel
    on its way and logs "Assets written to: /tmp/..." at INFO for each, which `tracker convert`
    (logging from INFO, to say what it converts) showed as two lines of its own."""
    logger = logging.getLogger("tensorflow")
    before = logger.level
    logger.setLevel(max(before, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(before)


def _build_tf(graph, path: Path, precision: str, samples) -> None:
    from tracker.model.convert.keras import build_keras

    build_keras(graph).save(path)


def _build_tflite(graph, path: Path, precision: str, samples) -> None:
    import tensorflow as tf

    from tracker.model.convert.graph import final_softmax, int8_float_prefix
    from tracker.model.convert.keras import build_keras

    model = build_keras(graph)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    with _quiet_stdout(), _tensorflow_warnings_only(), warnings.catch_warnings():
        # "Statistics for quantized inputs were expected": the float32 input is quantised by the
        # model's own first op, with ranges from the representative data -- nothing is missing.
        warnings.filterwarnings("ignore", message="Statistics for quantized inputs")
        # the QuantizationDebugger (selective int8) runs TF's own deprecated tf.lite.Interpreter
        warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated")
        content = converter.convert()
        if precision == "int8":
            nhwc = samples.make(graph.input_shape).transpose(0, 2, 3, 1)
            converter = tf.lite.TFLiteConverter.from_keras_model(model)
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = lambda: ([np.ascontiguousarray(x[None])] for x in nhwc)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            keep = _tflite_float_tensors(content, bool(int8_float_prefix(graph)), final_softmax(graph) is not None)
            if keep:  # int8 except graph.int8_float_ops: TFLite's selective quantisation
                converter.target_spec.supported_ops.append(tf.lite.OpsSet.TFLITE_BUILTINS)
                debugger = tf.lite.experimental.QuantizationDebugger(
                    converter=converter, debug_dataset=lambda: ([np.ascontiguousarray(x[None])] for x in nhwc[:1]),
                    debug_options=tf.lite.experimental.QuantizationDebugOptions(denylisted_nodes=keep))
                content = debugger.get_nondebug_quantized_model()
            else:
                content = converter.convert()
    path.write_bytes(content)


def _tflite_float_tensors(content: bytes, prefix: bool, softmax: bool) -> list[str]:
    """Output tensor names of the float TFLite model's ops that make graph.int8_float_ops: with
    `prefix`, the ops up to and including the first pooling (TFLite fuses the ReLU into the
    conv, so the prefix is found by its pooling, not by op count); with `softmax`, the SOFTMAX
    op."""
    if not (prefix or softmax):
        return []
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    names = {t["index"]: t["name"] for t in interpreter.get_tensor_details()}
    ops = interpreter._get_ops_details()
    pooling = next((i for i, op in enumerate(ops) if op["op_name"] in ("MAX_POOL_2D", "AVERAGE_POOL_2D")), None)
    chosen = ops[:pooling + 1] if prefix and pooling is not None else []
    chosen += [op for op in ops if softmax and op["op_name"] == "SOFTMAX"]
    return [names[i] for op in chosen for i in op["outputs"]]


def _build_onnx(graph, path: Path, precision: str, samples) -> None:
    if precision == "fp32":
        from tracker.model.convert.onnx import build_onnx

        path.write_bytes(build_onnx(graph).SerializeToString())
        return
    from tracker.model.convert.graph import int8_float_ops
    from tracker.model.convert.onnx import quantize_int8

    quantize_int8(graph, path, samples.make(graph.input_shape), int8_float_ops(graph))


def _check_out(out: Path, target: str) -> None:
    """InputError unless `out` can be written and then loaded: not a folder, in an existing
    writable folder (none is made: a typo in a folder's name would pass unseen), named *.keras
    for tf."""
    ext = TARGETS[target][0]
    if target == "tf" and out.suffix != ext:  # LiteRT and ONNX Runtime load a model under any name
        raise InputError(f"--out {str(out)!r}: --to tf writes a Keras 3 model, which Keras loads only from a "
                         f"file named *{ext}; expected a path ending {ext}")
    if out.is_dir():
        raise InputError(f"--out {str(out)!r}: is a folder; expected a file path")
    if not out.parent.is_dir():
        problem = "is not a folder" if out.parent.exists() else "does not exist"
        raise InputError(f"--out {str(out)!r}: {str(out.parent)!r} {problem}; expected a file path in an existing folder")
    try:
        probe_writable(out.parent)
    except OSError as err:
        raise InputError(f"--out {str(out)!r}: cannot write in {str(out.parent)!r} ({err.strerror or err}); "
                         "expected a writable file path") from None


def convert_command(argv: list[str]) -> int:
    """`tracker convert` (see the module docstring). Prints the converted file's path."""
    from tracker.model.spec import ModelSpec, default_model

    p = ArgumentParser(prog="tracker convert", description="Convert the Caffe model for another engine.")
    p.add_argument("--to", required=True, choices=tuple(TARGETS),
                   help="tf: a Keras 3 model (.keras); tflite: a LiteRT flatbuffer (.tflite); onnx: an ONNX model (.onnx)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "int8"))
    p.add_argument("--prototxt", type=path_to("a Caffe prototxt file"), help="Caffe prototxt (default: the face CNN)")
    p.add_argument("--weights", type=path_to("a Caffe caffemodel file"), help="Caffe caffemodel (default: the face CNN)")
    p.add_argument("--probs", default="prob", help="blob holding the probabilities (default prob)")
    p.add_argument("--embedding", default="fc1", help="blob holding the embedding (default fc1)")
    p.add_argument("--calibration", type=path_to("a folder of face images"), help="int8: folder of face images (default: the shipped face chips)")
    p.add_argument("--cache-dir", type=path_to("a cache folder"), help=f"default: $TRACKER_CACHE_DIR or {default_cache_dir()}")
    p.add_argument("--out", type=path_to("a file to copy the converted model to"),
                   help="also copy the converted file here, in an existing folder (for --to tf a name ending .keras, the only one Keras loads)")
    args = p.parse_args(argv)
    if args.calibration is not None and args.precision != "int8":
        raise InputError("--calibration: only int8 conversions are calibrated; add --precision int8")
    if args.out is not None:  # said before a conversion that can take minutes
        _check_out(args.out, args.to)
    base = default_model()
    model = ModelSpec(args.prototxt or base.prototxt, args.weights or base.weights, args.probs, args.embedding)
    if args.out is not None:  # `--weights W --out W` replaced the weights with the converted model
        refuse_overwriting(args.out, {"caffemodel": model.weights, "prototxt": model.prototxt})
    path = convert(model, args.to, args.precision, calibration=args.calibration, cache_dir=args.cache_dir)
    if args.out is not None:
        def copy_to(tmp: Path) -> None:
            shutil.copyfile(path, tmp)

        try:
            atomic_write(args.out, copy_to)  # a full disk leaves a file already there whole
        except OSError as err:
            raise InputError(f"--out {str(args.out)!r}: cannot write ({err.strerror or err}); "
                             f"expected a writable file path") from None
        path = args.out
    print(path)
    return 0


__all__ = ["TARGETS", "convert", "convert_command", "load_graph", "require_runtime"]
