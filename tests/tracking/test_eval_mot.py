"""`tracker eval-mot` end to end through the real CLI, on the shared MOTChallenge sequences."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracker.cli import main
from tracker.tracking.metrics import MotMetrics, evaluate
from tracker.tracking.mot import MotTable, read_mot, write_mot
from tracker.tracking.noisy import DetectionNoise, noisy_detections
from tracker.tracking.noisy import main as noisy_main

SEQS = ("TUD-Campus", "TUD-Stadtmitte")
# Floors for the tracker on gt-derived detections (seed 0: 10% dropped, 5% jitter, 0.2 false
# detections a frame). Measured (README): Campus MOTA 0.950 IDF1 0.962, Stadtmitte 0.994 / 0.997.
FLOORS = {"TUD-Campus": (0.90, 0.90), "TUD-Stadtmitte": (0.95, 0.95)}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def parse_table(stdout: str) -> dict[str, float]:
    header, values = stdout.strip().splitlines()[-2:]
    return {h: float(v) for h, v in zip(header.split()[1:], values.split()[1:])}


@pytest.fixture
def noisy(testdata, tmp_path):
    """Write seed-0 noisy detections for a sequence (through the module's own command)."""

    def make(seq: str, seed: int = 0) -> tuple[Path, Path]:
        gt = testdata / "mot" / seq / "gt.txt"
        dets = tmp_path / f"{seq}-{seed}-det.txt"
        assert noisy_main([str(gt), str(dets), "--seed", str(seed)]) == 0
        return gt, dets

    return make


@pytest.mark.parametrize("seq", SEQS)
def test_tracker_on_noisy_gt_detections(noisy, tmp_path, capsys, seq):
    gt, dets = noisy(seq)
    out = tmp_path / "tracks.txt"
    rc, stdout, stderr = run(["eval-mot", str(dets), "--gt", str(gt), "--out", str(out)], capsys)
    assert rc == 0, stderr
    table = parse_table(stdout)
    assert stdout.splitlines()[-1].split()[0] == seq
    assert list(table) == [h for h, _, _ in MotMetrics.COLUMNS]
    mota_floor, idf1_floor = FLOORS[seq]
    assert table["MOTA"] >= mota_floor and table["IDF1"] >= idf1_floor, table
    assert table["GT"] == len(set(read_mot(gt, "gt").ids.tolist()))

    # The written file is valid tracker output and scores as printed.
    tracks = read_mot(out, "tracks")
    assert len(tracks) > 0 and tracks.last_frame <= read_mot(gt, "gt").last_frame
    rescored = evaluate(read_mot(gt, "gt"), tracks)
    assert rescored.mota == pytest.approx(table["MOTA"], abs=1e-3)
    assert rescored.idf1 == pytest.approx(table["IDF1"], abs=1e-3)

    # Online output (no back-filling) writes fewer boxes and so recalls less.
    rc, stdout2, _ = run(["eval-mot", str(dets), "--gt", str(gt), "--no-backfill"], capsys)
    assert rc == 0 and parse_table(stdout2)["Rcll"] < table["Rcll"]


def test_tracker_beats_its_detections(noisy, testdata, capsys):
    """Tracking must do better than scoring the noisy detections directly, each as its own id."""
    gt_path, dets_path = noisy("TUD-Campus", seed=3)
    rc, stdout, _ = run(["eval-mot", str(dets_path), "--gt", str(gt_path)], capsys)
    assert rc == 0
    dets = read_mot(dets_path, "detections")
    as_tracks = type(dets)(dets.frames, dets.ids.copy(), dets.boxes, dets.conf)
    as_tracks.ids[:] = range(len(dets))  # no identities at all
    raw = evaluate(read_mot(gt_path, "gt"), as_tracks)
    assert parse_table(stdout)["MOTA"] > raw.mota and parse_table(stdout)["IDF1"] > raw.idf1


@pytest.mark.parametrize("seq", SEQS)
def test_published_tracker_output_as_detections(testdata, tmp_path, capsys, seq):
    """The published tracker's boxes fed back as detections: our ids must stay about as good."""
    seqdir = testdata / "mot" / seq
    rc, stdout, stderr = run(["eval-mot", str(seqdir / "test.txt"), "--gt", str(seqdir / "gt.txt")], capsys)
    assert rc == 0, stderr
    table = parse_table(stdout)
    assert table["MOTA"] >= 0.5 and table["IDF1"] >= 0.5, table
    # Detections the published tracker did not output cannot appear: recall cannot rise much
    # above its 0.58-0.61 (back-filled gaps may add a few predicted boxes).
    assert table["Rcll"] <= 0.65


def test_tracks_to_stdout_without_out_or_gt(noisy, capsys):
    _, dets = noisy("TUD-Campus")
    rc, stdout, stderr = run(["eval-mot", str(dets), "--min-hits", "2", "--max-age", "3", "--iou-threshold", "0.4"], capsys)
    assert rc == 0
    lines = stdout.splitlines()
    assert lines and all(len(line.split(",")) == 10 for line in lines)
    assert "eval-mot: 71 frames" in stderr


@pytest.mark.parametrize("w, h", [(0.05, 0.05), (0.5, 2000.0)])
def test_the_smallest_and_thinnest_boxes_the_files_hold_are_tracked_as_they_are(tmp_path, capsys, w, h):
    """The filter reported no area below 0.01 px^2 and no aspect below 1e-3, boxes the files may
    hold: a 0.05 px box still came out 0.1 px (a new track every frame, each of IoU 0.25 with its
    detection), and a 0.5 x 2,000 one came out 1 x 1,000."""
    dets = tmp_path / "det.txt"
    dets.write_text("".join(f"{f},-1,10,10,{w},{h},1\n" for f in range(1, 5)))
    rc, stdout, _ = run(["eval-mot", str(dets), "--min-hits", "1"], capsys)
    assert rc == 0
    rows = [line.split(",") for line in stdout.splitlines()]
    assert [(int(r[1]), float(r[4]), float(r[5])) for r in rows] == [(1, w, h)] * 4


def test_parameters_change_the_result(noisy, capsys):
    gt, dets = noisy("TUD-Stadtmitte")
    _, a, _ = run(["eval-mot", str(dets), "--gt", str(gt)], capsys)
    _, b, _ = run(["eval-mot", str(dets), "--gt", str(gt), "--min-hits", "8"], capsys)
    assert parse_table(a) != parse_table(b)


def test_low_score_detections_only_continue_tracks(testdata, tmp_path, capsys):
    """ByteTrack through the CLI on the ground truth's boxes scored 0.9, every fourth frame 0.3:
    with --high-score 0.5 the 0.3 frames continue the tracks (recall stays high; dropping them would
    cap it near 3/4) without starting any; above every score, nothing starts at all."""
    gt_path = testdata / "mot" / "TUD-Stadtmitte" / "gt.txt"
    gt = read_mot(gt_path, "gt")
    dets = tmp_path / "scored.txt"
    write_mot(dets, MotTable.from_rows([(int(f), -1, *map(float, b), 0.3 if f % 4 == 0 else 0.9)
                                        for f, b in zip(gt.frames, gt.boxes)]))
    base = ["eval-mot", str(dets), "--gt", str(gt_path), "--no-backfill"]
    _, every, _ = run(base + ["--high-score", "none"], capsys)
    rc, byte, err = run(base + ["--high-score", "0.5"], capsys)
    assert rc == 0, err
    assert parse_table(byte)["Rcll"] > 0.85 and parse_table(byte)["Rcll"] >= parse_table(every)["Rcll"] - 0.05
    rc, nothing, err = run(base + ["--high-score", "0.95"], capsys)
    assert rc == 0 and "-> 0 tracks" in err and parse_table(nothing)["Rcll"] == 0.0


def test_observation_centric_option_changes_the_tracker(testdata, capsys):
    """--observation-centric reaches the tracker: on SORT-like settings the published tracker's
    boxes, used as detections, give other figures with it than without."""
    seqdir = testdata / "mot" / "TUD-Stadtmitte"
    base = ["eval-mot", str(seqdir / "test.txt"), "--gt", str(seqdir / "gt.txt"), "--no-backfill", "--max-age", "30"]
    _, plain, _ = run(base, capsys)
    _, oc, _ = run(base + ["--observation-centric"], capsys)
    assert parse_table(plain) != parse_table(oc)


def test_no_observation_centric_overrides_a_config_that_turns_it_on(testdata, tmp_path, capsys):
    seqdir = testdata / "mot" / "TUD-Stadtmitte"
    config = tmp_path / "tracker.yaml"
    config.write_text("tracking: {observation_centric: true}\n")
    base = ["eval-mot", str(seqdir / "test.txt"), "--gt", str(seqdir / "gt.txt"), "--no-backfill", "--max-age", "30"]
    _, plain, _ = run(base + ["--no-observation-centric"], capsys)
    _, off, _ = run(base + ["--config", str(config), "--no-observation-centric"], capsys)
    _, on, _ = run(base + ["--config", str(config)], capsys)
    assert parse_table(off) == parse_table(plain) != parse_table(on)


def test_noisy_detections_deterministic(testdata):
    gt = read_mot(testdata / "mot" / "TUD-Campus" / "gt.txt", "gt")
    (a, _), (b, _) = noisy_detections(gt, DetectionNoise(seed=5)), noisy_detections(gt, DetectionNoise(seed=5))
    c, _ = noisy_detections(gt, DetectionNoise(seed=6))
    assert (a.boxes == b.boxes).all() and a.frames.tolist() == b.frames.tolist()
    assert len(a) != len(c) or (a.boxes != c.boxes).any()
    none, out_of_bounds = noisy_detections(gt, DetectionNoise(drop=0.0, false_per_frame=0.0, pos_sigma=0.0, size_sigma=0.0))
    assert len(none) == len(gt) and out_of_bounds == 0


def _one_error_line(rc: int, stderr: str) -> str:
    assert rc == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_bad_inputs(testdata, tmp_path, capsys):
    gt = testdata / "mot" / "TUD-Campus" / "gt.txt"
    dets = tmp_path / "dets.txt"
    dets.write_text("1,-1,10,10,20,20,0.9,-1,-1,-1\n2,-1,11,10,20,20,0.9\n3,-1,12,10,20\n")

    line = _one_error_line(*run(["eval-mot", str(tmp_path / "absent.txt")], capsys)[::2])
    assert "absent.txt" in line and "not found" in line

    line = _one_error_line(*run(["eval-mot", str(dets)], capsys)[::2])
    assert "dets.txt" in line and "line 3" in line and "expected at least 6" in line

    good = tmp_path / "good.txt"
    good.write_text("1,-1,10,10,20,20,0.9,-1,-1,-1\n")
    line = _one_error_line(*run(["eval-mot", str(good), "--gt", str(tmp_path / "nogt.txt")], capsys)[::2])
    assert "gt file" in line and "nogt.txt" in line

    ignore_only = tmp_path / "ignore.txt"
    ignore_only.write_text("1,1,10,10,20,20,0,-1,-1,-1\n")
    line = _one_error_line(*run(["eval-mot", str(good), "--gt", str(ignore_only)], capsys)[::2])
    assert "no boxes to score" in line

    dup = tmp_path / "dup.txt"
    dup.write_text("1,1,10,10,20,20,1\n1,1,12,10,20,20,1\n")
    line = _one_error_line(*run(["eval-mot", str(good), "--gt", str(dup)], capsys)[::2])
    assert "line 2" in line and "appears twice" in line

    for option, value in (("--min-hits", "0"), ("--max-age", "x"), ("--iou-threshold", "1.5"), ("--high-score", "-1"),
                          ("--high-score", "high")):
        line = _one_error_line(*run(["eval-mot", str(good), option, value], capsys)[::2])
        assert option in line and repr(value) in line

    line = _one_error_line(*run(["eval-mot", str(good), "--out", str(tmp_path / "missing" / "t.txt")], capsys)[::2])
    assert "cannot write" in line

    line = _one_error_line(*run(["eval-mot"], capsys)[::2])
    assert "detections" in line

    assert noisy_main([str(gt), str(tmp_path / "n.txt"), "--drop", "1.5"]) == 2
    capsys.readouterr()
    # the infinite score made every detection a low one: no tracks, silently
    line = _one_error_line(*run(["eval-mot", str(good), "--high-score", "inf"], capsys)[::2])
    assert "--high-score" in line and "'inf'" in line


@pytest.mark.parametrize("option, value", [("--seed", "-1"), ("--false-per-frame", "1e8"), ("--pos-sigma", "inf"),
                                           ("--size-sigma", "nan"), ("--drop", "1")])
def test_noisy_options_out_of_range_are_one_line_naming_the_option(testdata, tmp_path, capsys, option, value):
    gt = testdata / "mot" / "TUD-Campus" / "gt.txt"
    line = _one_error_line(noisy_main([str(gt), str(tmp_path / "n.txt"), option, value]), capsys.readouterr().err)
    assert option in line and repr(value) in line and "expected" in line
    assert not (tmp_path / "n.txt").exists()


def test_noisy_false_detections_are_bounded_in_all(tmp_path, capsys):
    """Two boxes 2,000 frames apart at 100 false detections a frame: 200,100 rows in memory (at
    1,000 a frame, 770 MB)."""
    gt = tmp_path / "gt.txt"
    gt.write_text("1,1,10,10,20,20,1\n2001,1,10,10,20,20,1\n")
    line = _one_error_line(noisy_main([str(gt), str(tmp_path / "n.txt"), "--false-per-frame", "100"]),
                           capsys.readouterr().err)
    assert line.startswith("tracker: error: --false-per-frame: 100 over the 2,001 frames of") and "200,100" in line
    assert not (tmp_path / "n.txt").exists()
    assert noisy_main([str(gt), str(tmp_path / "n.txt"), "--false-per-frame", "99"]) == 0


def test_noisy_detections_of_a_crowded_frame_stay_within_eval_mots_bound(tmp_path):
    """A frame of 1,000 ground-truth boxes and false detections on top: eval-mot refused the file
    noisy wrote (box number 1001 of frame 1)."""
    from tracker.tracking.mot import MAX_BOXES_PER_FRAME

    gt = MotTable.from_rows([(1, i, 25.0 * (i % 40), 25.0 * (i // 40), 20.0, 20.0, 1.0)
                             for i in range(MAX_BOXES_PER_FRAME)])
    dets, _ = noisy_detections(gt, DetectionNoise(drop=0.0, false_per_frame=20.0))
    assert len(dets) == MAX_BOXES_PER_FRAME
    write_mot(tmp_path / "det.txt", dets)
    assert len(read_mot(tmp_path / "det.txt", "detections")) == MAX_BOXES_PER_FRAME


def test_noisy_boxes_beyond_eval_mots_bound_are_left_out_and_counted(tmp_path, capsys):
    """--size-sigma 10 scales boxes by exp(N(0, 10)): eval-mot refused the file noisy wrote (a box
    wider than mot.MAX_PIXELS)."""
    gt = tmp_path / "gt.txt"
    gt.write_text("".join(f"{f},1,100,100,50,50,1\n" for f in range(1, 101)))
    dets = tmp_path / "dets.txt"
    assert noisy_main([str(gt), str(dets), "--size-sigma", "10", "--drop", "0", "--false-per-frame", "0"]) == 0
    line = capsys.readouterr().err.strip()
    written = len(read_mot(dets, "detections"))
    left_out = 100 - written
    assert 0 < written < 100 and line == f"wrote {written} detections to {dets} ({left_out} noisy boxes beyond 1,000,000 pixels left out)"
    rc, _, stderr = run(["eval-mot", str(dets), "--gt", str(gt)], capsys)
    assert rc == 0, stderr


def test_an_output_that_is_an_input_is_refused_before_it_is_written(testdata, tmp_path, capsys):
    gt = tmp_path / "gt.txt"
    gt.write_bytes((testdata / "mot" / "TUD-Campus" / "gt.txt").read_bytes())
    before = gt.read_bytes()
    dets = tmp_path / "dets.txt"
    assert noisy_main([str(gt), str(dets)]) == 0
    capsys.readouterr()
    line = _one_error_line(*run(["eval-mot", str(dets), "--gt", str(gt), "--out", str(gt)], capsys)[::2])
    assert "is the ground-truth file" in line
    line = _one_error_line(*run(["eval-mot", str(dets), "--out", str(tmp_path / "." / "dets.txt")], capsys)[::2])
    assert "is the detections file" in line
    assert noisy_main([str(gt), str(gt)]) == 2 and "is the ground-truth file" in capsys.readouterr().err
    assert gt.read_bytes() == before
    config = tmp_path / "tracker.yaml"
    config.write_text("tracking: {min_hits: 2}\n")
    line = _one_error_line(*run(["eval-mot", str(dets), "--config", str(config), "--out", str(config)], capsys)[::2])
    assert "is the config file" in line and config.read_text() == "tracking: {min_hits: 2}\n"


@pytest.mark.parametrize("seq", SEQS)
def test_tracks_of_another_tracker_are_scored_as_they_are(testdata, capsys, seq):
    """The published tracker's own output scored with --tracks gives the devkit's figures (the
    shared data's README table), without running ours."""
    seqdir = testdata / "mot" / seq
    rc, stdout, stderr = run(["eval-mot", "--tracks", str(seqdir / "test.txt"), "--gt", str(seqdir / "gt.txt")], capsys)
    assert rc == 0, stderr
    expected = evaluate(read_mot(seqdir / "gt.txt", "gt"), read_mot(seqdir / "test.txt", "tracks"))
    table = parse_table(stdout)
    assert table["MOTA"] == pytest.approx(expected.mota, abs=1e-4) and table["IDF1"] == pytest.approx(expected.idf1, abs=1e-4)
    assert {"TUD-Campus": 0.526462, "TUD-Stadtmitte": 0.564014}[seq] == pytest.approx(table["MOTA"], abs=1e-4)


def test_the_tracking_section_of_a_config_gives_the_defaults(noisy, tmp_path, capsys):
    gt, dets = noisy("TUD-Stadtmitte")
    config = tmp_path / "tracker.yaml"
    config.write_text("tracking: {min_hits: 8}\n")
    _, from_config, _ = run(["eval-mot", str(dets), "--gt", str(gt), "--config", str(config)], capsys)
    _, from_flag, _ = run(["eval-mot", str(dets), "--gt", str(gt), "--min-hits", "8"], capsys)
    _, overridden, _ = run(["eval-mot", str(dets), "--gt", str(gt), "--config", str(config), "--min-hits", "3"], capsys)
    _, default, _ = run(["eval-mot", str(dets), "--gt", str(gt)], capsys)
    assert parse_table(from_config) == parse_table(from_flag)
    assert parse_table(overridden) == parse_table(default) != parse_table(from_config)


@pytest.mark.parametrize("args, expected", [
    ([], "expected a detections file to track, or --tracks FILE"),
    (["DETS", "--tracks", "TRACKS", "--gt", "GT"], "give a detections file to track or --tracks FILE to score, not both"),
    (["--tracks", "TRACKS"], "--gt is missing"),
    (["--tracks", "TRACKS", "--gt", "GT", "--min-hits", "2"], "--min-hits would change nothing"),
])
def test_bad_tracks_scoring_is_one_line(testdata, capsys, args, expected):
    seqdir = testdata / "mot" / "TUD-Campus"
    names = {"DETS": seqdir / "test.txt", "TRACKS": seqdir / "test.txt", "GT": seqdir / "gt.txt"}
    rc, _, stderr = run(["eval-mot", *(str(names.get(a, a)) for a in args)], capsys)
    assert expected in _one_error_line(rc, stderr)
