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

MODELS_DIR = Path(str(files("tracker") / "data" / "models")).resolve()


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
    embedding: str = "fc1"


def default_model() -> ModelSpec:
    """The face CNN of docs/ARCHITECTURE.md, section 1, as shipped in `models/`."""
    return ModelSpec(MODELS_DIR / "face_cnn.prototxt", MODELS_DIR / "face_cnn.caffemodel", "prob", "fc1")
