"""Calibration sets from a folder: only the images a set uses are decoded (`count` of them, evenly
spaced by name), so a folder of thousands costs the memory of `count` images, an image it never
uses cannot stop it, and every person's subfolder gives some."""

from __future__ import annotations

import shutil
import tracemalloc

import cv2
import numpy as np
import pytest
from test_hardening import without_root_overrides

from tracker.errors import InputError
from tracker.model.convert.calibration import sample_set


def test_only_the_images_a_set_uses_are_decoded(tmp_path, johns):
    folder, alone = tmp_path / "folder", tmp_path / "alone"
    folder.mkdir()
    alone.mkdir()
    chips = [path for files in johns.values() for path in files][:3]
    for i, (chip, name) in enumerate(zip(chips, ("a", "c", "e"))):  # files 0, 2 and 4 of six by name
        shutil.copyfile(chip, folder / f"{name}.jpg")
        shutil.copyfile(chip, alone / f"a{i}.jpg")
    for name in ("b.jpg", "d.png", "f.jpg"):
        (folder / name).write_bytes(b"not an image")
    first = sample_set(folder, count=3, seed=5).make((1, 88, 88))
    assert first.shape == (3, 1, 88, 88) and first.dtype == np.float32 and 0.0 <= first.min() < first.max() <= 1.0
    np.testing.assert_array_equal(sample_set(alone, count=3, seed=5).make((1, 88, 88)), first)
    with pytest.raises(InputError, match=r"calibration image '.*b.jpg': not a readable image \(damaged"):
        sample_set(folder, count=4, seed=5).make((1, 88, 88))  # files 0, 1, 3, 4: said as before


def test_every_persons_subfolder_gives_some(tmp_path, johns):
    """The first 200 by name were the first people's only: a folder of crops kept one subfolder
    per person calibrated int8 on the first few people."""
    folder, alone = tmp_path / "folder", tmp_path / "alone"
    alone.mkdir()
    chips = [path for files in johns.values() for path in files][:2]
    for person, chip in enumerate(chips):
        (folder / f"person{person}").mkdir(parents=True)
        for i in range(6):
            shutil.copyfile(chip, folder / f"person{person}" / f"{i}.jpg")
        shutil.copyfile(chip, alone / f"{person}.jpg")
    spread = sample_set(folder, count=2, seed=5)
    np.testing.assert_array_equal(spread.make((1, 88, 88)), sample_set(alone, count=2, seed=5).make((1, 88, 88)))
    assert spread.set_id == sample_set(alone, count=2, seed=5).set_id  # the same bytes in the same order




def test_an_image_the_user_cannot_read_is_one_line_and_exit_2(tmp_path, johns):
    """Hashing the set read each image's bytes unguarded: a PermissionError's traceback, exit 1."""
    folder = tmp_path / "crops"
    folder.mkdir()
    chips = [path for files in johns.values() for path in files][:2]
    for name, chip in zip(("a.jpg", "b.jpg"), chips):
        shutil.copyfile(chip, folder / name)
    (folder / "b.jpg").chmod(0)
    proc = without_root_overrides(tmp_path, "convert", "--to", "onnx", "--precision", "int8", "--calibration",
                                  str(folder), "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"tracker: error: calibration image {str(folder / 'b.jpg')!r}: cannot read "
                                  "(Permission denied); expected an image file this user can read"), proc.stderr


def test_a_file_over_the_image_bound_is_refused_before_it_is_read_whole(tmp_path, johns):
    """Hashing the set read each file whole, however large (read_image refuses one over
    MAX_FILE_BYTES only afterwards): it is read as read_image reads it, and refused at once."""
    from tracker.images import MAX_FILE_BYTES

    folder = tmp_path / "crops"
    folder.mkdir()
    shutil.copyfile([path for files in johns.values() for path in files][0], folder / "a.jpg")
    with open(folder / "b.jpg", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(InputError, match=rf"^calibration image '.*b.jpg': cannot read \(larger than {MAX_FILE_BYTES} "
                                         r"bytes\); expected an image file"):
        sample_set(folder, count=2)


def test_large_photos_are_not_all_kept_in_memory(tmp_path, johns):
    """Every image of the set was decoded and kept at once: 200 camera photos of 16 megapixels took
    3.3 GB. Now at most KEPT_BYTES (32 MB) of them are kept; the samples are the same as ever."""
    chip = cv2.imread(str([path for files in johns.values() for path in files][0]))
    photo = cv2.imencode(".jpg", cv2.resize(chip, (3000, 3000)))[1].tobytes()  # 9 MB decoded grey
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(12):  # 108 MB decoded in all
        (folder / f"{i:02d}.jpg").write_bytes(photo)
    sample = sample_set(folder, count=14, seed=3)
    tracemalloc.start()
    try:
        made = sample.make((1, 88, 88))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64_000_000, peak  # all twelve: over 108 MB
    (tmp_path / "small").mkdir()
    shutil.copyfile(folder / "00.jpg", tmp_path / "small" / "00.jpg")
    np.testing.assert_array_equal(made[0], sample_set(tmp_path / "small", count=1, seed=3).make((1, 88, 88))[0])
