"""The web page's "Speed" tab: the last `tracker --benchmark` run on this device, and `auto`'s picks.

The benchmark records where it wrote its results (`tracker.bench.profile.record_last_run`); this
reads that run's results.json (at most MAX_RESULTS_BYTES) into the two tables the terminal shows,
mean and median ms per image by batch size and backend, and serves its two plots as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

from tracker.backends.auto import describe_picks
from tracker.bench.profile import last_run_path
from tracker.bench.report import PLOT_FILES as PLOTS
from tracker.errors import TrackerError

MAX_RESULTS_BYTES = 8 << 20
NO_RUN = "no benchmark has run on this device yet: run tracker --benchmark --backend all"


def _out_dir(state_dir: Path) -> Path | None:
    try:
        return Path(json.loads(last_run_path(state_dir).read_text(encoding="utf-8"))["out"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def speed_summary(state_dir: Path) -> dict:
    """{"benchmark": {out, complete, machine, batches, columns, mean, median} or None, "why": None or
    why not, "auto": {"picks": [{batch, backend, precision}], "why": None or why none}}; mean and
    median: {column label: {batch (str): ms per image}} for the cells that ran."""
    auto: dict = {"picks": [], "why": None}
    try:
        auto["picks"] = [{"batch": b, "backend": name, "precision": p} for b, name, p in describe_picks(state_dir)]
    except TrackerError as err:
        auto["why"] = str(err)
    out = _out_dir(state_dir)
    results = None if out is None else out / "results.json"
    try:
        if results is None or results.stat().st_size > MAX_RESULTS_BYTES:
            raise ValueError
        doc = json.loads(results.read_text(encoding="utf-8"))
        rows = [r for r in doc["rows"] if r.get("status") == "ok"]
        summary = {
            "out": str(out), "complete": bool(doc.get("complete")),
            "machine": {k: doc["machine"].get(k) for k in ("cpu", "cores", "arch", "load_average")},
            "batches": doc["settings"]["batches"],
            "columns": [c["label"] for c in doc["settings"]["columns"]],
            "mean": _table(rows, "ms_per_image"),
            "median": _table(rows, "median_ms_per_image"),
            "plots": {scale: f"/speed/{scale}.png" for scale in PLOTS},
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        why = NO_RUN if results is None else f"the last benchmark's results ({results}) cannot be read; run it again"
        return {"benchmark": None, "why": why, "auto": auto}
    return {"benchmark": summary, "why": None, "auto": auto}


def _table(rows: list[dict], key: str) -> dict:
    table: dict = {}
    for row in rows:
        if row.get(key) is not None:
            table.setdefault(row["label"], {})[str(row["batch"])] = round(float(row[key]), 4)
    return table


def speed_plot(state_dir: Path, scale: str) -> bytes | None:
    """The last run's plot of `scale` ("linear" or "log") as PNG bytes, or None."""
    out = _out_dir(state_dir)
    if scale not in PLOTS or out is None:
        return None
    try:
        return (out / PLOTS[scale]).read_bytes()
    except OSError:
        return None
