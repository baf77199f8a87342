"""User mistakes and hostile files get one line and exit 2, never a traceback; `--check-config`
refuses what the run would; the guard's files are private whatever the umask.

Each case goes through the real command line (`tracker.cli.main` in-process where a process per
case would cost seconds; the guard and `enroll` as subprocesses where the umask matters).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mosquitto import free_port
from test_pipeline_e2e import isolated_env, tracker_command
from tmpfs import tmpfs

from tracker.cli import main
from tracker.detect.blazeface import BlazeFaceDetector
from tracker.errors import BackendUnavailable
from tracker.model.spec import MODELS_DIR

REPO = Path(__file__).resolve().parents[1]
DEFAULT_WEIGHTS = MODELS_DIR / "face_cnn.caffemodel"


def check(capsys, config: Path, *args: str) -> tuple[int, str]:
    code = main(["--check-config", "--config", str(config), *args])
    err = capsys.readouterr().err
    return code, err


def assert_one_line(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("tracker: error: "), err
    for fragment in fragments:
        assert fragment in err, err


def write(tmp_path: Path, data: bytes | str, name: str = "tracker.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


# -- files that are not what a config is ------------------------------------------------------------

@pytest.mark.parametrize("data, fragment", [
    ("device:\n  name: café\n".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 19)"),
    ("device:\n  name: x\n".encode("utf-16"), "not UTF-8 text (byte 0xff at offset 0)"),
    (bytes(range(256)), "not UTF-8 text"),
    (("a: " + "[" * 5000 + "]" * 5000).encode(), "nested more than 32 levels deep"),
    ("".join("  " * i + f"k{i}:\n" for i in range(100)).encode(), "nested more than 32 levels deep"),
    (b"# " + b"x" * (2 << 20), "larger than 1048576 bytes"),
    (b"source:\n  width: 640\n  width: 320\n", "key 'width' twice in one section (lines 2 and 3); expected each key once"),
    # Python reads no integer of more than 4,300 digits: a ValueError's traceback
    (b"mqtt:\n  port: " + b"1" * 5000 + b"\n", "a number of 5000 characters (line 2); expected at most 64"),
])
def test_files_that_are_not_a_config(tmp_path, capsys, data, fragment):
    assert_one_line(*check(capsys, write(tmp_path, data)), fragment)


def test_a_fifo_or_a_huge_file_where_a_small_file_is_read(tmp_path, capsys):
    """A FIFO as the config waited for a writer for ever (the guard never started, never said why);
    a 300 MB password file, a video named by mistake, was read whole into memory."""
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert_one_line(*check(capsys, fifo), f"config file {str(fifo)!r}: cannot read (not a regular file)")
    big = tmp_path / "password"
    with open(big, "wb") as f:
        f.truncate(300 << 20)  # sparse: no disk used
    big.chmod(0o600)
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nweb:\n  password_file: {str(big)!r}\n")
    assert_one_line(*check(capsys, path), f"web password file {str(big)!r}: larger than 4096 bytes; expected the password")


def test_alias_bomb_is_refused_at_once(tmp_path, capsys):
    """A 'billion laughs' file of about 400 bytes that expands to 9**9 strings."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    lines.append("device: *a8")
    path = write(tmp_path, "\n".join(lines) + "\n")
    assert path.stat().st_size < 600
    assert_one_line(*check(capsys, path), "more than 32 YAML aliases")


def test_a_bad_value_inside_an_alias_expansion_is_shown_short(tmp_path, capsys):
    path = write(tmp_path, 'a: &a ["lol","lol","lol"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\ndevice: [*b,*b,*b,*b]\n')
    code, err = check(capsys, path)
    assert_one_line(code, err, "config: key 'device': bad value [[[", "expected a mapping of keys")
    assert len(err) < 300


# -- values the run would refuse ----------------------------------------------------------------

@pytest.mark.parametrize("yaml_text, fragment", [
    ("source:\n  seed: -5\n", "key 'source.seed': bad value -5"),
    ("sinks:\n  jsonl: ''\n", "key 'sinks.jsonl': bad value ''; expected a file path"),
    ("mqtt:\n  outbox:\n    path: ''\n", "key 'mqtt.outbox.path': bad value ''"),
    # SQLite cannot open a device: the outbox went to memory in silence, said as a failing disk
    ("mqtt:\n  enabled: true\n  outbox:\n    path: /dev/null\n",
     "key 'mqtt.outbox.path': '/dev/null' is a character device; expected a regular file (or a path to create one)"),
    ("backend:\n  name: caffe-turbo\n", "key 'backend.name': unknown backend 'caffe-turbo'; expected one of caffe-openblas"),
    ("backend:\n  name: opencv-dnn\n  precision: int8\n",
     "key 'backend.precision': backend 'opencv-dnn' has no 'int8' model; backends with 'int8': tf-neon-vfpv4, onnxruntime, auto"),
    ("model:\n  prototxt: /nonexistent/face.prototxt\n", "/nonexistent/face.prototxt"),
    ("source:\n  kind: opencv\n", "key 'source.uri': empty for source kind 'opencv'"),
    ("source:\n  faces_dir: /nonexistent\n", "config: key 'source.faces_dir': '/nonexistent' does not exist; expected a folder"),
    ("source:\n  width: 48\n  height: 48\n", "synthetic scene: size 48x48 too small; expected at least 64x64"),
    # "²" is a digit to str.isdigit, not to int(): int()'s complaint was the message
    ("web:\n  listen: '127.0.0.1:8²'\n", "key 'web.listen': bad value '127.0.0.1:8²'; expected host:port"),
    ("source:\n  kind: opencv\n  uri: /nonexistent/hall.mp4\n", "source '/nonexistent/hall.mp4': no such file or folder"),
    ("latency:\n  path: {tmp}/x/one.jsonl\nsinks:\n  jsonl: {tmp}/x/../x/one.jsonl\n",
     "key 'sinks.jsonl': '{tmp}/x/../x/one.jsonl' is also 'latency.path'; expected a file of its own"),
    ("latency:\n  path: {tmp}/one.jsonl\nsinks:\n  jsonl: {tmp}/one.jsonl.2\n",
     "key 'sinks.jsonl': '{tmp}/one.jsonl.2' is also the rotated file 2 of 'latency.path'; expected a file"),
    ("latency:\n  path: {tmp}/e.jsonl.1\nsinks:\n  jsonl: {tmp}/e.jsonl\n",
     "key 'sinks.jsonl': its rotated file 1 '{tmp}/e.jsonl.1' is also 'latency.path'"),
    ("source:\n  frames: true\n", "key 'source.frames': bad value True; expected a valid integer"),
    ("mqtt:\n  port: true\n", "key 'mqtt.port': bad value True; expected a valid integer"),
    ("tracking:\n  iou_threshold: false\n", "key 'tracking.iou_threshold': bad value False; expected a valid number"),
    ("mqtt:\n  prefix: a/b/\n", "bad value 'a/b/'; expected a string matching pattern '^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$'"),
    ("model:\n  prototxt: ''\n", "key 'model.prototxt': bad value ''; expected a file path"),
    # it said "caffemodel not found: /no/such.caffemodel", naming neither the key nor what is expected
    ("model:\n  weights: /no/such.caffemodel\n", "config: key 'model.weights': '/no/such.caffemodel' does not exist; "
     "expected Caffe weights (.caffemodel)"),
    ("model:\n  prototxt: /no/such.prototxt\n", "config: key 'model.prototxt': '/no/such.prototxt' does not exist; "
     "expected a Caffe net in text (.prototxt)"),
    ("latency:\n  path: \"/tmp/a\\0b\"\n", "key 'latency.path': bad value '/tmp/a\\x00b'; expected a path without a NUL"),
    ("latency:\n  path: /tmp/" + "a" * 300 + "\n", "each name in it at most 255 bytes"),
    ("latency:\n  path: ~nosuchuser8f3/l.jsonl\n", "key 'latency.path': bad value '~nosuchuser8f3/l.jsonl'; expected ~ or ~user"),
    # YAML 1.1 reads `on` as true: the key was named 'mqtt.tls.1' with the value True
    ("mqtt:\n  tls:\n    on: true\n", "section 'mqtt.tls': key True is not a name (YAML reads on, off, yes and no as "
     "booleans, and digits as numbers); expected a key name, quoted if it is one of those"),
    # the guard's own files: a rotation would free its lock, or rename its weights away
    ("sinks:\n  jsonl: {tmp}/state/guard.lock\n", "key 'sinks.jsonl': '{tmp}/state/guard.lock' is also the guard's lock"),
    ("latency:\n  path: " + str(DEFAULT_WEIGHTS) + "\n", "key 'latency.path': '" + str(DEFAULT_WEIGHTS)
     + "' is also key 'model.weights'; expected a file of its own"),
])
def test_check_config_refuses_what_the_run_would(tmp_path, capsys, yaml_text, fragment):
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\n" + yaml_text.replace("{tmp}", str(tmp_path)))
    assert_one_line(*check(capsys, path), fragment.replace("{tmp}", str(tmp_path)))


def test_check_config_says_where_the_state_lives(tmp_path, capsys, monkeypatch):
    """A relative state_dir is taken from the working folder (/ under systemd): its meaning was not shown."""
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "state_dir: trk/state\nweb:\n  enabled: false\n")
    assert main(["--check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"config ok: {path} (detector ") and out.endswith(f"; state in {tmp_path.resolve()}/trk/state)\n")


def test_check_config_refuses_a_backend_whose_runtime_is_missing_as_the_run_does(tmp_path, capsys, monkeypatch):
    """Exit 3 naming what installs it (the run's exit, which the unit does not restart), not "config ok"."""
    from tracker.backends import backend_class, missing_runtime

    def missing(cls):
        raise missing_runtime("onnxruntime", "onnxruntime", ImportError("No module named 'onnxruntime' (a test)"))

    monkeypatch.setattr(backend_class("onnxruntime"), "check_runtime", classmethod(missing))
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nbackend:\n  name: onnxruntime\n")
    code, err = check(capsys, path)
    assert code == 3 and err.count("\n") == 1 and "runtime 'onnxruntime' is not importable" in err and "install it with" in err, err


def test_check_config_opens_a_video_file_or_folder_but_never_a_camera(tmp_path, capsys):
    """An absent camera is retried by the guard, not refused; a folder with no image is refused."""
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nsinks:\n  console: false\n")
    assert check(capsys, path, "--source", "/dev/video63")[0] == 0
    (tmp_path / "empty").mkdir()
    assert_one_line(*check(capsys, path, "--source", str(tmp_path / "empty")), "no image files in it")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "photo.jpg").write_bytes(b"not a JPEG")
    assert_one_line(*check(capsys, path, "--source", str(tmp_path / "broken")), "none of its 1 image file(s) could be "
                                                                                  "decoded")


def test_the_tracker_command_decodes_no_image_over_24_megapixels(tmp_path):
    """OpenCV's own bound is set before it loads (tracker.images): a 25-megapixel PNG of 100 kB is
    one no decoder of the guard's process allocates (the check reads the folder's first image)."""
    import cv2
    import numpy as np

    (tmp_path / "photos").mkdir()
    cv2.imwrite(str(tmp_path / "photos" / "large.png"), np.zeros((5000, 5000), np.uint8))
    config = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\n")
    run = subprocess.run([*tracker_command(), "--check-config", "--config", str(config), "--source",
                          str(tmp_path / "photos")], capture_output=True, text=True, env=isolated_env(tmp_path),
                         timeout=120)
    assert run.returncode == 2 and "none of its 1 image file(s) could be decoded" in run.stderr, run.stderr
    assert "skipping 'large.png': not a decodable image (damaged, not an image, over 24 megapixels, or a JPEG of over 100 scans)" in run.stderr


@pytest.mark.parametrize("args, fragment", [
    (("--worker",), "--worker: only with --benchmark"),
    (("--passes", "5"), "--passes: only with --benchmark"),
    (("--out", "x"), "--out: only with --benchmark"),
    # at their default values they were ignored in silence
    (("--check-config", "--passes", "100"), "--passes: only with --benchmark"),
    (("--out", "bench-out"), "--out: only with --benchmark"),
    (("--batches", "1,2,4,8,16,32,64,128,256"), "--batches: only with --benchmark"),
    (("--memory-limit", "900"), "--memory-limit: only with --benchmark"),
    (("--demo", "--source", "hall.mp4"), "--source 'hall.mp4': --demo runs the built-in synthetic scene"),
    (("--detector", "haar"), "unrecognized arguments: --detector haar"),  # not taken for --detectors
    (("--config", "c.yaml", "identify", "x.jpg"), "'identify' after options (--config c.yaml); expected the "
                                                   "subcommand first: tracker identify ... --config F"),
    (("--list-backends", "--benchmark"), "--benchmark: not with --list-backends; expected one of --check-config"),
    (("--check-config", "--benchmark"), "--benchmark: not with --check-config"),
    (("--benchmark", "--detectors", "haar", "--precision", "int8"), "--precision: the detector benchmark does not take it"),
    (("--list-backends", "--source", "foo"), "--source: not with --list-backends, which runs no guard"),
    (("--benchmark", "--demo"), "--demo: not with --benchmark, which runs no guard"),
    (("--benchmark", "--backend", "caffe-openblas", "--frames", "3"), "--frames: not with --benchmark"),
    (("--list-backends", "--backend", "onnxruntime"), "--backend: --list-backends lists every backend and precision"),
    (("--list-backends", "--precision", "int8"), "--precision: --list-backends lists every backend and precision"),
])
def test_options_that_the_run_would_ignore_are_refused(capsys, args, fragment):
    assert_one_line(main(list(args)), capsys.readouterr().err, fragment)


@pytest.mark.parametrize("command", [[], ["enroll"], ["identify"], ["eval-faces"], ["eval-mot"], ["train"]])
def test_an_empty_config_option_is_refused_as_empty(capsys, command):
    """`--config ""` became Path("."), and the error named '.' (the working directory)."""
    assert_one_line(main([*command, "--config", ""]), capsys.readouterr().err, "argument --config: bad value ''; expected a YAML config file")


@pytest.mark.parametrize("command, option", [
    *[(["train"], option) for option in ("--data", "--teacher", "--pairs", "--pairs-images", "--out", "--work")],
    *[(["eval-faces"], option) for option in ("--pairs", "--images", "--folder", "--json", "--backend")],
    (["enroll", "alice"], "images"), (["identify"], "images"),
    *[(["eval-mot"], option) for option in ("detections", "--tracks", "--gt", "--out")],
    *[(["convert", "--to", "onnx"], option) for option in ("--prototxt", "--weights", "--calibration", "--cache-dir", "--out")],
    (["--benchmark"], "--out"),
])
def test_an_empty_path_is_refused_as_empty_before_any_work(tmp_path, monkeypatch, capsys, command, option):
    """An empty path became Path("."), the working directory: `train --work ""` wrote its checkpoint
    there, `eval-faces --folder ""` and `identify ""` read it, `convert --cache-dir ""` and
    `--benchmark --out ""` wrote into it, the others named '.' in their error; `eval-faces --backend ""`
    ran the config's backend."""
    monkeypatch.chdir(tmp_path)
    argv = [*command, option, ""] if option.startswith("--") else [*command, ""]  # (a positional: its name)
    assert_one_line(main(argv), capsys.readouterr().err, f"argument {option}: bad value ''; expected ")
    assert list(tmp_path.iterdir()) == []


def test_the_demo_help_says_that_the_configs_broker_still_gets_its_events():
    """It said "(no camera, no broker)": the demo publishes to the config's broker (README)."""
    from tracker.cli import _main_parser

    text = " ".join(_main_parser().format_help().split())
    assert "no broker" not in text and "the config's MQTT and web page still apply" in text, text


def test_the_help_lists_the_subcommands_and_says_which_config_is_the_default():
    """It listed no subcommand, and "default: config/tracker.yaml" read as a file of the working
    directory: the default is the package's own (tracker.config.DEFAULT_CONFIG)."""
    from tracker.cli import SUBCOMMANDS, _main_parser

    text = _main_parser().format_help()
    assert all(f"\n  tracker {name} " in text for name in SUBCOMMANDS), text
    assert "default: the package's own tracker.yaml" in " ".join(text.split()) and "config/tracker.yaml" not in text


@pytest.mark.parametrize("args, fragment", [
    # named as the option that asked, not as the config key it overrides
    (("--backend", "nope"), "tracker: error: --backend: unknown backend 'nope'; expected one of caffe-openblas"),
    (("--backend", "opencv-dnn", "--precision", "int8"), "tracker: error: --precision: backend 'opencv-dnn' has no 'int8'"),
    (("--source", "picamera2:x"), "picamera2 camera number 'x' is not a whole number >= 0"),
    (("--source", "picamera2:-1"), "picamera2 camera number '-1' is not a whole number >= 0"),
    (("--source", "/nonexistent/hall.mp4"), "source '/nonexistent/hall.mp4': no such file or folder"),
    (("--source", "/tmp/" + "a" * 5000), "no such file"),  # longer than a file name may be: OSError before
])
def test_check_config_applies_the_command_line_overrides(tmp_path, capsys, args, fragment):
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\n")
    assert_one_line(*check(capsys, path, *args), fragment)


def test_the_demo_of_a_guard_with_a_large_camera_shows_the_scene_at_its_aspect(tmp_path, capsys):
    """The synthetic scene is at most 1920x1080: the demo took a 5-megapixel camera's size and was
    refused."""
    from tracker.cli import effective_config
    from tracker.config import load_config

    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\n"
                           "source: {kind: opencv, uri: /dev/video0, width: 2592, height: 1944}\n")
    assert check(capsys, path, "--demo")[0] == 0
    args = type("Args", (), {"backend": None, "precision": None, "demo": True, "frames": None})()
    source = effective_config(load_config(path), args).source
    assert (source.kind, source.width, source.height) == ("synthetic", 1662, 1247)


def test_blazeface_without_litert_stops_check_config_as_it_stops_the_guard(tmp_path, capsys, monkeypatch):
    # None in sys.modules: find_spec reports it absent and importing it fails (the submodule too,
    # which an earlier test may have imported)
    for name in ("ai_edge_litert", "ai_edge_litert.interpreter"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(BackendUnavailable) as guard:
        BlazeFaceDetector()  # what the guard's start-up meets
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\ndetect:\n  detector: blazeface\n")
    assert check(capsys, path) == (3, f"tracker: error: {guard.value}\n")


def test_a_caffemodel_of_another_shape_is_refused_by_check_config(tmp_path, capsys, testdata):
    lenet = testdata / "caffe" / "lenet" / "lenet_iter_10000.caffemodel"
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nmodel:\n  weights: {str(lenet)!r}\n")
    assert_one_line(*check(capsys, path), "caffemodel")


def _state_dir_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    regular = tmp_path / "a-file"
    regular.write_text("not a directory")
    return {
        "regular file": (regular, "is a file; expected a writable directory"),
        "under a file": (regular / "state", "is under the file"),
        "under /proc": (Path("/proc/tracker-state"), "expected a writable directory"),
    }


@pytest.mark.parametrize("case", ["regular file", "under a file", "under /proc"])
def test_an_unusable_state_dir_is_exit_2_for_check_config_guard_and_enroll(tmp_path, capsys, case, testdata):
    state, fragment = _state_dir_cases(tmp_path)[case]
    path = write(tmp_path, f"state_dir: {str(state)!r}\nsource:\n  realtime: false\n")
    assert_one_line(*check(capsys, path), "key 'state_dir'", fragment)
    assert_one_line(main(["--demo", "--frames", "3", "--config", str(path)]), capsys.readouterr().err, "key 'state_dir'")
    chip = next((testdata / "faces" / "dlib" / "johns" / "John_Simm").glob("*.jpg"))
    assert_one_line(main(["enroll", "ann", str(chip), "--aligned", "--config", str(path)]), capsys.readouterr().err,
                    "key 'state_dir'")


def test_a_read_only_state_dir_is_exit_2_for_check_config_guard_and_enroll(tmp_path, capsys, testdata):
    with tmpfs(tmp_path / "ro", "ro,size=1m") as state:
        path = write(tmp_path, f"state_dir: {str(state)!r}\n")
        assert_one_line(*check(capsys, path), f"key 'state_dir': cannot write in '{state}'", "Read-only file system")
        # the demo keeps its state in <state_dir>/demo, which cannot be created there
        assert_one_line(main(["--demo", "--frames", "3", "--config", str(path)]), capsys.readouterr().err,
                        "key 'state_dir'", "Read-only file system")
        chip = next((testdata / "faces" / "dlib" / "johns" / "John_Simm").glob("*.jpg"))
        assert_one_line(main(["enroll", "ann", str(chip), "--aligned", "--config", str(path)]),
                        capsys.readouterr().err, "key 'state_dir'", "Read-only file system")


@pytest.mark.parametrize("key, make", [
    ("sinks.jsonl", lambda t: ("sinks:\n  jsonl: {}\n", t, f"{str(t)!r} is a directory; expected a file path")),
    ("latency.path", lambda t: ("latency:\n  path: {}\n", t / "a-file" / "latency.jsonl",  # under a file
                                f"{str(t / 'a-file')!r} is a file; expected a writable directory")),
])
def test_log_paths_that_cannot_be_files_are_exit_2_for_check_config_and_guard(tmp_path, capsys, key, make):
    (tmp_path / "a-file").write_text("x")
    template, target, fragment = make(tmp_path)
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nsource:\n  realtime: false\n"
                 + template.format(repr(str(target))))
    assert_one_line(*check(capsys, path), f"key {key!r}", fragment)
    assert_one_line(main(["--demo", "--frames", "3", "--config", str(path)]), capsys.readouterr().err,
                    f"key {key!r}", fragment)


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _dangling(path: Path) -> Path:
    path.symlink_to(path.parent / "gone")
    return path


def _loop(folder: Path) -> Path:
    (folder / "a").symlink_to(folder / "b")
    (folder / "b").symlink_to(folder / "a")
    return folder / "a"


@pytest.mark.parametrize("key, template, make, fragment", [
    # a FIFO: the guard's open would wait for a reader, past SIGTERM
    ("latency.path", "latency:\n  path: {}\n", lambda s: _fifo(s / "latency.fifo"), "is a FIFO, socket or block device"),
    ("state_dir", "", lambda s: _dangling(s / "snapshots"), "is not a folder"),
    ("sinks.jsonl", "sinks:\n  jsonl: {}\n", _loop,
     "is a link that leads nowhere"),
    ("state_dir", "", lambda s: (s / "snapshots").write_text("x") and s / "snapshots", "is not a folder"),
    # it passed the check, and the guard's start refused it ("people folder ...: cannot read it")
    ("state_dir", "", lambda s: (s / "people").write_text("x") and s / "people",
     "people' is not a folder; expected a folder for the enrolled people, or nothing there"),
])
def test_log_paths_that_the_guard_cannot_open_are_exit_2_for_check_config_and_guard(tmp_path, capsys, key, template, make, fragment):
    state = tmp_path / "state"
    state.mkdir()
    target = make(state)
    path = write(tmp_path, f"state_dir: {str(state)!r}\nsource:\n  realtime: false\n  frames: 3\n"
                 + template.format(repr(str(target))))
    assert_one_line(*check(capsys, path), f"key {key!r}", fragment)
    assert_one_line(main(["--config", str(path)]), capsys.readouterr().err, f"key {key!r}", fragment)


def without_root_overrides(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`tracker *args` with no power over file modes: as root, setpriv (util-linux) takes away the
    capabilities that override them, so a folder's mode refuses it as it refuses the guard's user."""
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all", "--"]
    return subprocess.run([*(drop if os.geteuid() == 0 else []), *tracker_command(), *args], capture_output=True,
                          text=True, env=isolated_env(tmp_path), timeout=300)


def _refused_by_check_config_and_guard(tmp_path, yaml_text: str, said: str) -> None:
    """`--check-config` and the guard (3 frames), without root's overrides, each exit 2 with one
    line holding `said`."""
    config = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nsource:\n  realtime: false\n  frames: 3\n"
                   + yaml_text)
    for command in (["--check-config"], []):
        run = without_root_overrides(tmp_path, *command, "--config", str(config))
        assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
        assert said in run.stderr, run.stderr


def test_a_log_in_a_folder_the_user_cannot_search_is_exit_2_for_check_config_and_guard(tmp_path):
    """Its stat's EACCES was a traceback and exit 1, which systemd restarts for ever."""
    locked = tmp_path / "locked"
    (locked / "sub").mkdir(parents=True)
    locked.chmod(0)
    target = locked / "sub" / "latency.jsonl"
    _refused_by_check_config_and_guard(tmp_path, f"latency:\n  path: {str(target)!r}\n",
                                       f"key 'latency.path': cannot look at {str(target)!r} (Permission denied)")


def test_a_log_whose_folder_takes_no_new_file_is_exit_2_for_check_config_and_guard(tmp_path):
    """The file could be written but not rotated: it passed, and grew without bound."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "events.jsonl").write_text("")
    logs.chmod(0o555)
    _refused_by_check_config_and_guard(tmp_path, f"sinks:\n  jsonl: {str(logs / 'events.jsonl')!r}\n",
                                       f"key 'sinks.jsonl': cannot create files in {str(logs)!r} (Permission denied)")


def test_a_log_path_linked_to_a_file_not_made_yet_is_written_through_the_link(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    link = _dangling(state / "events.jsonl")
    path = write(tmp_path, f"state_dir: {str(state)!r}\nsource:\n  realtime: false\n  frames: 40\n"
                 f"sinks:\n  jsonl: {str(link)!r}\n")
    assert check(capsys, path)[0] == 0
    assert main(["--config", str(path)]) == 0
    assert link.is_symlink() and (state / "gone").read_text().count("\n") >= 2  # entered and left, at least


# -- property: whatever the file holds, one line or a valid config ---------------------------------

yaml_fragments = st.sampled_from([
    "device:", "  id: x", "  name: &n y", "*n", "- ", "[", "]", "{", "}", ": ", "&a", "*a", "!!python/object:os.system",
    "source:", "  seed: -1", "\n", "  ", "\t", "'", '"', "mqtt:", "  port: 1e9", "%YAML 1.1", "---", "...", "\x00",
    "backend:", "  name: nope", "sinks:", "  jsonl: ''", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300), st.lists(yaml_fragments, max_size=30).map(lambda p: "\n".join(p).encode())))
def test_check_config_on_random_bytes_and_yaml_is_one_line_or_ok(tmp_path_factory, capsys, data):
    tmp = tmp_path_factory.mktemp("random")
    path = write(tmp, data)
    code, err = check(capsys, path)
    assert code in (0, 2), err  # 1 would be a traceback
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("tracker: error: "), err
    capsys.readouterr()


# -- private files -----------------------------------------------------------------------------------

def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def test_state_files_are_private_under_umask_022(tmp_path, testdata):
    state = tmp_path / "state"
    # MQTT on, to a port where no broker listens: the outbox is created all the same
    config = write(tmp_path, f"state_dir: {str(state)!r}\nsource:\n  realtime: false\nbackend:\n  name: caffe-openblas-dl\n"
                             f"mqtt:\n  enabled: true\n  host: 127.0.0.1\n  port: {free_port()}\n  flush_timeout_s: 1\n")
    env = isolated_env(tmp_path)
    run = subprocess.run([*tracker_command(), "--demo", "--frames", "60", "--config", str(config)], capture_output=True,
                         text=True, env=env, timeout=300, preexec_fn=lambda: os.umask(0o022))
    assert run.returncode == 0, run.stderr
    chips = sorted((testdata / "faces" / "dlib" / "johns" / "John_Simm").glob("*.jpg"))[:2]
    enrolled = subprocess.run([*tracker_command(), "enroll", "ann", *map(str, chips), "--aligned", "--config", str(config)],
                              capture_output=True, text=True, env=env, timeout=300, preexec_fn=lambda: os.umask(0o022))
    assert enrolled.returncode == 0, enrolled.stderr
    modes = _modes(state)
    assert any(name.endswith(".jpg") for name in modes) and any(name.endswith(".npz") for name in modes)
    assert any(name.endswith("latency.jsonl") for name in modes) and any(name.endswith("events.jsonl") for name in modes)
    assert any(name.endswith("outbox.sqlite3") for name in modes)
    exposed = {name: oct(mode) for name, mode in modes.items() if mode & 0o077}
    assert not exposed, f"readable by others under umask 022: {exposed}"


def test_an_existing_state_dir_readable_by_others_is_warned_about(tmp_path, testdata):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    config = write(tmp_path, f"state_dir: {str(state)!r}\n")
    chip = next((testdata / "faces" / "dlib" / "johns" / "John_Simm").glob("*.jpg"))
    run = subprocess.run([*tracker_command(), "enroll", "ann", str(chip), "--aligned", "--config", str(config)],
                         capture_output=True, text=True, env=isolated_env(tmp_path), timeout=300)
    assert run.returncode == 0, run.stderr
    assert "is readable by others (mode 0755)" in run.stderr and "chmod 700" in run.stderr


def test_check_config_reads_the_mqtt_password_and_tls_files_as_the_sink_would(tmp_path, capsys):
    empty = tmp_path / "pw"
    empty.write_text("\n")
    empty.chmod(0o600)
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    base = "mqtt:\n  enabled: true\n"
    assert_one_line(*check(capsys, write(tmp_path, base + f"  username: guard\n  password_file: {str(empty)!r}\n")),
                    "mqtt password file", "is empty")
    empty.write_text("s3cret\n")
    assert_one_line(*check(capsys, write(tmp_path, base + f"  password_file: {str(empty)!r}\n")),
                    "mqtt.username is null")
    assert_one_line(*check(capsys, write(tmp_path, base + f"  tls:\n    ca: {str(not_pem)!r}\n")),
                    "mqtt.tls.ca: cannot load")
    empty.write_bytes(b"s3c\0ret\n")  # MQTT brokers refuse it: the guard retried for ever, blaming TLS
    code, err = check(capsys, write(tmp_path, base + f"  username: guard\n  password_file: {str(empty)!r}\n"))
    assert_one_line(code, err, f"mqtt password file {str(empty)!r}: holds a NUL character, which MQTT brokers refuse")
    assert "s3c" not in err


def test_two_logs_in_one_file_are_refused_in_dev_shm_and_through_a_hard_link_but_devices_may_be_shared(tmp_path, capsys):
    one = tmp_path / "one.jsonl"
    one.write_text("")
    (tmp_path / "link.jsonl").hardlink_to(one)
    cases = {f"latency:\n  path: {one}\nsinks:\n  jsonl: {tmp_path / 'link.jsonl'}\n": "is also 'latency.path'",
             f"latency:\n  path: /dev/shm/t-{os.getpid()}.jsonl\nsinks:\n  jsonl: /dev/shm/t-{os.getpid()}.jsonl\n":
                 "is also 'latency.path'",
             "latency:\n  path: /dev/null\nsinks:\n  jsonl: /dev/null\n": None}
    for text, fragment in cases.items():
        path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\n" + text)
        code, err = check(capsys, path)
        if fragment is None:
            assert code == 0, err
        else:
            assert_one_line(code, err, fragment)


def test_no_file_the_guard_writes_may_be_one_it_reads(tmp_path, capsys):
    """A log appended its lines to the config, which then stopped parsing, and to the web password,
    which then no longer matched; the outbox moved a password file aside as corrupt."""
    from tracker.detect.model_files import YUNET

    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    config, yunet = tmp_path / "tracker.yaml", YUNET.find()
    cases = {f"latency:\n  path: {config}\n": f"key 'latency.path': {str(config)!r} is also the config file",
             f"web:\n  password_file: {secret}\nsinks:\n  jsonl: {secret}\n":
                 f"key 'sinks.jsonl': {str(secret)!r} is also key 'web.password_file'; expected a file of its own",
             f"mqtt:\n  enabled: true\n  username: guard\n  password_file: {secret}\n  outbox:\n    path: {secret}\n":
                 f"key 'mqtt.outbox.path': {str(secret)!r} is also key 'mqtt.password_file'",
             f"mqtt:\n  tls:\n    ca: {secret}\nlatency:\n  path: {secret}\n": "is also key 'mqtt.tls.ca'",
             f"mqtt:\n  tls:\n    cert: {secret}\n    key: {config}\nsinks:\n  jsonl: {secret}\n":
                 "is also key 'mqtt.tls.cert'",
             f"latency:\n  path: {DEFAULT_WEIGHTS}.json\n": "is also the card of key 'model.weights'",
             f"detect:\n  detector: yunet\n  model: {yunet}\nlatency:\n  path: {yunet}\n": "is also key 'detect.model'"}
    for text, fragment in cases.items():
        write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\n" + text)
        assert_one_line(*check(capsys, config), fragment)
    # the guard's start refuses it too: it is told which file its config is
    write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nsinks:\n  jsonl: {config}\n")
    assert_one_line(main(["--frames", "3", "--config", str(config)]), capsys.readouterr().err,
                    f"key 'sinks.jsonl': {str(config)!r} is also the config file")


def test_an_outbox_path_at_a_file_that_is_no_outbox_is_refused_but_a_damaged_database_is_not(tmp_path, capsys):
    """The guard's start moved a text file, or another program's database, at mqtt.outbox.path aside
    as a corrupt outbox (or wrote its tables into the database); a damaged database is still moved
    aside at start (tracker.sinks.outbox), not refused."""
    outbox = tmp_path / "notes.txt"
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nweb:\n  enabled: false\n"
                 f"mqtt:\n  enabled: true\n  outbox:\n    path: {outbox}\n")
    outbox.write_text("shopping list\n")
    assert_one_line(*check(capsys, path), f"key 'mqtt.outbox.path': {str(outbox)!r} is a file that is not an SQLite "
                    "database, which the guard would move aside as a corrupt outbox")
    for content in (b"", b"SQLite format 3\0" + b"\xff" * 100):  # empty (SQLite makes it one), damaged
        outbox.write_bytes(content)
        code, err = check(capsys, path)
        assert code == 0, err
    # another program's database (Home Assistant's has an `events` table too): moved aside, or given
    # the outbox's tables, by the guard's start; an outbox, of either column set, is taken
    import sqlite3

    from tracker.sinks.outbox import Outbox

    for name, schema in (("home-assistant_v2.db", "CREATE TABLE events (event_id INTEGER, event_type TEXT, time_fired REAL)"),
                         ("notes.db", "CREATE TABLE notes (text TEXT)"),
                         ("early-outbox.db", "CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT, "
                                             "created REAL, payload BLOB)")):
        outbox = tmp_path / name
        with sqlite3.connect(outbox) as db:
            db.execute(schema)
        db.close()
        path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nweb:\n  enabled: false\n"
                     f"mqtt:\n  enabled: true\n  outbox:\n    path: {outbox}\n")
        if name == "early-outbox.db":
            code, err = check(capsys, path)
            assert code == 0, err
        else:
            assert_one_line(*check(capsys, path), f"key 'mqtt.outbox.path': {str(outbox)!r} is an SQLite database of "
                            "other tables (")
    Outbox(tmp_path / "ours.db", max_events=10, max_age_s=60).close()
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nweb:\n  enabled: false\n"
                 f"mqtt:\n  enabled: true\n  outbox:\n    path: {tmp_path / 'ours.db'}\n")
    code, err = check(capsys, path)
    assert code == 0, err


def test_check_config_refuses_a_pi_camera_whose_library_the_run_cannot_import(tmp_path, capsys, monkeypatch):
    """The run refuses it with exit 2 (which the unit does not restart): the check must say so first."""
    monkeypatch.setitem(sys.modules, "picamera2", None)  # absent, as on any machine without apt's python3-picamera2
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nsource: {{kind: picamera2}}\n")
    assert_one_line(*check(capsys, path), "Pi camera 0: picamera2 is not importable")
    assert_one_line(*check(capsys, path, "--source", "picamera2:1"), "Pi camera 1: picamera2 is not importable")


def test_a_high_score_no_detection_of_the_detector_can_reach_is_refused(tmp_path, capsys):
    """YuNet's and BlazeFace's scores are probabilities: at 5.0 nobody was ever announced, and the
    check said the config was fine. Haar's are neighbour counts, so there it stands."""
    for detector, code in (("yunet", 2), ("haar", 0)):
        path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\ndetect: {{detector: {detector}}}\n"
                               "tracking: {high_score: 5.0}\n")
        got, err = check(capsys, path)
        assert got == code, err
    assert_one_line(*check(capsys, write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\n"
                                                   "tracking: {high_score: 1.0}\n")),
                    "key 'tracking.high_score': 1 with detector yunet, whose scores are at most 1")


@pytest.mark.parametrize("command", [["--check-config"], ["--list-backends"]])
def test_output_to_a_full_disk_is_one_line(tmp_path, command):
    """`tracker --check-config > file` on a full disk: a traceback (OSError, ENOSPC)."""
    config = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\n")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*tracker_command(), *command, "--config", str(config)], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=isolated_env(tmp_path), timeout=300)
    assert proc.returncode == 1
    assert proc.stderr == ("tracker: error: cannot write the output (No space left on device); expected room on the "
                           "disk it goes to\n"), proc.stderr


@pytest.mark.parametrize("stderr_too", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_a_reader_that_goes_away_is_no_error(tmp_path, stderr_too):
    """`tracker eval-mot ... | head -1` (and with 2>&1): a traceback and exit 1, or Python's
    "lost sys.stderr", when the failed write had emptied stdout's buffer. (The tracks are more than
    a pipe holds, so the reader is gone before the last write.)"""
    gt = tmp_path / "gt.txt"
    gt.write_text("".join(f"{f},{i},{100 * i},50,40,40,1\n" for f in range(1, 3001) for i in (1, 2)))
    proc = subprocess.Popen([*tracker_command(), "eval-mot", str(gt)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if stderr_too else subprocess.PIPE, env=isolated_env(tmp_path))
    first = proc.stdout.readline()
    proc.stdout.close()  # as head does after its line
    err = b"" if stderr_too else proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and first.startswith(b"1,1,") and err == b"", err.decode()


@pytest.mark.parametrize("net, fragment", [
    ('input: "data" input_shape { dim: 1 dim: 1 dim: 88 dim: 88 } '
     'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: STOCHASTIC kernel_size: 2 } }',
     "layer 'p' (Pooling): pool STOCHASTIC is not supported (only MAX and AVE)"),
    ('input: "data" input_shape { dim: 1 dim: 1 dim: 96 dim: 96 } layer { name: "p" type: "ReLU" bottom: "data" top: "p" }',
     "input (C, H, W) (1, 96, 96); the guard's face crops are (1, 88, 88) grey"),
    ('input: "data" input_shape { dim: 1 dim: 1 dim: 88 dim: 88 } input: "more" input_shape { dim: 1 dim: 1 dim: 88 dim: 88 } '
     'layer { name: "p" type: "Eltwise" bottom: "data" bottom: "more" top: "p" }',
     "the engine runs nets with exactly one input; found 2 (data, more)"),
    # two rows a face: the guard read the first image's rows for both
    ('input: "data" input_shape { dim: 1 dim: 1 dim: 88 dim: 88 } '
     'layer { name: "c" type: "Concat" bottom: "data" bottom: "data" top: "p" concat_param { axis: 0 } }',
     "blob 'p' of '{prototxt}' is (2, 1, 88, 88) for one image and (4, 1, 88, 88) for two; expected one row per image"),
    # conv1 of the shipped weights, padded by 2,000: a tiny file whose first forward asked for 1 GB
    ('input: "data" input_shape { dim: 1 dim: 1 dim: 88 dim: 88 } layer { name: "conv1" type: "Convolution" '
     'bottom: "data" top: "p" convolution_param { num_output: 16 kernel_size: 7 pad: 2000 } }',
     "its blobs need 1,017 MB for one image (blob 'p' is (1, 16, 4082, 4082)); expected at most 256 MB"),
])
def test_check_config_refuses_a_net_the_guard_refuses_when_it_loads(tmp_path, capsys, net, fragment):
    """--check-config read the files and their shapes but built nothing: these passed, and the
    guard then stopped with exit 2 at start-up (or, for two rows a face, with a traceback at its
    first face)."""
    prototxt = tmp_path / "net.prototxt"
    prototxt.write_text(net)
    path = write(tmp_path, f"state_dir: {str(tmp_path / 'state')!r}\nmodel:\n  prototxt: {str(prototxt)!r}\n"
                           f"  weights: {str(DEFAULT_WEIGHTS)!r}\n  probs: p\n  embedding: p\nidentity:\n  threshold: 0.5\n")
    assert_one_line(*check(capsys, path), fragment.format(prototxt=prototxt))
