import json

from tracker.latency import STAGES, FrameLatency, LatencyLog, RollingStats


def record(seq, infer=1.0):
    return FrameLatency(seq, seq * 1000, "caffe-openblas-dl", 1, 1, 0.1, 0.2, 3.0, 0.7, infer, 0.4, 0.5, 5.9 + infer, 0)


def test_one_json_line_per_frame_with_the_documented_keys(tmp_path):
    log = LatencyLog(tmp_path / "latency.jsonl")
    for seq in range(3):
        log.write(record(seq))
    log.close()
    lines = (tmp_path / "latency.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [0, 1, 2]
    assert list(json.loads(lines[0])) == [
        "seq", "t_ns", "backend", "batch", "faces", "capture_ms", "motion_ms", "detect_ms", "batch_wait_ms",
        "infer_ms", "track_ms", "publish_ms", "total_ms", "dropped"]
    assert list(json.loads(lines[0]))[5:-1] == list(STAGES)


def test_rotation_bounds_the_files_and_keeps_the_newest_lines(tmp_path):
    path = tmp_path / "latency.jsonl"
    log = LatencyLog(path, max_bytes=2000, backups=2)
    for seq in range(200):
        log.write(record(seq))
    log.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["latency.jsonl", "latency.jsonl.1", "latency.jsonl.2"]
    assert all(f.stat().st_size <= 2000 for f in files)
    newest = [json.loads(x)["seq"] for x in path.read_text().splitlines()]
    assert newest[-1] == 199
    older = [json.loads(x)["seq"] for x in (tmp_path / "latency.jsonl.1").read_text().splitlines()]
    assert older[-1] + 1 == newest[0]


def test_rolling_percentiles_cover_only_the_window():
    stats = RollingStats(window=100)
    assert stats.percentiles() == {}
    for seq in range(100):
        stats.add(record(seq, infer=1000.0))  # pushed out of the window below
    for seq in range(100):
        stats.add(record(seq, infer=float(seq)))
    p = stats.percentiles()["infer_ms"]
    assert len(stats) == 100
    assert p["p50"] == 49.5 and abs(p["p95"] - 94.05) < 1e-9
