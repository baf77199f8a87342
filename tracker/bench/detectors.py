"""`tracker --benchmark --detectors yunet,blazeface,haar|all`: what finding faces costs and finds.

Each detector runs with the config's detect settings if it is the configured one, else with its
defaults (`detect_settings`), at two frame sizes, 320x240 and 640x480 (detect_width = the frame's
width), in two modes, on FRAMES frames of the synthetic scene (seed 0, 10 fps; one 20 s cycle:
walks, a crossing, a stop, the pillar, empty stretches):
    whole    every frame searched whole;
    regions  as the guard does: the motion gate first; a frame where nothing moved is not
             searched (the previous faces are carried over); otherwise the moving regions plus the
             previous frame's faces are searched (the guard adds its tracks' predicted boxes,
             mostly where those faces are: the rows run no tracker). The time includes the
             motion gate.
Metrics per row: ms per frame (mean, p50, p95, perf_counter_ns around the work of a frame),
recall of the scene's whole faces (visible >= 0.95, IoU >= 0.5) and false positives (a detection
overlapping no face, IoU < 0.3, partly hidden faces included); and, once per detector on each
photo's own width, recall and false positives on dlib's annotated photos
(../shared/testdata/faces/dlib/faces, testing.xml and training.xml, IoU >= 0.3). Haar at 640 px is
the reference the README compares with.

Then the frame budget of the configured guard: its detector and detect_width with its region
setting on the scene at the configured source size (a camera larger than the scene's bound:
scaled to it at its aspect), plus the crops, plus the configured backend's
forward pass at the mean number of faces per searched frame (measured here, in-process), plus
the tracker's update: as frames per second.

Outputs in --out: detectors.json and detectors.csv, rewritten after each row ("complete" false
until the frame budget is in), then detectors_ms_linear.png and detectors_ms_log.png. Ctrl-C,
SIGTERM or SIGHUP stops the run with what was measured written and printed (exit 130).
"""

from __future__ import annotations

import csv
import io
import json
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

from tracker import shared_data
from tracker.arguments import comma_names
from tracker.bench.report import prepare_out
from tracker.config import Config, DetectConfig
from tracker.crops import crop_batch
from tracker.detect import DETECTORS, create_detector, resolve_detector
from tracker.errors import BackendUnavailable, InputError, ModelError
from tracker.files import atomic_write
from tracker.images import read_image
from tracker.interrupts import stop_as_ctrl_c
from tracker.machine import cpu_model, load_average
from tracker.motion import MotionGate
from tracker.preflight import check_inference
from tracker.tracking.assign import box_rows, iou_matrix
from tracker.types import Box

FRAMES = 200
SIZES = ((320, 240), (640, 480))
MODES = ("whole", "regions")
DLIB_FACES = "testdata/faces/dlib/faces"  # in the shared data: the annotated photos beside the scene's face chips
CSV_FIELDS = ("detector", "size", "mode", "frames", "mean_ms", "p50_ms", "p95_ms", "faces", "found", "recall",
              "false_positives")


@dataclass
class Row:
    detector: str
    size: str
    mode: str
    times_ms: list[float]
    faces: int
    found: int
    false_positives: int
    mean_faces: float  # detections per searched frame

    def summary(self) -> dict:
        t = np.asarray(self.times_ms)
        return {"detector": self.detector, "size": self.size, "mode": self.mode, "frames": len(t),
                "mean_ms": round(float(t.mean()), 3), "p50_ms": round(float(np.percentile(t, 50)), 3),
                "p95_ms": round(float(np.percentile(t, 95)), 3), "faces": self.faces, "found": self.found,
                "recall": round(self.found / max(self.faces, 1), 4), "false_positives": self.false_positives}


def parse_detector_names(text: str) -> list[str]:
    """'a,b' or 'all' -> detector names (not auto); InputError naming the bad one."""
    return comma_names(text, [d for d in DETECTORS if d != "auto"], "--detectors", "detector")[0]


def _matches(truth: list[Box], found: list[Box], threshold: float) -> int:
    """Faces of `truth` matched one-to-one by `found` at IoU >= threshold."""
    if not truth or not found:
        return 0
    ok = (iou_matrix(box_rows(truth), box_rows(found)) >= threshold).astype(float)
    rows, cols = linear_sum_assignment(-ok)
    return int(ok[rows, cols].sum())


def _false_positives(found: list[Box], truth: list[Box]) -> int:
    """Detections overlapping no face at IoU >= 0.3 (partly hidden faces count as faces)."""
    if not found:
        return 0
    if not truth:
        return len(found)
    return int((iou_matrix(box_rows(found), box_rows(truth)).max(axis=1) < 0.3).sum())


def _run_scene(detector, width: int, height: int, mode: str, frames: int, crops: bool = False,
               backend=None, tracker=None) -> tuple[Row, dict]:
    """One row on the scene; with crops/backend/tracker also the other stages' times (ms/frame)."""
    from tracker.sources.synthetic import SyntheticScene

    scene = SyntheticScene(width, height, 10.0, seed=0)
    gate = MotionGate()
    previous: list = []
    times: list[float] = []
    stage: dict[str, list[float]] = {"crop_ms": [], "infer_ms": [], "track_ms": []}
    faces = found = false = searched = detections = 0
    for n in range(frames):
        image, truth = scene.render(n)
        start = time.perf_counter_ns()
        if mode == "whole":
            found_now, fresh = detector.detect(image), True
        else:
            motion = gate.update(image)
            fresh = motion.moving
            found_now = detector.detect(image, [*motion.regions, *(d.box for d in previous)]) if fresh else previous
        times.append((time.perf_counter_ns() - start) / 1e6)
        previous = found_now
        if fresh:
            searched, detections = searched + 1, detections + len(found_now)
        if crops and fresh and found_now:
            t0 = time.perf_counter_ns()
            batch = crop_batch(image, found_now)
            t1 = time.perf_counter_ns()
            embeddings = backend.infer(batch).embedding if backend is not None else None
            t2 = time.perf_counter_ns()
            stage["crop_ms"].append((t1 - t0) / 1e6)
            stage["infer_ms"].append((t2 - t1) / 1e6)
        else:
            embeddings = None
        if tracker is not None:
            t0 = time.perf_counter_ns()
            tracker.update(found_now, embeddings if fresh else None, carried=not fresh)  # as the guard does
            stage["track_ms"].append((time.perf_counter_ns() - t0) / 1e6)
        boxes = [d.box for d in found_now]
        whole = [g.box for g in truth if g.visible >= 0.95]
        faces, found = faces + len(whole), found + _matches(whole, boxes, 0.5)
        false += _false_positives(boxes, [g.box for g in truth])
    row = Row(detector.name, f"{width}x{height}", mode, times, faces, found, false, detections / max(searched, 1))
    return row, {k: (sum(v) / frames) for k, v in stage.items()}


def detect_settings(config: Config, name: str, **updates):
    """The detect section detector `name` is measured with: the config's own for the configured
    detector, the defaults for the others (a score threshold set for YuNet is not BlazeFace's,
    and YuNet's file given to BlazeFace would fail its sha256 check: `detect.model` is the
    configured detector's only); `updates` over either."""
    if name == config.detect.detector:
        return config.detect.model_copy(update=updates)
    return DetectConfig(detector=name).model_copy(update=updates)


def _dlib(detector_name: str, config) -> dict:
    """Recall and false positives on dlib's annotated photos at the detector's settings here
    (`detect_settings`) and each photo's own width."""
    try:
        folder = shared_data.locate(DLIB_FACES, "dlib photos")
    except InputError as err:
        return {"error": str(err)}
    faces = found = false = 0
    for xml in ("testing.xml", "training.xml"):
        try:
            images = ET.parse(folder / xml).getroot().iter("image")
        except (OSError, ET.ParseError) as err:
            return {"error": f"dlib annotations {str(folder / xml)!r} cannot be read ({err})"}
        for image_node in images:
            path = folder / image_node.get("file", "")
            image = read_image(path)
            if image is None:
                return {"error": f"dlib photo {path} cannot be read"}
            truth = [Box(*(float(b.get(k, "nan")) for k in ("left", "top", "width", "height"))) for b in image_node.iter("box")]
            width = image.shape[1] * (2 if detector_name == "haar" else 1)  # Haar: its README reference, x2
            overrides = {"detect_width": width}
            if detector_name == "haar":
                overrides["min_face_px"] = 12
            detector = create_detector(detect_settings(config, detector_name, **overrides), quiet=True)
            boxes = [d.box for d in detector.detect(image)]
            tp = _matches(truth, boxes, 0.3)
            faces, found, false = faces + len(truth), found + tp, false + len(boxes) - tp
    if not faces:
        return {"error": f"dlib annotations in {str(folder)!r} mark no face"}
    return {"faces": faces, "found": found, "recall": round(found / faces, 4), "false_positives": false}


def run_detector_benchmark(config: Config, names: list[str], out: Path, frames: int = FRAMES) -> int:
    """Measure `names` (see the module docstring), rewriting the outputs in `out` after each row;
    Ctrl-C, SIGTERM or SIGHUP stops it with what was measured written and printed, exit 130. The
    configured guard's detector, backend and model are checked first (the frame budget comes last)."""
    check_inference(config)
    prepare_out(out)
    load_start = load_average()
    rows: list[Row] = []
    dlib: dict[str, dict] = {}
    unavailable: dict[str, str] = {}
    budget: dict | None = None
    cpu = cpu_model()
    warned = False  # about outputs that cannot be written: once

    def write(plots: bool = False) -> dict:
        """The outputs as they stand (the budget None until it is measured), the plots only when
        asked (at the end: matplotlib takes a while); returns the result."""
        nonlocal warned
        result = {
            "schema": 1,
            "complete": budget is not None,
            "machine": {"cpu": cpu, "load_average": {"start": load_start, "end": load_average()}},
            "settings": {"frames": frames, "scene": "synthetic, seed 0, 10 fps", "sizes": [f"{w}x{h}" for w, h in SIZES],
                         "modes": list(MODES), "detect_width": "the frame's width"},
            "rows": [r.summary() for r in rows],
            "dlib": dlib,
            "unavailable": unavailable,
            "budget": budget,
        }
        try:
            atomic_write(out / "detectors.json", (json.dumps(result, indent=2) + "\n").encode())
            text = io.StringIO()
            writer = csv.DictWriter(text, fieldnames=CSV_FIELDS)
            writer.writeheader()
            for r in rows:
                writer.writerow(r.summary())
            atomic_write(out / "detectors.csv", text.getvalue().encode())
            if plots and rows:
                _plots(rows, out, cpu)
        except OSError as err:  # a full disk: the run goes on, and its table is printed at the end
            if not warned:
                print(f"tracker: warning: cannot write the detector results in {out} ({err.strerror or err})",
                      file=sys.stderr)
            warned = True
        return result

    steps = [(n, s, m) for n in names for s in SIZES for m in MODES]
    try:
        with stop_as_ctrl_c():
            for i, (name, (width, height), mode) in enumerate(steps, 1):
                if name in unavailable:
                    continue
                try:
                    detector = create_detector(detect_settings(config, name, detect_width=width), quiet=True)
                except (ModelError, BackendUnavailable) as err:
                    unavailable[name] = str(err)
                    print(f"benchmark: {name}: not available: {err}", file=sys.stderr)
                    continue
                print(f"benchmark [{i}/{len(steps)}] {name} {width}x{height} {mode} ...", file=sys.stderr, flush=True)
                row, _ = _run_scene(detector, width, height, mode, frames)
                rows.append(row)
                write()
                if name not in dlib:
                    dlib[name] = _dlib(name, config)
                    write()
            budget = _frame_budget(config, frames)
    except KeyboardInterrupt:
        if not rows:  # an earlier run's files in `out` stay as they are
            print(f"benchmark: stopped before any detector was measured; nothing written (the files in {out}, if "
                  "any, are an earlier run's)", file=sys.stderr)
            return 130
        print("benchmark: interrupted; what was measured is kept", file=sys.stderr)
    result = write(plots=True)
    print(detector_table(result))
    return 0 if budget is not None else 130


def _frame_budget(config: Config, frames: int) -> dict:
    """The configured guard's frame: detection (+ motion gate) + crops + CNN + tracker, in ms, on
    the scene at the camera's size (scaled down to the scene's largest if it is larger: "frame")."""
    from tracker.backends import create_backend, run_options
    from tracker.backends.mirror import embedder
    from tracker.identity import chosen_embedding
    from tracker.sources.synthetic import fitting_size
    from tracker.tracking import Tracker

    cfg = config
    width, height = fitting_size(cfg.source.width, cfg.source.height)  # a camera larger than the scene: its aspect
    detector = create_detector(cfg.detect, quiet=True)
    model = cfg.model.spec()
    backend = create_backend(cfg.backend.name, model, precision=cfg.backend.precision, threads=cfg.backend.threads,
                             **run_options(cfg.backend.name, cfg.resolved_state_dir()))
    try:
        backend = embedder(backend, chosen_embedding(cfg))  # the guard's embedding: one or two passes per face
        mode = "regions" if cfg.detect.regions else "whole"
        row, stages = _run_scene(detector, width, height, mode, frames, crops=True,
                                 backend=backend, tracker=Tracker.from_config(cfg.tracking))
    finally:
        backend.close()
    detect_ms = float(np.mean(row.times_ms))
    total = detect_ms + stages["crop_ms"] + stages["infer_ms"] + stages["track_ms"]
    return {"detector": resolve_detector(cfg.detect), "detect_width": cfg.detect.detect_width, "mode": mode,
            "frame": f"{width}x{height}", "backend": cfg.backend.name,
            "mean_faces_per_searched_frame": round(row.mean_faces, 2), "detect_ms": round(detect_ms, 3),
            "crop_ms": round(stages["crop_ms"], 3), "infer_ms": round(stages["infer_ms"], 3),
            "track_ms": round(stages["track_ms"], 3), "total_ms": round(total, 3),
            "fps": round(1000.0 / total, 1) if total > 0 else None,
            "recall": round(row.found / max(row.faces, 1), 4)}


def detector_table(result: dict) -> str:
    lines = [f"detectors on the synthetic scene ({result['settings']['frames']} frames), {result['machine']['cpu']}, "
             f"load average {result['machine']['load_average']['start']}",
             f"{'detector':10s} {'size':8s} {'mode':8s} {'mean ms':>8s} {'p50':>7s} {'p95':>7s} {'recall':>7s} {'FP':>4s}"]
    for r in result["rows"]:
        lines.append(f"{r['detector']:10s} {r['size']:8s} {r['mode']:8s} {r['mean_ms']:8.2f} {r['p50_ms']:7.2f} "
                     f"{r['p95_ms']:7.2f} {r['recall']:7.3f} {r['false_positives']:4d}")
    for name, d in result["dlib"].items():
        if "error" in d:
            lines.append(f"dlib photos, {name}: {d['error']}")
        else:
            lines.append(f"dlib photos, {name}: {d['found']}/{d['faces']} faces, {d['false_positives']} false positives")
    for name, why in result["unavailable"].items():
        lines.append(f"{name}: not available: {why}")
    b = result["budget"]
    if b is None:
        lines.append("frame budget: not measured (the run was interrupted)")
        return "\n".join(lines)
    lines.append(f"frame budget ({b['detector']} at {b['detect_width']} px, {b['mode']}, {b['frame']} frames, backend "
                 f"{b['backend']} at {b['mean_faces_per_searched_frame']} faces per searched frame): detect+motion "
                 f"{b['detect_ms']:.2f} + crops {b['crop_ms']:.2f} + CNN {b['infer_ms']:.2f} + tracker "
                 f"{b['track_ms']:.2f} = {b['total_ms']:.2f} ms per frame = {b['fps']} fps; recall {b['recall']:.3f}")
    return "\n".join(lines)


def _plots(rows: list[Row], out: Path, cpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter

    labels = [f"{r.detector}\n{r.size}\n{r.mode}" for r in rows]
    means = [float(np.mean(r.times_ms)) for r in rows]
    p95 = [float(np.percentile(r.times_ms, 95)) for r in rows]
    for scale in ("linear", "log"):
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 5), dpi=100)
        try:
            x = np.arange(len(rows))
            ax.bar(x - 0.2, means, 0.4, label="mean")
            ax.bar(x + 0.2, p95, 0.4, label="p95")
            ax.set_xticks(x, labels, fontsize="small")
            ax.set_yscale(scale)
            if scale == "log":  # plain numbers (2, 5, 10, 20), not 2x10^0
                ax.yaxis.set_major_formatter(LogFormatter())
                ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
            ax.set_ylabel("ms per frame" + (", log scale" if scale == "log" else ""))
            ax.set_title(f"Face detection per frame, synthetic scene, {cpu}")
            ax.grid(True, axis="y", which="both", alpha=0.3)
            ax.legend()
            fig.tight_layout()
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png")
        finally:
            plt.close(fig)
        atomic_write(out / f"detectors_ms_{scale}.png", buffer.getvalue())


__all__ = ["detect_settings", "parse_detector_names", "run_detector_benchmark", "detector_table"]
