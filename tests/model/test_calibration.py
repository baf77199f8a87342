"""Calibration sets from a folder: only the images a set uses are decoded (the first `count` by
name), so a folder of thousands costs the memory of `count` images, and an image it never uses
cannot stop it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tracker.errors import InputError
from tracker.model.convert.calibration import sample_set


def test_only_the_images_a_set_uses_are_decoded(tmp_path, johns):
    folder, alone = tmp_path / "folder", tmp_path / "alone"
    folder.mkdir()
    alone.mkdir()
    chips = [path for files in johns.values() for path in files][:3]
    for i, chip in enumerate(chips):
        shutil.copyfile(chip, folder / f"a{i}.jpg")
        shutil.copyfile(chip, alone / f"a{i}.jpg")
    for name in ("z1.jpg", "z2.png"):  # after the chips by name
        (folder / name).write_bytes(b"not an image")
    first = sample_set(folder, count=3, seed=5).make((1, 88, 88))
    assert first.shape == (3, 1, 88, 88) and first.dtype == np.float32 and 0.0 <= first.min() < first.max() <= 1.0
    np.testing.assert_array_equal(sample_set(alone, count=3, seed=5).make((1, 88, 88)), first)
    with pytest.raises(InputError, match=r"calibration image '.*z1.jpg': cannot decode"):
        sample_set(folder, count=4, seed=5).make((1, 88, 88))  # the fourth is used: said as before
