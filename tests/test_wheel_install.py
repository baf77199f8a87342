"""The product installs as a wheel and runs outside the checkout.

The wheel is built from this checkout (pip, no build isolation: the project's own setuptools) and
installed, with its dependencies, into a fresh virtual environment in a temporary folder; then
`tracker --check-config`, `tracker --list-backends` and `tracker --demo --frames 20` run from
another temporary folder, so nothing of the checkout is on the path. The wheel carries the default
config, the prototxt, the shipped weights and their card (package data); the demo's face chips and
the YuNet model are not the project's, so they are named explicitly, as a user outside this
workspace would (source.faces_dir, TRACKER_MODEL_DIR).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from mosquitto import free_port

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DATA = ("tracker/data/config/tracker.yaml", "tracker/data/models/face_cnn.prototxt",
                "tracker/data/models/face_cnn.caffemodel", "tracker/data/models/face_cnn.caffemodel.json",
                "tracker/web/static/index.html", "tracker/web/static/app.js", "tracker/web/static/style.css")


def run(command: list, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{command}: {proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the fresh venv's bin folder, a working folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", REPO, "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist"], tmp)
    (wheel,) = (tmp / "dist").glob("tracker-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert set(PACKAGE_DATA) <= names, set(PACKAGE_DATA) - names
    assert not any(name.startswith(("tests/", "scripts/")) for name in names)
    run([sys.executable, "-m", "venv", tmp / "venv"], tmp)
    bin_dir = tmp / "venv" / "bin"
    run([bin_dir / "python", "-m", "pip", "install", "-q", wheel], tmp)
    work = tmp / "work"
    work.mkdir()
    return bin_dir, work


NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the page is on loopback, whatever *_proxy says


def fetch(url: str, guard: subprocess.Popen, timeout_s: float = 120.0) -> bytes:
    """GET `url` from the running `guard` once its page is up (it fails if the guard exits first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with NO_PROXY.open(url, timeout=10) as response:
                return response.read()
        except OSError:
            assert guard.poll() is None, f"the guard exited ({guard.returncode}) before serving {url}"
            assert time.monotonic() < deadline, f"no answer from {url} within {timeout_s:.0f} s"
            time.sleep(0.2)


def clean_env(work: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HOME=str(work), XDG_STATE_HOME=str(work / "state-home"), XDG_CACHE_HOME=str(work / "cache"), **extra)
    return env


def test_the_installed_package_is_not_the_checkout(installed):
    bin_dir, work = installed
    where = run([bin_dir / "python", "-c", "import tracker; print(tracker.__file__)"], work, clean_env(work)).stdout
    assert Path(where.strip()).is_relative_to(bin_dir.parent) and not Path(where.strip()).is_relative_to(REPO)


def test_check_config_and_list_backends_from_the_wheel(installed, testdata):
    bin_dir, work = installed
    # The default config's synthetic scene needs the shared data's faces, which no wheel carries:
    # --check-config says so, as the run would, and passes once they are pointed at.
    alone = subprocess.run([bin_dir / "tracker", "--check-config"], cwd=work, env=clean_env(work), capture_output=True,
                           text=True, timeout=600)
    assert alone.returncode == 2 and alone.stderr.count("\n") == 1, alone.stderr
    assert "synthetic scene: testdata/faces/dlib/johns not found in the shared data" in alone.stderr
    out = run([bin_dir / "tracker", "--check-config"], work, clean_env(work, TRACKER_SHARED_DIR=str(testdata.parent))).stdout
    assert out.startswith("config ok: ") and str(bin_dir.parent) in out  # the wheel's own default config
    listing = run([bin_dir / "tracker", "--list-backends"], work, clean_env(work)).stdout
    assert "caffe-openblas-dl" in listing and "onnxruntime" in listing


def test_the_demo_runs_from_the_wheel(installed, testdata):
    bin_dir, work = installed
    config = work / "demo.yaml"
    config.write_text(f"state_dir: {work / 'state'}\nsource: {{faces_dir: {testdata / 'faces' / 'dlib' / 'johns'}}}\n"
                      "sinks: {console: false}\n")
    env = clean_env(work, TRACKER_MODEL_DIR=str(REPO.parent / "shared" / "models" / "yunet"))
    proc = run([bin_dir / "tracker", "--demo", "--frames", "20", "--config", config], work, env)
    assert "detector yunet" in proc.stderr
    lines = (work / "state" / "demo" / "latency.jsonl").read_text().splitlines()
    assert len(lines) == 20
    # The web page's files come from the wheel too: served while a demo runs.
    port = free_port()
    (work / "web.yaml").write_text(config.read_text() + f"web: {{listen: '127.0.0.1:{port}'}}\n")
    guard = subprocess.Popen([bin_dir / "tracker", "--demo", "--frames", "600", "--config", work / "web.yaml"], cwd=work,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        page = fetch(f"http://127.0.0.1:{port}/", guard)
        script = fetch(f"http://127.0.0.1:{port}/static/app.js", guard)
    finally:
        guard.terminate()
        guard.communicate(timeout=60)
    assert b'id="live-view"' in page and b"X-CSRF-Token" in script
    # Without the benchmark's extra, --benchmark says which extra it needs (one line, exit 2).
    bench = subprocess.run([bin_dir / "tracker", "--benchmark", "--backend", "caffe-openblas"], cwd=work,
                           env=clean_env(work), capture_output=True, text=True, timeout=300)
    assert bench.returncode == 2 and "tracker[bench]" in bench.stderr and "Traceback" not in bench.stderr
