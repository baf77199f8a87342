"""The distillation target: a teacher's face descriptors made reachable by a ReLU embedding.

fc1 follows a ReLU, so the student's embedding is non-negative and cannot match a signed descriptor
(dlib's 128-d one). The target is built as a first trial on this data found best (see
../shared/datasets/README.md: it alone verifies at 0.972 on LFW test pairs, the ceiling here):
centre the teacher's descriptors, project them onto their first `components` principal axes,
split each coordinate z into max(z, 0) and max(-z, 0), and scale to unit length. Cosine similarity
between two such targets orders pairs nearly as the teacher's own distance does.

A teacher file is an .npz with `paths` (str, relative to a data set's folder, e.g.
`AJ_Cook/AJ_Cook_0001.jpg`) and `descriptor` (float32 (N, D)), as
../shared/datasets/lfw-devtrain/dlib_descriptors.npz.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tracker.errors import InputError
from tracker.files import NPZ_UNREADABLE, load_npz


def read_teacher(path: Path) -> dict[str, np.ndarray]:
    """Relative image path -> descriptor (D,) float32; InputError for a file of another shape."""
    try:
        with load_npz(path) as data:
            paths, descriptors = data["paths"], np.asarray(data["descriptor"], np.float32)
    except NPZ_UNREADABLE as err:
        raise InputError(f"train: teacher file {str(path)!r}: unreadable ({err}); expected an .npz with "
                         "'paths' and 'descriptor' arrays") from None
    if paths.ndim != 1 or descriptors.ndim != 2 or len(paths) != len(descriptors):  # (a 0-d 'paths' has no len)
        raise InputError(f"train: teacher file {str(path)!r}: paths of shape {paths.shape} and descriptors of shape "
                         f"{descriptors.shape}; expected (N,) paths and (N, D) descriptors, one per path")
    if not np.isfinite(descriptors).all():
        raise InputError(f"train: teacher file {str(path)!r}: {int((~np.isfinite(descriptors)).any(axis=1).sum())} "
                         "descriptors with a NaN or an infinity; expected finite numbers")
    return {str(p): d for p, d in zip(paths, descriptors)}


def split_pca_targets(descriptors: np.ndarray, width: int) -> np.ndarray:
    """descriptors (N, D) -> targets (N, width) float32, non-negative, unit length (see the module
    docstring); `width` is the embedding's size, so width // 2 principal components, which need more
    than width // 2 descriptors (the caller checks: it knows which option gives more)."""
    components = width // 2
    x = np.asarray(descriptors, np.float64)
    centred = x - x.mean(axis=0)
    _, _, axes = np.linalg.svd(centred, full_matrices=False)
    z = centred @ axes[:components].T
    target = np.zeros((len(x), width))
    target[:, :components] = np.maximum(z, 0.0)
    target[:, components:2 * components] = np.maximum(-z, 0.0)
    target /= np.maximum(np.linalg.norm(target, axis=1, keepdims=True), 1e-12)
    return target.astype(np.float32)
