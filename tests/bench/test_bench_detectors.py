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


def test_the_configured_model_goes_only_to_its_own_detector(tmp_path):
    """`detect.model` names the configured detector's file: `--detectors all` must not hand a YuNet
    file to BlazeFace (its sha256 check would stop the benchmark with exit 2)."""
    model = tmp_path / "yunet.onnx"
    model.write_bytes(b"onnx")
    config = parse_config({"state_dir": str(tmp_path / "state"),
                           "detect": {"detector": "yunet", "model": str(model), "detect_width": 320}})
    assert detect_settings(config, "yunet", detect_width=640).model == model
    assert detect_settings(config, "yunet", detect_width=640).detect_width == 640
    for other in ("blazeface", "haar"):
        settings = detect_settings(config, other, detect_width=640)
        assert settings.detector == other and settings.model is None


def test_detector_names_are_checked():
    assert parse_detector_names("all") == ["yunet", "blazeface", "haar"]
    assert parse_detector_names("haar, yunet,haar") == ["haar", "yunet"]
    with pytest.raises(InputError, match="unknown detector 'mtcnn'; expected a comma list of yunet, blazeface, haar or all"):
        parse_detector_names("yunet,mtcnn")
    with pytest.raises(InputError, match="bad value ','"):
        parse_detector_names(",")


def test_detectors_without_benchmark_is_a_user_mistake(capsys):
    assert main(["--detectors", "all"]) == 2
    assert "only with --benchmark" in capsys.readouterr().err
