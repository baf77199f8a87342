"""The converted-model cache: `<cache_dir>/<caffemodel sha256>/<target>-<precision><ext>`.

Each artifact has a sidecar `<artifact>.json` with the key it was built for (format version,
target, precision, sha256 of the caffemodel and of the prototxt, the output blob names, the
calibration set id for int8) and the artifact's own sha256. A lookup returns the artifact only if
the sidecar's key equals the wanted key, the checksum matches and the caller's loader accepts the
file; otherwise the entry is rebuilt, with one log line saying why (stale: which part of the key
changed; corrupt: checksum or load failure). A new caffemodel has a new sha256, hence a new
directory. Files are written to a temporary name in the same directory and renamed into place,
so a reader (or a crash mid-write) never sees half a model; a build that fails leaves no file,
nor the weights' folder when it made it.

Default cache dir: $TRACKER_CACHE_DIR, else ~/.cache/tracker.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tracker.errors import BackendUnavailable, InputError, ModelError
from tracker.files import atomic_write, file_sha256, make_writable_folder

log = logging.getLogger(__name__)

# Bump when the converters emit models that compute differently for the same inputs. Names inside
# a model alone do not count (nothing reads them from a cached file): the ONNX tensors' new names
# (a clash-free prefix for a pooling's steps, "#" out of the int8 quantiser's way) left it at 4.
FORMAT_VERSION = 4
T = TypeVar("T")


def default_cache_dir() -> Path:
    env = os.environ.get("TRACKER_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tracker"


def sha256_file(path: Path, what: str = "file") -> str:
    """Hex sha256 of `path` (files.file_sha256); ModelError naming `what` if it cannot be read."""
    try:
        return file_sha256(path)
    except OSError as err:
        raise ModelError(f"{what} {str(path)!r}: cannot read ({err.strerror or err}); "
                         f"expected a readable file") from None


@dataclass(frozen=True)
class Entry:
    """One cache slot: where the artifact lives and the key it must have been built for."""

    path: Path
    key: dict

    @property
    def meta_path(self) -> Path:
        return self.path.with_name(self.path.name + ".json")


def entry_for(model, target: str, precision: str, ext: str, calibration_id: str | None,
              cache_dir: Path | None = None) -> Entry:
    """The cache slot for `model` (a ModelSpec) converted to `target` in `precision`."""
    weights_sha = sha256_file(model.weights, "model weights")
    key = {
        "format": FORMAT_VERSION,
        "target": target,
        "precision": precision,
        "caffemodel_sha256": weights_sha,
        "prototxt_sha256": sha256_file(model.prototxt, "model prototxt"),
        "probs": model.probs,
        "embedding": model.embedding,
        "calibration": calibration_id,
    }
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return Entry(root / weights_sha / f"{target}-{precision}{ext}", key)


def _problem(entry: Entry) -> str | None:
    """None if the entry is present, current and intact; else why not ("missing" if absent)."""
    if not entry.path.exists() and not entry.meta_path.exists():
        return "missing"
    try:
        meta = json.loads(entry.meta_path.read_text(encoding="utf-8"))
        built_for, checksum = meta["key"], meta["artifact_sha256"]
        if not isinstance(built_for, dict) or not isinstance(checksum, str):
            raise TypeError("not a record of this cache")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:  # RecursionError: nested past the limit
        return f"is corrupt (its record {entry.meta_path.name} is unreadable: {err.__class__.__name__})"
    changed = sorted(k for k in entry.key if built_for.get(k) != entry.key[k])
    if changed:
        return f"is stale (built for a different {', '.join(changed)})"
    try:
        actual = sha256_file(entry.path)
    except ModelError:
        return "is corrupt (the model file is missing or unreadable)"
    if actual != checksum:
        return "is corrupt (checksum mismatch)"
    return None


def fetch(entry: Entry, build: Callable[[Path], None], load: Callable[[Path], T]) -> T:
    """load(artifact) from the cache, first (re)building it with build(path) when it is missing,
    stale or corrupt, or when load() rejects the cached file (logged as corrupt). A load failure
    right after a fresh build propagates: that is a converter bug, not a cache problem."""
    problem = _problem(entry)
    if problem is None:
        try:
            return load(entry.path)
        except BackendUnavailable:  # a runtime missing here says nothing of the file
            raise
        except Exception as err:  # any other loader failure means the file is unusable; rebuild it
            problem = f"is corrupt (it does not load: {err.__class__.__name__}: {str(err)[:200]})"
    if problem == "missing":
        log.info("converting %s -> %s", entry.key["target"], entry.path)
    else:
        log.warning("converted-model cache entry %s %s; rebuilding it", entry.path, problem)
    def unusable(err: OSError) -> InputError:
        return InputError(f"converted-model cache {str(entry.path.parent)!r}: cannot write ({err.strerror or err}); "
                          "expected a writable folder with room (--cache-dir, or $TRACKER_CACHE_DIR)")

    made = not entry.path.parent.is_dir()
    try:
        make_writable_folder(entry.path.parent)  # before the build: a build's own errors stay its own
    except OSError as err:
        raise unusable(err) from None
    try:
        atomic_write(entry.path, build)
        meta = {"key": entry.key, "artifact_sha256": sha256_file(entry.path)}
        atomic_write(entry.meta_path, (json.dumps(meta, indent=1) + "\n").encode())
    except BaseException as err:
        if made:  # a failed build (a damaged caffemodel) left its weights' folder empty, one a try
            with contextlib.suppress(OSError):  # (not empty: another process's entry in it since)
                entry.path.parent.rmdir()
        if not isinstance(err, OSError) or err.errno not in (errno.ENOSPC, errno.EDQUOT):  # a full disk,
            raise  # which the probe cannot foresee
        raise unusable(err) from None
    return load(entry.path)
