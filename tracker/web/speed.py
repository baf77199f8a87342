"""The web page's "Speed" tab: the last `tracker --benchmark` run on this device, and `auto`'s picks.

The benchmark records where it wrote its results (`tracker.bench.profile.record_last_run`); this
reads that run's results.json (at most MAX_RESULTS_BYTES) into the two tables the terminal shows,
mean and median ms per image by batch size and backend, and serves its two plots as they are (at
most MAX_PLOT_BYTES each: the benchmark's are about 100 kB).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tracker.backends.auto import describe_picks
from tracker.bench.profile import last_run_path
from tracker.bench.report import PLOT_FILES as PLOTS
from tracker.errors import TrackerError

MAX_RESULTS_BYTES = 8 << 20
MAX_PLOT_BYTES = 8 << 20
PROFILE = "this device's calibration profile"  # as the page names it (its path is the guard's business)
NO_RUN = "no benchmark has run on this device yet: run tracker --benchmark --backend all"


def _out_dir(state_dir: Path) -> Path | None:
    """The last run's folder; None if no run is recorded; ValueError if its record is damaged."""
    try:
        text = last_run_path(state_dir).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ValueError(f"the record of the last benchmark cannot be read ({err.strerror or err})") from None
    try:
        return Path(json.loads(text)["out"])
    except (ValueError, KeyError, TypeError):
        raise ValueError("the record of the last benchmark is damaged") from None


def speed_summary(state_dir: Path) -> dict:
    """{"benchmark": {complete, machine, batches, columns, mean, median, plots} or None, "why": None
    or why not, "auto": {"picks": [{batch, backend, precision}], "why": None or why none}}; mean and
    median: {column label: {batch (str): ms per image}} for the cells that ran. Nothing in it names
    a path on the guard: the page's visitors need none."""
    auto: dict = {"picks": [], "why": None}
    try:
        auto["picks"] = [{"batch": b, "backend": name, "precision": p} for b, name, p in describe_picks(state_dir, shown=PROFILE)]
    except TrackerError as err:
        auto["why"] = str(err)
    try:
        out = _out_dir(state_dir)
    except ValueError as err:
        return {"benchmark": None, "why": f"{err}; run the benchmark again", "auto": auto}
    if out is None:
        return {"benchmark": None, "why": NO_RUN, "auto": auto}
    results = out / "results.json"
    try:
        if results.stat().st_size > MAX_RESULTS_BYTES:  # every pass's time: --passes 10000 over many cells
            why = (f"the last benchmark's results are over {MAX_RESULTS_BYTES >> 20} MB, more than this page reads "
                   "(each pass's time is kept: run it with fewer --passes); its tables are in its results.csv")
            return {"benchmark": None, "why": why, "auto": auto}
        doc = json.loads(results.read_text(encoding="utf-8"))
        rows = [r for r in doc["rows"] if r.get("status") == "ok"]
        batches, columns = doc["settings"]["batches"], [c["label"] for c in doc["settings"]["columns"]]
        machine = doc["machine"]
        if not (_all(batches, int) and _all(columns, str) and _all(rows, dict) and isinstance(machine, dict)):
            raise TypeError("not a results.json of tracker --benchmark")
        summary = {
            "complete": bool(doc.get("complete")),
            "machine": {k: machine.get(k) for k in ("cpu", "cores", "arch", "load_average")},
            "batches": batches,
            "columns": columns,
            "mean": _table(rows, "ms_per_image"),
            "median": _table(rows, "median_ms_per_image"),
            "plots": {scale: f"/speed/{scale}.png" for scale, name in PLOTS.items() if (out / name).is_file()},
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):  # (nesting deeper than json reads)
        why = "the last benchmark's results cannot be read; run it again"
        return {"benchmark": None, "why": why, "auto": auto}
    return {"benchmark": summary, "why": None, "auto": auto}


def _all(items, kind: type) -> bool:
    return isinstance(items, list) and all(isinstance(item, kind) and not isinstance(item, bool) for item in items)


def _table(rows: list[dict], key: str) -> dict:
    """{label: {batch: ms}} of the rows' finite, positive `key` values (a NaN is no JSON)."""
    table: dict = {}
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            table.setdefault(str(row["label"]), {})[str(row["batch"])] = round(float(value), 4)
    return table


def speed_plot(state_dir: Path, scale: str) -> bytes | None:
    """The last run's plot of `scale` ("linear" or "log") as PNG bytes, or None (also for a file
    over MAX_PLOT_BYTES)."""
    try:
        out = _out_dir(state_dir)
    except ValueError:
        return None
    if scale not in PLOTS or out is None:
        return None
    try:
        with open(out / PLOTS[scale], "rb") as file:
            data = file.read(MAX_PLOT_BYTES + 1)
    except OSError:
        return None
    return data if len(data) <= MAX_PLOT_BYTES else None
