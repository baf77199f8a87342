"""The shared data: files this project uses but does not own, found through one search path.

The demo's face chips (`testdata/faces/dlib/johns`), the detector benchmark's annotated photos,
the detectors' model files (`models/<detector>/`) and the training sets (`datasets/`) are not in
the repository nor in the wheel; they live in a shared-data folder, laid out as the workspace's
`shared/` folder that sits beside every checkout. A file of it is looked for, in order, in

1. `$TRACKER_SHARED_DIR`, if set (an install outside the workspace points it at its copy); set to
   something that is not a folder, it is an InputError rather than skipped;
2. `shared/` beside the source checkout, when the package runs from one.

Relative names are given with "/" (e.g. "testdata/faces/dlib/johns"). A missing file the caller
needs is one line (InputError, exit 2) naming it, where it was looked for and how to provide it.
"""

from __future__ import annotations

import os
from pathlib import Path

from tracker.errors import InputError

ENV = "TRACKER_SHARED_DIR"
_CHECKOUT = Path(__file__).resolve().parents[1]  # the folder holding the `tracker` package


def search_path() -> list[Path]:
    """The shared-data folders, in the order they are searched (see the module docstring)."""
    folders = []
    value = os.environ.get(ENV)
    if value:
        try:
            folder = Path(value).expanduser()
        except RuntimeError:  # ~user of a user without a home
            raise InputError(f"${ENV} {value!r}: cannot expand ~; expected a folder path") from None
        try:
            missing = not folder.is_dir()
        except OSError:  # cannot be looked up at all: `find` says so, naming the file it looked for
            missing = False
        if missing:  # a typo here would otherwise go unseen whenever the checkout's shared/ has the file
            raise InputError(f"${ENV} {value!r}: no such folder; expected the shared-data folder "
                             "(laid out as the workspace's shared/), or the variable unset")
        folders.append(folder)
    if (_CHECKOUT / "pyproject.toml").is_file():  # a source checkout, not an installed package
        folders.append(_CHECKOUT.parent / "shared")
    return folders


def candidates(relative: str) -> list[Path]:
    """Where `relative` (a file or a folder) is looked for, in order."""
    return [folder / relative for folder in search_path()]


def find(relative: str) -> Path | None:
    """The first of `candidates(relative)` that exists, or None (InputError naming the place that
    cannot be looked up: a folder the guard's user may not enter, a name too long)."""
    for path in candidates(relative):
        try:
            if path.exists():
                return path
        except OSError as err:
            raise InputError(f"{path}: cannot look it up ({err.strerror or err}); expected the shared data in a "
                             f"folder the guard's user can read (${ENV} names another)") from None
    return None


def locate(relative: str, what: str, instead: str = "") -> Path:
    """find(relative), or InputError: "<what>: <relative> not found in the shared data (looked in
    ...); expected it under $TRACKER_SHARED_DIR[, or <instead>]". `instead`: another way to
    provide it (e.g. the config key that names such a file directly)."""
    path = find(relative)
    if path is None:
        paths = candidates(relative)
        looked = f"looked in {', '.join(str(p) for p in paths)}" if paths else f"{ENV} is not set and this is not a source checkout"
        raise InputError(f"{what}: {relative} not found in the shared data ({looked}); expected it under "
                         f"${ENV} (set it to the shared-data folder){', or ' + instead if instead else ''}")
    return path
