"""The face CNN's files, and seeded random weights for it.

models/face_cnn.caffemodel holds the trained weights (`tracker train`, scripts/train-face-cnn;
docs/MODEL.md). This module also makes He-normal random weights drawn from a fixed seed: the
starting point of training, and a reproducible model for tests that need weights that are not
the shipped ones (generated on the fly, never committed). Their cost and speed are those of the
real model; their outputs are not identities.

Recipe (float32, Caffe shapes): for each Convolution and InnerProduct layer in prototxt order, the
weights are N(0, sqrt(2 / fan_in)) with fan_in = C/group * kh * kw (conv) or K (InnerProduct), and
the bias is the small deterministic ramp 0.01 * linspace(-1, 1, num_output). One
numpy Generator(PCG64(SEED)) draws all layers in order, so regenerating gives identical bytes.

    python -m tracker.model.face_cnn --out W [--prototxt P] [--seed S]   # writes random weights
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tracker.arguments import ArgumentParser
from tracker.errors import InputError, TrackerError
from tracker.model.caffe_io import load_net, write_caffemodel
from tracker.model.netdef import LayerDef, NetDef
from tracker.model.shapes import infer_layer_shapes
from tracker.model.spec import MODELS_DIR

SEED = 20160301
PROTOTXT = MODELS_DIR / "face_cnn.prototxt"
CAFFEMODEL = MODELS_DIR / "face_cnn.caffemodel"

# Figures docs/ARCHITECTURE.md, section 1 fixes; tests derive them from the prototxt and compare.
PARAMS = 1_039_744
MACS = 49_371_200


def he_weights(structure: NetDef, seed: int = SEED) -> NetDef:
    """`structure` (a NetDef loaded without weights) with He-normal weights and ramp biases."""
    rng = np.random.Generator(np.random.PCG64(seed))
    layers = []
    for layer, shapes in zip(structure.layers, infer_layer_shapes(structure)):
        blobs: tuple[np.ndarray, ...] = ()
        if shapes.params:
            if layer.type not in ("Convolution", "InnerProduct"):
                raise TrackerError(f"face_cnn weights: no recipe for {layer.type} layer "
                                   f"{layer.name!r}")
            weight_shape = shapes.params[0]
            transpose = (layer.type == "InnerProduct"
                         and layer.param.inner_product_param.transpose)
            fan_in = weight_shape[0] if transpose else int(np.prod(weight_shape[1:]))
            weight = rng.standard_normal(weight_shape, dtype=np.float64) * np.sqrt(2.0 / fan_in)
            blobs = (weight.astype(np.float32),)
            if len(shapes.params) > 1:
                n = shapes.params[1][0]
                blobs += ((0.01 * np.linspace(-1.0, 1.0, n)).astype(np.float32),)
        layers.append(LayerDef(layer.name, layer.type, layer.bottoms, layer.tops, layer.param,
                               blobs))
    return NetDef(structure.name, dict(structure.inputs), layers)


def generate(out: Path, prototxt: Path = PROTOTXT, seed: int = SEED) -> Path:
    """Write the seeded random caffemodel for `prototxt` to `out`; returns `out`."""
    write_caffemodel(out, he_weights(load_net(prototxt, None), seed))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m tracker.model.face_cnn",
        description="Write seeded random (untrained, He-normal) weights for the face CNN.")
    parser.add_argument("--prototxt", type=Path, default=PROTOTXT)
    parser.add_argument("--out", type=Path, required=True, help="caffemodel to write (not the shipped one)")
    parser.add_argument("--seed", type=int, default=SEED)
    try:
        args = parser.parse_args(argv)
        if args.out.resolve() == CAFFEMODEL.resolve():
            raise InputError(f"--out {str(args.out)!r} is the shipped trained weights; expected another path "
                             "(random weights would replace them)")
        try:
            path = generate(args.out, args.prototxt, args.seed)
        except OSError as err:
            raise InputError(f"cannot write --out {str(args.out)!r} ({err.strerror or err}); expected a file in "
                             "an existing folder this user can write") from None
    except TrackerError as err:
        print(f"tracker: error: {err}", file=sys.stderr)
        return err.exit_code
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
