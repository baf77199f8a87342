"""Mirror-mean embeddings: a face's embedding from its crop and the crop's mirror image.

The face CNN is not mirror-symmetric: a crop and its left-right mirror image give slightly
different embeddings, and their mean is a steadier description of the face than either. Measured
with `tracker eval-faces` (docs/MODEL.md): on CelebA people never in training, 10-fold accuracy
0.812 -> 0.823 and true accepts at 1% false accepts 0.306 -> 0.345; on the LFW stand-in, 0.901 ->
0.908 and 0.632 -> 0.686. The price is a second forward pass per face, run in the same batch.

The weights' card names the embedding its thresholds were calibrated on (tracker.model.card;
`tracker train` writes "mirror-mean", with the thresholds for "single" beside them), and
`identity.embedding` may choose the other (tracker.identity.chosen_embedding). Every tool that
embeds faces (the guard, enroll, identify, eval-faces, the frame budget of the detector
benchmark) wraps its backend with `embedder`; the engine benchmark times the backends themselves.
"""

from __future__ import annotations

import numpy as np

from tracker.identity import unit_rows
from tracker.types import Inference


class MirrorMean:
    """A backend (the contract of tracker/backends/base.py) whose output for each crop is the mean
    of the crop's and its mirror image's: probs (N, classes) their mean, embedding (N, D) float32
    the unit-length mean of their unit embeddings. `backend` sees one batch of 2N: the crops, then
    their mirror images (a worker backend splits it as any large batch). close() closes `backend`."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.name = backend.name

    def infer(self, x: np.ndarray) -> Inference:
        n = len(x)
        both = self.backend.infer(np.ascontiguousarray(np.concatenate([x, x[..., ::-1]])))  # W is the last axis
        probs = (0.5 * (both.probs[:n] + both.probs[n:])).astype(np.float32)
        embedding = unit_rows(unit_rows(both.embedding[:n]) + unit_rows(both.embedding[n:]))
        return Inference(probs, embedding)

    def close(self) -> None:
        self.backend.close()


def embedder(backend, embedding: str):
    """`backend` embedding faces the `embedding` way (tracker.model.card.EMBEDDINGS): MirrorMean
    over it for "mirror-mean", `backend` itself for "single"."""
    return MirrorMean(backend) if embedding == "mirror-mean" else backend
