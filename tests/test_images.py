"""Reading images: a JPEG cut short (an interrupted copy or upload) is damaged, not an image with
grey rows; whole ones, with an EXIF-style thumbnail or data appended after them, still read; a JPEG
of more scans than MAX_JPEG_SCANS is refused before anything decodes it."""

from __future__ import annotations

import os
import shutil
import subprocess

import cv2
import numpy as np
import pytest
from test_pipeline_e2e import isolated_env, tracker_command

from tracker.cli import main
from tracker.images import MAX_JPEG_SCANS, MAX_JPEG_SEGMENTS, declared_size, decode_image, read_image
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
        assert (decode_image(data) is None) == cut_short, name
    (tmp_path / "empty.jpg").write_bytes(b"")
    assert read_image(tmp_path / "empty.jpg") is None and read_image(tmp_path) is None


def many_scans_jpeg(scans: int, size=(64, 64)) -> bytes:
    """A progressive JPEG of `size` (BGR noise) with `scans` scans: OpenCV's 10, then its last scan
    repeated (libjpeg decodes it, warning of an inconsistent progression; the time grows with each)."""
    data = _jpeg(2, size, progressive=True)
    last = data.rindex(b"\xff\xda")  # 0xFF 0xDA is a marker wherever it is: entropy-coded data stuffs 0xFF as 0xFF 0x00
    assert data.count(b"\xff\xda") == 10 and data.endswith(b"\xff\xd9") and scans >= 10
    return data[:-2] + data[last:-2] * (scans - 10) + b"\xff\xd9"


def test_a_jpeg_of_too_many_scans_is_refused_before_it_is_decoded(tmp_path, monkeypatch, caplog):
    """A progressive JPEG is decoded one scan at a time, each over the whole image, and the file
    chooses how many: a 514 kB one of 10,000 scans of 24 megapixels took 31 s, stalling the guard
    that enrolled it. Its scans are counted by walking its markers, without decoding it."""
    bomb = many_scans_jpeg(MAX_JPEG_SCANS + 1)
    with pytest.raises(ValueError, match=rf"^a JPEG of more than {MAX_JPEG_SCANS} scans \(each decoded over the "
                                         r"whole image\); expected a photo \(a camera's has about 10\)$"):
        declared_size(bomb)
    assert declared_size(many_scans_jpeg(MAX_JPEG_SCANS)) == ("jpeg", 64, 64)
    # A thumbnail's scans are its own: the walk steps over the segment that holds it.
    assert declared_size(_with_thumbnail(_jpeg(0), bomb)) == ("jpeg", 160, 120)
    (tmp_path / "faces").mkdir()
    (tmp_path / "faces" / "a.jpg").write_bytes(bomb)
    (tmp_path / "faces" / "b.jpg").write_bytes(_jpeg(3, (48, 32)))
    decoded = []
    imdecode = cv2.imdecode
    monkeypatch.setattr(cv2, "imdecode", lambda data, flags: decoded.append(len(data)) or imdecode(data, flags))
    assert read_image(tmp_path / "faces" / "a.jpg") is None and read_image(tmp_path / "faces" / "a.jpg", reduced=True) is None
    assert decode_image(bomb) is None
    source = FolderSource(tmp_path / "faces")  # a photo folder decodes its files' bytes itself
    source.open()
    assert source.read().image.shape == (48, 32, 3)
    assert "skipping 'a.jpg': not a decodable image (damaged, not an image, over 24 megapixels, or a JPEG of over " \
           f"{MAX_JPEG_SCANS} scans)" in caplog.text
    assert decoded == [len(_jpeg(3, (48, 32)))]


@pytest.mark.parametrize("progressive", [False, True], ids=["baseline", "progressive"])
def test_photos_as_encoders_write_them_pass_the_scan_walk(progressive):
    for size, channels in (((120, 160), 3), ((1200, 1600), 3), ((120, 160), 1)):
        image = cv2.GaussianBlur(np.random.default_rng(4).integers(0, 256, (*size, channels), np.uint8), (0, 0), 3)
        data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)])[1].tobytes()
        assert declared_size(data) == ("jpeg", size[1], size[0])
        assert decode_image(data, cv2.IMREAD_UNCHANGED).shape == image.shape  # (the blur drops a grey one's channel axis)


def test_the_scan_walk_takes_any_bytes_after_the_frame_header():
    """A stream cut short or garbled after a scan starts is the decoder's to refuse: the walk gives
    the declared size or a ValueError, never another error, and ends."""
    whole = _jpeg(5, progressive=True)
    first_scan = whole.index(b"\xff\xda")
    rng = np.random.default_rng(6)
    for end in range(first_scan, len(whole), 7):
        assert declared_size(whole[:end]) == ("jpeg", 160, 120)
        garbage = rng.integers(0, 256, 2000, np.uint8).tobytes()
        assert declared_size(whole[:end] + garbage) == ("jpeg", 160, 120)
    for tail in (b"\xff", b"\xff\xda", b"\xff\xda\x00", b"\xff\xda\x00\x00\xff", b"\xff" * 100, b"\xff\x00" * 100):
        assert declared_size(whole[:first_scan] + tail) == ("jpeg", 160, 120)
    comments = whole[:2] + b"\xff\xfe\x00\x02" * (MAX_JPEG_SEGMENTS + 1) + whole[2:]  # tiny segments, each a step
    with pytest.raises(ValueError, match=rf"^a JPEG of more than {MAX_JPEG_SEGMENTS} marker segments; expected a photo"):
        declared_size(comments)


def test_enrol_skips_a_jpeg_cut_short(tmp_path, johns):
    chips = tmp_path / "chips"
    chips.mkdir()
    whole = johns["John_Simm"][0].read_bytes()
    (chips / "a.jpg").write_bytes(whole)
    (chips / "b.jpg").write_bytes(johns["John_Simm"][1].read_bytes()[:3500])
    (chips / "c.jpg").symlink_to(tmp_path / "moved-away.jpg")  # was called damaged
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {str(tmp_path / 'state')!r}\n")
    proc = subprocess.run([*tracker_command(), "enroll", "simm", str(chips), "--aligned", "--config", str(config)],
                          capture_output=True, text=True, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "b.jpg: not a readable image (damaged" in proc.stderr
    assert "c.jpg: not a readable image (a link to a file that does not exist); skipped" in proc.stderr
    assert "from 1 image(s) (2 skipped)" in proc.stdout


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


def test_an_unreadable_file_is_said_why(tmp_path):
    """What the commands say of a file read_image refused: a link to a photo since moved, a FIFO or
    a folder named like a photo were all called "damaged, not an image, ...", which sends a user to
    look at the bytes of a file that is not there."""
    from tracker.images import MAX_FILE_BYTES, TOO_LARGE_OR_DAMAGED, unreadable_reason

    (tmp_path / "dangling.jpg").symlink_to(tmp_path / "gone.jpg")
    os.mkfifo(tmp_path / "fifo.jpg")
    (tmp_path / "folder.jpg").mkdir()
    (tmp_path / "notes.jpg").write_text("a note")
    with open(tmp_path / "huge.jpg", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    reasons = {name: unreadable_reason(tmp_path / name)
               for name in ("dangling.jpg", "fifo.jpg", "folder.jpg", "notes.jpg", "huge.jpg")}
    assert all(read_image(tmp_path / name) is None for name in reasons)
    assert reasons == {"dangling.jpg": "a link to a file that does not exist",
                       "fifo.jpg": "cannot be opened: not a regular file",
                       "folder.jpg": "cannot be opened: is a directory",
                       "notes.jpg": TOO_LARGE_OR_DAMAGED,
                       "huge.jpg": f"larger than any image it decodes ({MAX_FILE_BYTES // 1_000_000} MB)"}


def test_a_file_over_the_bound_is_no_image(tmp_path):
    """A file larger than MAX_FILE_BYTES is no image the guard decodes (a 400 MB one read whole took a
    photo folder's guard past 500 MB): a JPEG followed by zeros (a sparse file) to one byte past the
    bound is refused, though the same JPEG alone reads (and would with the zeros after it)."""
    from tracker.images import MAX_FILE_BYTES

    jpeg = _jpeg(1)
    alone = tmp_path / "alone.jpg"
    alone.write_bytes(jpeg)
    assert read_image(alone) is not None
    padded = tmp_path / "padded.jpg"
    with open(padded, "wb") as f:
        f.write(jpeg)
        f.truncate(MAX_FILE_BYTES + 1)
    assert read_image(padded) is None and read_image(padded, reduced=True) is None


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
    for width, factor in ((6400, 4), (12800, 8), (25600, 8)):  # 1/8 at most (OpenCV has no 1/16)
        wide = tmp_path / f"wide{width}.jpg"
        wide.write_bytes(cv2.imencode(".jpg", np.full((200, width, 3), 90, np.uint8))[1].tobytes())
        assert read_image(wide, reduced=True).shape == (200 // factor, width // factor, 3), width
    over = tmp_path / "over.jpg"  # 24,008,000 pixels declared: OpenCV checks its bound on the reduced size
    over.write_bytes(cv2.imencode(".jpg", np.zeros((3001, 8000), np.uint8))[1].tobytes())
    assert read_image(over, reduced=True) is None


def test_a_photo_read_for_faces_walks_its_jpeg_once(tmp_path, monkeypatch):
    """The walk goes to the JPEG's end (its scans): read_photo walked it three times (for the
    reduced decoding, the scan check, the factor back), a crafted 96 MB file took 2.5 s."""
    import tracker.images as images

    photo = tmp_path / "photo.jpg"
    photo.write_bytes(cv2.imencode(".jpg", np.full((3400, 3400, 3), 90, np.uint8))[1].tobytes())
    walks = []
    walk = images.declared_size
    monkeypatch.setattr(images, "declared_size", lambda data: walks.append(len(data)) or walk(data))
    image, factor = images.read_photo(photo)
    assert image.shape == (1700, 1700, 3) and factor == 2.0 and len(walks) == 1
