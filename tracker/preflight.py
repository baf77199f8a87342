"""What the guard needs before it starts, checked without starting it: `tracker --check-config`,
the guard and `tracker enroll` all run these, so the check catches what the run would refuse.

- `check_runnable(config, config_path)`: `check_inference(config)` (the backend name, precision and
  runtime, the prototxt and caffemodel, read and shape-checked, and the blobs the guard reads from
  them, the model card, the detector's model file: sha256), then the state directory and every
  file the guard writes (latency log, events, outbox): each must be, or be creatable as, what it
  should be (and a log's folder must take the files its rotation makes; an existing outbox file
  must be empty or an outbox), and no two the same file, nor one the guard reads (the config file, a
  password, TLS or model file, the model card) or holds (its lock); nothing is created.
- `check_source(config, spec)`: `--check-config`'s check of the source the guard would open (the
  guard meets the same refusals when it opens it).
- `embedding_width(config)`: how wide the configured model's embeddings are, from its prototxt (a
  person's mean of another width is skipped by the gallery and recomputed by a refresh).
- `prepare_state_dir(path)`: creates the state directory 0700 and makes every file the process
  creates afterwards private (umask 077: face snapshots, enrolments, the outbox and the logs are
  the household's), whatever umask the user has; warns when an existing directory is readable by
  others.

Every failure is an InputError / ModelError (exit 2) naming the key or path, the value and what
is expected.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tracker.errors import InputError, ModelError
from tracker.files import generations, nearest_existing, probe_writable

if TYPE_CHECKING:
    from tracker.model.spec import ModelSpec

log = logging.getLogger(__name__)

GUARD_LOCK = "guard.lock"  # in the state_dir: see lock_state_dir


def _can_create_in(folder: Path) -> str | None:
    """None if a file can be created in `folder` (files.probe_writable), else why not."""
    try:
        probe_writable(folder)
    except OSError as err:
        return err.strerror or str(err)
    return None


def check_directory(key: str, path: Path) -> None:
    """`path` is a writable directory, or can be created as one."""
    existing = nearest_existing(path)
    if not existing.is_dir():
        what = "a file" if existing == path else f"under the file {str(existing)!r}"
        raise InputError(f"config: key {key!r}: {str(path)!r} is {what}; expected a writable directory")
    why = _can_create_in(existing)
    if why is not None:
        verb = f"write in {str(path)!r}" if existing == path else f"create {str(path)!r} in {str(existing)!r}"
        raise InputError(f"config: key {key!r}: cannot {verb} ({why}); expected a writable directory")
    if existing != path:  # e.g. under /proc: the parent takes files but refuses directories
        try:
            probe = Path(tempfile.mkdtemp(dir=existing))
            probe.rmdir()
        except OSError as err:
            raise InputError(f"config: key {key!r}: cannot create {str(path)!r} ({err.strerror or err}); "
                             "expected a writable directory") from None


def check_file(key: str, path: Path, *, device_ok: bool = True, rotates: bool = False) -> None:
    """`path` is a regular file that can be written, or can be created; or, if `device_ok`, a
    character device (/dev/null: a log thrown away). A FIFO is refused: opening it for writing
    waits for a reader, where no signal ends the wait, so the guard would hang at start-up past
    SIGTERM. A path in a folder this user cannot search is refused too (its stat's EACCES). If
    `rotates` (a log rotated by size, `files.LineFile`), its folder must also take new files: the
    rotation renames the file there and starts a new one, and a file that cannot rotate grows
    without bound."""
    found = _reach(key, path)
    if found is None and not path.is_symlink():
        check_directory(key, path.parent)  # (a folder that takes the file takes its rotated ones)
        return
    if found is None:  # a link that leads nowhere: opening it creates its target
        try:
            target = path.resolve()
        except (OSError, RuntimeError):  # a loop of links
            raise InputError(f"config: key {key!r}: {str(path)!r} is a link that leads nowhere; expected a file path") from None
        check_directory(key, target.parent)
    else:
        if stat.S_ISDIR(found.st_mode):
            raise InputError(f"config: key {key!r}: {str(path)!r} is a directory; expected a file path")
        if stat.S_ISCHR(found.st_mode) and not device_ok:
            raise InputError(f"config: key {key!r}: {str(path)!r} is a character device; expected a regular file "
                             "(or a path to create one)")
        if not (stat.S_ISREG(found.st_mode) or stat.S_ISCHR(found.st_mode)):
            raise InputError(f"config: key {key!r}: {str(path)!r} is a FIFO, socket or block device; expected a regular file")
        if not os.access(path, os.W_OK):
            raise InputError(f"config: key {key!r}: {str(path)!r} is not writable; expected a writable file")
    if rotates and (found is None or not stat.S_ISCHR(found.st_mode)):  # a device never grows, so never rotates
        why = _can_create_in(path.parent)
        if why is not None:
            raise InputError(f"config: key {key!r}: cannot create files in {str(path.parent)!r} ({why}), which "
                             f"rotating {str(path)!r} does; expected a folder the guard can create and rename files in")


def _reach(key: str, path: Path) -> os.stat_result | None:
    """The stat of what `path` names (links followed), None if nothing is there (absent, under a
    file, or a link to nothing or to itself); InputError if this user cannot look (a folder on the
    way it may not search: the guard's start would fail the same way)."""
    try:
        return os.stat(path)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise InputError(f"config: key {key!r}: cannot look at {str(path)!r} ({err.strerror or err}); expected a "
                         "path the guard's user can reach (every folder on the way searchable)") from None


def check_inference(config) -> str:
    """What finding faces and running the face CNN need, refused now: the backend's name, precision
    and runtime, the model files, the blobs it reads and the card, the detector, and the tracker's
    score threshold against the detector's scores; returns the detector's name. (The benchmark of
    the detectors runs the configured guard's frame and checks this first.)"""
    from tracker.backends import check_request
    from tracker.detect import check_detector
    from tracker.identity import identity_threshold, weights_card
    from tracker.model.caffe_io import load_net
    from tracker.model.engine import check_net
    from tracker.model.spec import check_outputs

    cls = check_request(config.backend.name, config.backend.precision, name_from="config: key 'backend.name'",
                        precision_from="config: key 'backend.precision'")
    # BackendUnavailable (exit 3), naming what installs it, as the run would; not for a backend the
    # guard runs behind a worker, whose runtime this process must not load (its child checks it)
    if getattr(cls, "runs_in_worker", False) or not config.backend.worker:
        cls.check_runtime()
    for key, path, expected in (("model.prototxt", config.model.prototxt, "a Caffe net in text (.prototxt)"),
                                ("model.weights", config.model.weights, "Caffe weights (.caffemodel)")):
        if not os.path.lexists(path):  # (what else is wrong with one, load_net says)
            raise InputError(f"config: key {key!r}: {str(path)!r} does not exist; expected {expected}")
    netdef = load_net(config.model.prototxt, config.model.weights)
    check_net(netdef)  # what the engine refuses when it loads (several inputs, STOCHASTIC pooling)
    check_outputs(config.model.spec(), netdef)
    (declared,) = netdef.inputs.values()  # (check_net: exactly one)
    _check_crop_input(config.model.prototxt, tuple(declared[1:]))
    # a malformed card, one of other weights, or thresholds it does not hold for the embedding in
    # use, refused now, as at start-up
    identity_threshold(config, weights_card(config))
    detector = check_detector(config.detect)
    high = config.tracking.high_score
    if high is not None and high >= 1.0 and detector != "haar":  # Haar's scores are neighbour counts
        raise InputError(f"config: key 'tracking.high_score': {high:g} with detector {detector}, whose scores are at "
                         "most 1: no detection would start a track; expected a value below 1, or null")
    return detector


def guard_model(config) -> ModelSpec:
    """The configured model, checked to take the guard's crops: (1, CROP_SIZE, CROP_SIZE), the
    one input shape `tracker.crops` makes (the prototxt is the authority on what the net takes)."""
    from tracker.backends.worker import model_input_shape

    model = config.model.spec()
    _check_crop_input(model.prototxt, model_input_shape(model))
    return model


def embedding_width(config) -> int:
    """D of the (N, D) embeddings of the configured model: the size per image of its blob
    `model.embedding`, from the prototxt (every backend flattens that blob per image). InputError
    naming the key if the net has no such blob (check_outputs); ModelError if the prototxt does
    not load."""
    from tracker.model.caffe_io import load_net
    from tracker.model.shapes import infer_shapes
    from tracker.model.spec import check_outputs

    spec = config.model.spec()
    netdef = load_net(spec.prototxt, None)
    check_outputs(spec, netdef)
    return math.prod(infer_shapes(netdef, batch=1)[spec.embedding][1:])


def _check_crop_input(prototxt: Path, shape: tuple[int, ...]) -> None:
    """ModelError unless `shape`, the (C, H, W) input of the net in `prototxt`, is the guard's crop."""
    from tracker.crops import CROP_SIZE

    if shape != (1, CROP_SIZE, CROP_SIZE):
        raise ModelError(f"model.prototxt {str(prototxt)!r}: input (C, H, W) {shape}; the guard's face crops "
                         f"are (1, {CROP_SIZE}, {CROP_SIZE}) grey")


def check_runnable(config, config_path: Path | None = None) -> str:
    """Everything the guard would refuse at start-up, refused now (see module docstring); returns
    the detector's name. `config_path`: the file `config` was read from (None: none), which no
    file the guard writes may be."""
    from tracker.identity import people_folder
    from tracker.snapshots import snapshots_folder

    detector = check_inference(config)
    state_dir = config.resolved_state_dir()
    check_directory("state_dir", state_dir)
    # tracker.stages: the events' snapshots (the guard goes on without them if unwritable); tracker.identity:
    # the enrolled people, which the guard's start reads and refuses if it cannot
    for folder, holds in ((snapshots_folder(state_dir), "the snapshots"), (people_folder(state_dir), "the enrolled people")):
        if (folder.is_symlink() or folder.exists()) and not folder.is_dir():
            raise InputError(f"config: key 'state_dir': {str(folder)!r} is not a folder; expected a folder for {holds}, "
                             "or nothing there")
    files = {"latency.path": (config.latency.log_path(state_dir), config.latency.backups),
             "sinks.jsonl": (config.sinks.events_path(state_dir), config.sinks.jsonl_backups)}
    if config.mqtt.enabled:
        files["mqtt.outbox.path"] = (config.mqtt.outbox.file_path(state_dir), 0)
    for key, (path, _) in files.items():
        # SQLite opens no device: on /dev/null the outbox went to memory, blaming the disk
        is_log = key != "mqtt.outbox.path"
        check_file(key, path, device_ok=is_log, rotates=is_log)
    _check_distinct(files, _kept_files(config, state_dir, config_path))
    if config.mqtt.enabled:
        _check_outbox_file(files["mqtt.outbox.path"][0])
        from tracker.sinks.mqtt import read_password, tls_context

        read_password(config.mqtt)  # the password file and the TLS files, as the sink reads them
        tls_context(config.mqtt)
    if config.web.enabled:
        from tracker.passwords import web_password

        web_password(config.web)  # a page beyond loopback without a password is refused now
    return detector


def _kept_files(config, state_dir: Path, config_path: Path | None) -> dict[Path, str]:
    """The files the guard reads or holds ({path: what it is}), which none it writes may be: a log
    appended its lines to the config, which then stopped parsing, and to the web password, which
    then no longer matched; a rotation would free the lock or rename the weights away; the outbox
    moves a file that is not its database aside as corrupt."""
    from tracker.model.card import card_path

    kept = {state_dir / GUARD_LOCK: "the guard's lock"}
    if config_path is not None:
        kept[config_path] = "the config file"
    mqtt = config.mqtt
    named = {"model.weights": config.model.weights, "model.prototxt": config.model.prototxt,
             "detect.model": config.detect.model, "web.password_file": config.web.password_file,
             "mqtt.password_file": mqtt.password_file, "mqtt.tls.ca": mqtt.tls.ca, "mqtt.tls.cert": mqtt.tls.cert,
             "mqtt.tls.key": mqtt.tls.key}
    kept.update({path: f"key {key!r}" for key, path in named.items() if path is not None})
    kept[card_path(config.model.weights)] = "the card of key 'model.weights'"
    return kept


SQLITE_HEADER = b"SQLite format 3\0"  # the first bytes of every SQLite database file


def _check_outbox_file(path: Path) -> None:
    """InputError if a file at the outbox's `path` (check_file: a regular file or nothing) is not
    an outbox: content that is no SQLite database, or another program's database (read-only:
    `outbox.foreign_database`). The guard's start would move either aside as a corrupt outbox, or
    write its tables into the database: a file of the user's named by mistake. A damaged outbox
    (its header intact) is left to the outbox, which moves it aside and starts anew."""
    from tracker.sinks.outbox import foreign_database

    try:
        with open(path, "rb") as file:
            head = file.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as err:
        raise InputError(f"config: key 'mqtt.outbox.path': cannot read {str(path)!r} ({err.strerror or err}); "
                         "expected the guard's outbox, readable by its user, or a path to create it") from None
    if not head:  # empty: SQLite makes it the outbox
        return
    # (the content is not shown: it may be anything of the user's)
    why = foreign_database(path) if head == SQLITE_HEADER else "a file that is not an SQLite database"
    if why is not None:
        raise InputError(f"config: key 'mqtt.outbox.path': {str(path)!r} is {why}, which the guard would move aside "
                         "as a corrupt outbox or write its own tables into; expected the guard's outbox, or a path "
                         "where no file is yet")


def _check_distinct(files: dict[str, tuple[Path, int]], kept: dict[Path, str]) -> None:
    """No two of the guard's files, the logs' rotated ones included ({key: (path, backups)}), are
    one file, nor one of the files in `kept` ({path: what it is}), by its inode when it exists (a
    hard link too), else by its resolved path: a log's lines would go into the other, its rotation
    would delete or rename the other's lines, the outbox would move the other aside. Character
    devices (/dev/null, /dev/full) may be shared: nothing rotates them."""
    seen: dict[object, str] = {_identity(path, _stat(path)): what for path, what in kept.items()}
    for key, (first, backups) in files.items():
        for n, path in enumerate(generations(first, backups)):
            found = _stat(path)
            if found is not None and stat.S_ISCHR(found.st_mode):
                break  # a device never grows, so it never rotates
            identity = _identity(path, found)
            if identity in seen:
                which = "" if n == 0 else f"its rotated file {n} "
                raise InputError(f"config: key {key!r}: {which}{str(path)!r} is also {seen[identity]}; expected a "
                                 "file of its own (the guard appends to its logs and renames them, and renames an "
                                 "outbox it cannot read)")
            seen[identity] = repr(key) if n == 0 else f"the rotated file {n} of {key!r}"


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:  # not there yet (check_file made sure the logs can be created)
        return None


def _identity(path: Path, found: os.stat_result | None) -> object:
    """A file's (device, inode) (`found`: its stat), or its resolved path while it does not exist."""
    return (found.st_dev, found.st_ino) if found is not None else Path(os.path.abspath(path)).resolve()


def check_source(config, spec: str | None) -> None:
    """The source the guard would open (`spec`: the command line's --source, else the config's):
    made as the run makes it (its kind, uri, camera number, the synthetic scene's size and faces),
    and a video file or an image folder opened and closed once, an image folder read up to its
    first image that decodes (one with none is refused, as the run would). A camera or a stream is
    not opened: one that is absent is retried at run time, not refused; but the Pi camera's library
    must import, as the run refuses it otherwise."""
    from tracker.sources import make_source
    from tracker.sources.folder import FolderSource
    from tracker.sources.opencv_source import OpenCVSource
    from tracker.sources.picamera import PiCameraSource

    source = make_source(config.source, spec=spec, realtime=False)
    if isinstance(source, PiCameraSource):
        source.library()
    if isinstance(source, FolderSource) or (isinstance(source, OpenCVSource) and source.kind == "file"):
        source.open()
        try:
            if isinstance(source, FolderSource):
                source.read()
        finally:
            source.close()


def prepare_state_dir(path: Path) -> Path:
    """Create `path` (mode 0700) if needed and set umask 077 for this process; InputError if it
    cannot be made. Warns once if it exists and others may read it."""
    os.umask(0o077)
    check_directory("state_dir", path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as err:
        raise InputError(f"config: key 'state_dir': cannot create {str(path)!r} ({err.strerror or err}); "
                         "expected a writable directory") from None
    if mode & 0o077:
        log.warning("state_dir %s is readable by others (mode %04o): it holds faces and enrolments; "
                    "chmod 700 it", path, mode)
    return path


def lock_state_dir(path: Path) -> int:
    """Hold `path`/guard.lock locked (flock) for this guard's life: two guards on one state_dir
    (the service and one started by hand) would each write its logs, its MQTT outbox and its
    snapshots over the other's. Returns the lock's descriptor (closing it releases the lock; the
    kernel releases it when the process dies, so a crash leaves nothing to clean up). InputError
    naming the other guard's pid if one holds it."""
    lock_path = path / GUARD_LOCK
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise InputError(f"state_dir {str(path)!r}: cannot open its lock {str(lock_path)!r} "
                         f"({err.strerror or err}); expected a writable directory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise InputError(f"state_dir {str(path)!r}: another guard is running on it (pid {holder}); expected one "
                         "guard per state_dir: stop the other one or give this one its own state_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
