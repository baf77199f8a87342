"""The description of a model to run, and where the shipped model files are.

Below every engine and backend: the backends, the benchmark and the guard all describe a model
with a `ModelSpec`, and `MODELS_DIR` is the one place that knows where the shipped files live:
the package's `data/models`, which in a checkout is a link to the repository's `models/` and in
an installed wheel holds copies of them (pyproject's package data).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from tracker.errors import InputError

MODELS_DIR = Path(str(files("tracker") / "data" / "models")).resolve()
EMBEDDING_BLOB = "fc1"  # the face CNN's embedding (ARCHITECTURE.md, section 1): `model.embedding` by default


@dataclass(frozen=True)
class ModelSpec:
    """A Caffe classifier and which of its blobs the guard reads.

    prototxt, weights: the canonical Caffe files (text NetParameter, binary NetParameter).
    probs:     name of the blob holding class probabilities, (N, classes), rows sum to 1.
    embedding: name of the blob holding the embedding, (N, D), read after in-place layers ran.
    """

    prototxt: Path
    weights: Path
    probs: str = "prob"
    embedding: str = EMBEDDING_BLOB


def check_outputs(spec: ModelSpec, netdef) -> None:
    """InputError naming the config key if `spec.probs` or `spec.embedding` is not a blob of
    `netdef` (a `tracker.model.netdef.NetDef` of spec's files): every backend would refuse the
    model when it loads, so the checks before a run refuse it first. Also if it is not one row per
    image (its first axis not the batch: a Concat along axis 0 gave two rows a face, and the guard
    read the first image's rows for both). ModelError if the net's shapes do not hold."""
    from tracker.model.shapes import infer_shapes

    of_one, of_two = infer_shapes(netdef, batch=1), infer_shapes(netdef, batch=2)
    blobs = list(of_one)  # every blob, inputs first, in the order the layers make them
    for key, blob in (("model.probs", spec.probs), ("model.embedding", spec.embedding)):
        if blob not in blobs:
            raise InputError(f"config: key {key!r}: blob {blob!r} is not in the net {str(spec.prototxt)!r}; expected "
                             f"one of {', '.join(blobs)}")
        if of_one[blob][:1] != (1,) or of_two[blob][:1] != (2,):
            raise InputError(f"config: key {key!r}: blob {blob!r} of {str(spec.prototxt)!r} is {of_one[blob]} for one "
                             f"image and {of_two[blob]} for two; expected one row per image (the batch as its first axis)")


def default_model() -> ModelSpec:
    """The face CNN of docs/ARCHITECTURE.md, section 1, as shipped in `models/`."""
    return ModelSpec(MODELS_DIR / "face_cnn.prototxt", MODELS_DIR / "face_cnn.caffemodel", "prob", EMBEDDING_BLOB)
