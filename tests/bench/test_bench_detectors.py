"""`tracker --benchmark --detectors`: rows per detector x size x mode with times and recall, the
dlib photos' counts, the frame budget line, JSON/CSV/plots; and its bad input."""

from __future__ import annotations

import csv
import json

import pytest

from tracker.bench.detectors import detect_settings, parse_detector_names, run_detector_benchmark
from tracker.cli import main
from tracker.config import parse_config
from tracker.errors import InputError


def test_detector_benchmark_writes_rows_dlib_counts_and_the_budget(tmp_path, testdata, capsys):
    config = parse_config({"state_dir": str(tmp_path / "state")})
    assert run_detector_benchmark(config, ["yunet", "haar"], tmp_path / "out", frames=30) == 0
    result = json.loads((tmp_path / "out" / "detectors.json").read_text())
    rows = {(r["detector"], r["size"], r["mode"]): r for r in result["rows"]}
    assert set(rows) == {(d, s, m) for d in ("yunet", "haar") for s in ("320x240", "640x480") for m in ("whole", "regions")}
    for r in rows.values():
        assert r["frames"] == 30 and 0 < r["p50_ms"] <= r["p95_ms"] and r["faces"] > 0
        assert 0.0 <= r["recall"] <= 1.0
    assert rows[("yunet", "320x240", "regions")]["recall"] >= 0.9
    assert result["dlib"]["yunet"]["faces"] == 43 and result["dlib"]["yunet"]["found"] >= 42
    budget = result["budget"]
    assert budget["detector"] == "yunet" and budget["fps"] > 0
    assert budget["total_ms"] == pytest.approx(budget["detect_ms"] + budget["crop_ms"] + budget["infer_ms"]
                                               + budget["track_ms"], abs=0.01)
    with open(tmp_path / "out" / "detectors.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 8
    for name in ("detectors_ms_linear.png", "detectors_ms_log.png"):
        assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "frame budget (yunet at 320 px, regions" in printed and "fps" in printed


def test_the_configured_settings_go_only_to_their_own_detector(tmp_path):
    """`detect.model` names the configured detector's file: `--detectors all` must not hand a YuNet
    file to BlazeFace (its sha256 check would stop the benchmark with exit 2); nor a threshold set
    for YuNet (0.95 found 1 of dlib's 43 faces with BlazeFace too)."""
    model = tmp_path / "yunet.onnx"
    model.write_bytes(b"onnx")
    config = parse_config({"state_dir": str(tmp_path / "state"),
                           "detect": {"detector": "yunet", "model": str(model), "detect_width": 320,
                                      "score_threshold": 0.95, "min_face_px": 40}})
    mine = detect_settings(config, "yunet", detect_width=640)
    assert (mine.model, mine.detect_width, mine.score_threshold) == (model, 640, 0.95)
    for other in ("blazeface", "haar"):
        settings = detect_settings(config, other, detect_width=640)
        assert settings.detector == other and settings.model is None and settings.detect_width == 640
        assert settings.score_threshold is None and settings.min_face_px == 24  # the defaults


def test_detector_names_are_checked():
    assert parse_detector_names("all") == ["yunet", "blazeface", "haar"]
    assert parse_detector_names("haar, yunet,haar") == ["haar", "yunet"]
    with pytest.raises(InputError, match="--detectors: unknown detector 'mtcnn'; expected a comma list of yunet, "
                                         "blazeface, haar, or all"):
        parse_detector_names("yunet,mtcnn")
    with pytest.raises(InputError, match="--detectors: an empty name in 'haar,,yunet'"):
        parse_detector_names("haar,,yunet")


def test_detectors_without_benchmark_is_a_user_mistake(capsys):
    assert main(["--detectors", "all"]) == 2
    assert "only with --benchmark" in capsys.readouterr().err


def test_an_interrupted_detector_benchmark_keeps_and_prints_its_rows(tmp_path):
    """SIGTERM after the first row: the rows measured stay in detectors.json (not complete), the
    table is printed, exit 130. (Nothing was written before the whole run had ended.)"""
    import signal
    import subprocess
    import time

    from test_pipeline_e2e import isolated_env, tracker_command

    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([*tracker_command(), "--config", str(config), "--benchmark", "--detectors", "haar,yunet",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=isolated_env(tmp_path))
    try:
        deadline = time.monotonic() + 300
        while not (out / "detectors.json").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    result = json.loads((out / "detectors.json").read_text())
    assert result["complete"] is False and result["rows"] and result["budget"] is None
    assert "frame budget: not measured (the run was interrupted)" in stdout and "Traceback" not in stderr


def test_an_output_folder_that_is_a_file_is_one_line(tmp_path, capsys):
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    (tmp_path / "afile").write_text("")
    assert main(["--config", str(config), "--benchmark", "--detectors", "haar", "--out", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out: cannot use" in err and "expected a writable directory" in err


def test_the_dlib_step_reports_annotations_it_cannot_use_as_its_row(tmp_path, monkeypatch):
    """A missing or damaged annotation file, or one marking no face, was a traceback (FileNotFoundError,
    ZeroDivisionError) that lost the rows measured before it."""
    import tracker.bench.detectors as detectors

    folder = tmp_path / "faces"
    folder.mkdir()
    monkeypatch.setattr(detectors.shared_data, "locate", lambda *args: folder)
    config = parse_config({"state_dir": str(tmp_path / "state")})
    assert "testing.xml' cannot be read" in detectors._dlib("haar", config)["error"]
    (folder / "testing.xml").write_text("<dataset><images>")
    assert "testing.xml' cannot be read" in detectors._dlib("haar", config)["error"]
    for name in ("testing.xml", "training.xml"):
        (folder / name).write_text("<dataset><images></images></dataset>")
    assert detectors._dlib("haar", config) == {"error": f"dlib annotations in {str(folder)!r} mark no face"}


def test_a_detector_benchmark_stopped_before_its_first_row_writes_nothing(tmp_path, monkeypatch, capsys):
    """An earlier run's files stay (they were replaced by an empty run's). The interrupt is raised
    where the signal handler raises it (tracker.interrupts), in the first row's scene."""
    import tracker.bench.detectors as detectors

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(detectors, "_run_scene", interrupted)
    out = tmp_path / "out"
    out.mkdir()
    (out / "detectors.json").write_text('{"earlier": true}')
    config = parse_config({"state_dir": str(tmp_path / "state")})
    assert run_detector_benchmark(config, ["haar"], out, frames=3) == 130
    assert "stopped before any detector was measured; nothing written" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["detectors.json"] and (out / "detectors.json").read_text() == '{"earlier": true}'


def test_the_configured_guards_mistakes_are_refused_before_the_detectors_are_measured(tmp_path, capsys):
    """The frame budget comes last: a config whose model the guard would refuse failed there, after
    every row, and the table and plots were lost."""
    config = tmp_path / "tracker.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\nmodel: {{embedding: nope}}\n")
    assert main(["--config", str(config), "--benchmark", "--detectors", "haar", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config: key 'model.embedding': blob 'nope' is not in the net" in err
    assert not (tmp_path / "out").exists()
