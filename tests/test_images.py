"""Reading images: a JPEG cut short (an interrupted copy or upload) is damaged, not an image with
grey rows; whole ones, with an EXIF-style thumbnail or data appended after them, still read."""

from __future__ import annotations

import os
import shutil
import subprocess

import cv2
import numpy as np
import pytest
from test_pipeline_e2e import isolated_env, tracker_command

from tracker.cli import main
from tracker.images import decode_image, read_image
from tracker.model.convert.calibration import image_files as calibration_images
from tracker.sources.folder import FolderSource


def _jpeg(seed: int, size=(120, 160), **params) -> bytes:
    rng = np.random.default_rng(seed)
    image = cv2.GaussianBlur(rng.integers(0, 256, (*size, 3), np.uint8), (0, 0), 3)
    flags = [cv2.IMWRITE_JPEG_PROGRESSIVE, 1] if params.get("progressive") else []
    return cv2.imencode(".jpg", image, flags)[1].tobytes()


def _with_thumbnail(main: bytes, thumbnail: bytes) -> bytes:
    """`main` with an APP1 segment holding a whole JPEG (as EXIF holds its thumbnail) after SOI."""
    payload = b"Exif\0\0" + thumbnail
    return main[:2] + b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload + main[2:]


@pytest.mark.parametrize("progressive", [False, True], ids=["baseline", "progressive"])
def test_a_jpeg_cut_short_is_damaged_and_whole_ones_read(tmp_path, progressive):
    whole = _jpeg(0, progressive=progressive)
    cases = {
        "whole": (whole, False),
        "cut": (whole[: len(whole) * 2 // 3], True),
        "cut-at-the-last-byte": (whole[:-1], True),
        "appended": (whole + b"\0ftypmp42" + bytes(range(256)) * 8, False),  # a motion photo's video after it
        "thumbnail": (_with_thumbnail(whole, _jpeg(1, (16, 16))), False),
        "thumbnail-cut": (_with_thumbnail(whole, _jpeg(1, (16, 16)))[: len(whole) // 2 + 200], True),
        "headers-only": (whole[:100], True),
    }
    for name, (data, cut_short) in cases.items():
        path = tmp_path / f"{name}.jpg"
        path.write_bytes(data)
        assert (read_image(path) is None) == cut_short, name
        assert (decode_image(np.frombuffer(data, np.uint8)) is None) == cut_short, name
    (tmp_path / "empty.jpg").write_bytes(b"")
    assert read_image(tmp_path / "empty.jpg") is None and read_image(tmp_path) is None


def test_enrol_skips_a_jpeg_cut_short(tmp_path, johns):
    chips = tmp_path / "chips"
    chips.mkdir()
    whole = johns["John_Simm"][0].read_bytes()
    (chips / "a.jpg").write_bytes(whole)
    (chips / "b.jpg").write_bytes(johns["John_Simm"][1].read_bytes()[:3500])
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {str(tmp_path / 'state')!r}\n")
    proc = subprocess.run([*tracker_command(), "enroll", "simm", str(chips), "--aligned", "--config", str(config)],
                          capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "b.jpg" in proc.stderr and "damaged" in proc.stderr
    assert "from 1 image(s) (1 skipped)" in proc.stdout


def test_a_name_that_is_not_utf8_is_read(tmp_path, johns):
    """cv2.imread crashed the process (SIGSEGV, exit 139) on a name Python holds with a lone
    surrogate: `tracker identify`, `enroll`, a faces folder."""
    odd = os.fsdecode(bytes(tmp_path) + b"/face\xff.jpg")
    shutil.copyfile(johns["John_Simm"][0], odd)
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {str(tmp_path / 'state')!r}\n")
    proc = subprocess.run([*tracker_command(), "identify", odd, "--config", str(config)], capture_output=True,
                          env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"face 1 of 1" in proc.stdout


def test_every_command_takes_the_same_image_types_in_a_folder(tmp_path, johns, capsys):
    """Each had its own list: a folder holding only a .ppm was a photo folder to the guard but "no
    image files" to identify and "no usable face in 0 image(s)" to enroll."""
    folder = tmp_path / "ppm"
    folder.mkdir()
    cv2.imwrite(str(folder / "tom.ppm"), cv2.imread(str(johns["John_Simm"][0])))
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {str(tmp_path / 'state')!r}\ndetect: {{detector: haar}}\n")
    assert main(["enroll", "tom", str(folder), "--aligned", "--config", str(config)]) == 0, capsys.readouterr().err
    assert "from 1 image(s)" in capsys.readouterr().out
    assert main(["identify", str(folder), "--aligned", "--config", str(config)]) == 0, capsys.readouterr().err
    assert "tom.ppm face 1 of 1" in capsys.readouterr().out
    source = FolderSource(folder)
    source.open()
    assert source._files == [folder / "tom.ppm"]
    assert calibration_images(folder) == [folder / "tom.ppm"]


def test_what_is_not_a_regular_file_is_no_image(tmp_path):
    """A FIFO named like a photo (in a faces folder, say): opening it waited for a writer for ever."""
    fifo = tmp_path / "face.jpg"
    os.mkfifo(fifo)
    assert read_image(fifo) is None and read_image(tmp_path) is None


def test_a_large_jpeg_photo_is_decoded_reduced_for_finding_faces_in(tmp_path):
    """Enrolment decoded a 24-megapixel photo whole (72 MB; twenty of them in uploads took the guard
    past its memory bound): a JPEG is decoded at the fraction that keeps 1600 pixels along its
    longer side; a PNG, or a JPEG too small to halve, as it is."""
    image = cv2.resize(cv2.GaussianBlur(np.random.default_rng(0).integers(0, 256, (60, 80, 3), np.uint8), (0, 0), 2),
                       (4000, 3200))
    large = tmp_path / "large.jpg"
    large.write_bytes(cv2.imencode(".jpg", image)[1].tobytes())
    small = tmp_path / "small.jpg"
    small.write_bytes(cv2.imencode(".jpg", image[:3000, :3000])[1].tobytes())
    png = tmp_path / "large.png"
    png.write_bytes(cv2.imencode(".png", image)[1].tobytes())
    assert read_image(large, reduced=True).shape == (1600, 2000, 3)
    assert read_image(large, cv2.IMREAD_GRAYSCALE, reduced=True).shape == (1600, 2000)
    assert read_image(small, reduced=True).shape == (3000, 3000, 3)
    assert read_image(png, reduced=True).shape == (3200, 4000, 3)
    reduced = read_image(large, reduced=True).astype(np.float32)
    halved = cv2.resize(read_image(large), (2000, 1600), interpolation=cv2.INTER_AREA).astype(np.float32)
    assert np.abs(reduced - halved).mean() < 2.0  # the same picture, at half its size
    over = tmp_path / "over.jpg"  # 24,008,000 pixels declared: OpenCV checks its bound on the reduced size
    over.write_bytes(cv2.imencode(".jpg", np.zeros((3001, 8000), np.uint8))[1].tobytes())
    assert read_image(over, reduced=True) is None
