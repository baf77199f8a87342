"""The benchmark's results: one row per cell, the terminal table, results.json/.csv and the plots.

Every file is written atomically (a temporary file in the same directory, then a rename), so an
interrupted run leaves either the previous or the new complete file, never half of one. The output
folder is made and probed first (`prepare_out`, for the detector benchmark too).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracker.bench.runner import CellOutcome
from tracker.errors import InputError
from tracker.files import atomic_write, make_writable_folder

CSV_FIELDS = (
    "backend", "precision", "batch", "status", "ms_per_image", "median_ms_per_image", "p50_ms", "p95_ms", "images_per_s",
    "gflops", "peak_fraction", "peak_rss_mb", "passes", "load_s", "reason", "error",
)  # fmt: skip
PLOT_FILES = {"linear": "per_image_ms_linear.png", "log": "per_image_ms_log.png"}
_MARKERS = "os^Dv<>PXh*p"


def prepare_out(out: Path) -> Path:
    """Make the output folder `out` (with its parents) and probe that a file can be written in it;
    InputError (exit 2) before anything is measured otherwise."""
    try:
        make_writable_folder(out)
    except OSError as err:
        raise InputError(f"--out: cannot use {str(out)!r} as the output directory ({err.strerror or err}); expected a writable directory") from None
    return out


@dataclass(frozen=True)
class Column:
    """One backend at one precision: a column of the table, a line of the plots."""

    backend: str
    precision: str

    @property
    def label(self) -> str:
        return self.backend if self.precision == "fp32" else f"{self.backend} {self.precision}"


def make_row(column: Column, batch: int, passes: int, outcome: CellOutcome, macs_per_image: int, peak_gflops: float) -> dict:
    """The results.json row of one cell (see the schema in tracker.bench)."""
    row = {
        "backend": column.backend,
        "precision": column.precision,
        "label": column.label,
        "batch": batch,
        "status": outcome.status,
        "passes": passes,
        "warmup_passes": outcome.warmup_passes,
        "pass_ms": [round(ns / 1e6, 6) for ns in outcome.pass_ns],
        "ms_per_image": None,
        "median_ms_per_image": None,
        "p50_ms": None,
        "p95_ms": None,
        "images_per_s": None,
        "gflops": None,
        "peak_fraction": None,
        "peak_rss_mb": None if outcome.peak_rss_kb is None else round(outcome.peak_rss_kb / 1024, 1),
        "rss_method": outcome.rss_method,
        "rss_processes": outcome.rss_processes,
        "load_s": None if outcome.load_s is None else round(outcome.load_s, 3),
        "reason": outcome.reason,
        "error": outcome.error,
        "error_detail": outcome.error_detail,
    }
    if outcome.status == "ok":
        ms = np.array(outcome.pass_ns, dtype=np.float64) / 1e6
        mean_ms = float(ms.mean())
        gflops = 2.0 * macs_per_image * batch / (mean_ms / 1e3) / 1e9
        p50_ms = float(np.percentile(ms, 50))
        row.update(
            ms_per_image=mean_ms / batch,
            median_ms_per_image=p50_ms / batch,
            p50_ms=p50_ms,
            p95_ms=float(np.percentile(ms, 95)),
            images_per_s=batch * 1e3 / mean_ms,
            gflops=gflops,
            peak_fraction=gflops / peak_gflops,
        )
    return row


class Results:
    """Everything measured so far, and its renderings. Rows are kept in run order."""

    def __init__(self, machine: dict, versions: dict, settings: dict, columns: list[Column], unavailable: dict[str, str]):
        self.machine = machine
        self.versions = {**versions, "runtimes": {}}
        self.settings = settings
        self.columns = columns
        self.unavailable = unavailable
        self.rows: list[dict] = []
        self.quality: list[dict] = []
        self.runoffs: list[dict] = []
        self.complete = False

    def add(self, row: dict, runtime_versions: dict) -> None:
        self.rows.append(row)
        if runtime_versions:
            self.versions["runtimes"].setdefault(row["label"], {}).update(runtime_versions)

    def update_peak(self, peak: dict) -> None:
        """Take a new sgemm measurement (machine_info's "sgemm" form) if it beats the current
        peak, and restate every cell's peak_fraction against it."""
        if peak["gflops"] <= self.machine["sgemm_peak_gflops"]:
            return
        self.machine["sgemm_peak_gflops"] = peak["gflops"]
        self.machine["sgemm"] = {k: peak[k] for k in ("n", "repeats", "best_s")}
        for row in self.rows:
            if row["gflops"] is not None:
                row["peak_fraction"] = row["gflops"] / peak["gflops"]

    def add_quality(self, entry: dict) -> None:
        self.quality.append(entry)

    def add_runoff(self, entry: dict) -> None:
        self.runoffs.append(entry)

    def cell(self, column: Column, batch: int) -> dict | None:
        for row in self.rows:
            if row["label"] == column.label and row["batch"] == batch:
                return row
        return None

    # ---- files ---------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "schema": 1,
            "complete": self.complete,
            "machine": self.machine,
            "versions": self.versions,
            "settings": self.settings,
            "unavailable": self.unavailable,
            "rows": self.rows,
            "quality": self.quality,
            "runoffs": self.runoffs,
        }

    def write_data(self, out: Path) -> None:
        """results.json and results.csv in `out`."""
        atomic_write(out / "results.json", (json.dumps(self.to_json(), indent=1) + "\n").encode())
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            writer.writerow(row)
        for name, reason in self.unavailable.items():
            writer.writerow({"backend": name, "status": "unavailable", "reason": "unavailable", "error": reason})
        atomic_write(out / "results.csv", text.getvalue().encode())

    def write_plots(self, out: Path) -> list[Path]:
        """Per-image time against batch size, one line per column, linear and log time axis."""
        import matplotlib

        matplotlib.use("Agg")  # files only; never a display
        import matplotlib.pyplot as plt
        from matplotlib.ticker import LogFormatter

        batches = self.settings["batches"]
        written = []
        for scale, name in PLOT_FILES.items():
            fig, ax = plt.subplots(figsize=(10, 5.5), dpi=100)
            fig.subplots_adjust(left=0.08, right=0.75)  # the legend goes right of the axes
            # one colour and marker per backend (tab20: up to 20 distinguishable), dashed for int8
            backend_names = list(dict.fromkeys(c.backend for c in self.columns))
            palette = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]  # tab20 is a ListedColormap
            palette = palette[0::2] + palette[1::2]
            try:
                for column in self.columns:
                    points = [(r["batch"], r["ms_per_image"]) for r in self.rows if r["label"] == column.label and r["status"] == "ok"]
                    if points:
                        xs, ys = zip(*sorted(points))
                        i = backend_names.index(column.backend)
                        ax.plot(
                            xs, ys, label=column.label, color=palette[i % len(palette)], marker=_MARKERS[i % len(_MARKERS)],
                            linestyle="-" if column.precision == "fp32" else "--",
                        )  # fmt: skip
                ax.set_xscale("log", base=2)
                ax.set_xticks(batches, [str(b) for b in batches])
                ax.set_yscale(scale)
                if scale == "linear":
                    ax.set_ylim(bottom=0)
                else:  # plain numbers (20, 50, 100), not 2x10^1
                    ax.yaxis.set_major_formatter(LogFormatter())
                    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
                ax.set_xlabel("batch size (images per forward pass)")
                ax.set_ylabel("time per image (ms)" + (", log scale" if scale == "log" else ""))
                ax.set_title(f"Per-image forward time, {self.machine['cpu']}, {self.machine['cores']} cores")
                ax.grid(True, which="both", alpha=0.3)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, fontsize="small")
                buffer = io.BytesIO()
                fig.savefig(buffer, format="png")
            finally:
                plt.close(fig)
            atomic_write(out / name, buffer.getvalue())
            written.append(out / name)
        return written

    # ---- terminal ------------------------------------------------------------------------

    def _grid(self, key: str) -> tuple[list[str], list[str]]:
        """The lines of one table of `key` (batch sizes as rows, columns as columns), and the
        notes on its failed cells."""
        headers = ["batch"] + [c.label for c in self.columns] + list(self.unavailable)
        lines_cells = []
        notes = []
        for batch in self.settings["batches"]:
            cells = [str(batch)]
            for column in self.columns:
                row = self.cell(column, batch)
                if row is None:
                    cells.append("-")
                elif row["status"] == "ok":
                    cells.append(f"{row[key]:.3f}")
                else:
                    cells.append(f"failed: {row['reason']}")
                    notes.append(f"  {column.label} at batch {batch}: {row['error_detail']}")
            cells += ["n/a"] * len(self.unavailable)
            lines_cells.append(cells)
        widths = [max(len(h), *(len(r[i]) for r in lines_cells)) for i, h in enumerate(headers)]
        lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths))]
        return lines + ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in lines_cells], notes

    def table(self) -> str:
        """Per-image ms, batch sizes as rows and columns as columns: the mean of the passes (the
        study's Table 1), then the median (what a stall on a busy machine does not move, and what
        `auto`'s profile keeps), then notes."""
        passes = self.settings["passes"]
        m = self.machine
        means, notes = self._grid("ms_per_image")
        medians, _ = self._grid("median_ms_per_image")
        out = [
            f"Per-image forward time (ms), mean of {passes} passes after the warm-up (one pass, then {self.settings['warmup_s']:g} s "
            f"more), on {m['cpu']} ({m['cores']} cores, {m['arch']}; sgemm peak {m['sgemm_peak_gflops']:.1f} GFLOP/s)",
            *means,
            "Per-image forward time (ms), median of the same passes",
            *medians,
        ]
        load = (m.get("load_average") or {}).get("start")
        if load is not None:
            end = (m.get("load_average") or {}).get("end")
            out.append(f"load average (1, 5, 15 min) at the start {load}" + (f", at the end {end}" if end else "")
                       + f"; {m['cores']} cores")
        if load and load[0] > m["cores"]:  # as tracker.bench.command._busy: more runnable threads than cores
            out.append(
                f"warning: the machine was busy when the run started (1-minute load average {load[0]:g} on "
                f"{m['cores']} cores): these times include waiting for the CPU"
            )
        if notes:
            out += ["failed cells:"] + notes
        if self.quality:
            out += ["quality against the same backend in fp32, on a fixed set of face crops:"]
            out += ["  " + quality_line(q) for q in self.quality]
        if self.runoffs:
            out += ["runoffs: the fastest cells' backends timed again, interleaved in one process, for auto's profile:"]
            out += ["  " + runoff_line(r) for r in self.runoffs]
        if self.unavailable:
            out += ["not available here:"] + [f"  {name}: {reason}" for name, reason in self.unavailable.items()]
        if not self.complete:
            out.append("interrupted: the table shows the cells measured so far ('-' = not measured)")
        return "\n".join(out)

    def details(self) -> str:
        """Every metric of every cell, one block per column."""
        out = []
        head = ("batch", "ms/image", "median/im", "p50 ms", "p95 ms", "images/s", "GFLOP/s", "% peak", "RSS MB", "load s")
        for column in self.columns:
            rows = [r for r in self.rows if r["label"] == column.label]
            if not rows:
                continue
            out.append(f"{column.label}:")
            out.append("  " + " ".join(f"{h:>9}" for h in head))
            for r in rows:
                rss = "" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}"
                load = "" if r["load_s"] is None else f"{r['load_s']:.2f}"
                if r["status"] == "ok":
                    values = (
                        f"{r['ms_per_image']:.3f}", f"{r['median_ms_per_image']:.3f}", f"{r['p50_ms']:.2f}",
                        f"{r['p95_ms']:.2f}", f"{r['images_per_s']:.1f}", f"{r['gflops']:.2f}", f"{100 * r['peak_fraction']:.1f}", rss, load,
                    )  # fmt: skip
                    out.append("  " + " ".join(f"{v:>9}" for v in (str(r["batch"]), *values)))
                else:
                    out.append(f"  {r['batch']:>9} failed: {r['error']}" + (f" (peak RSS {rss} MB)" if rss else ""))
        return "\n".join(out)


def summary_line(row: dict) -> str:
    """One progress line per finished cell."""
    if row["status"] == "ok":
        return (
            f"{row['label']} batch {row['batch']}: {row['ms_per_image']:.3f} ms/image "
            f"(median {row['median_ms_per_image']:.3f}), "
            f"p95 pass {row['p95_ms']:.2f} ms, peak RSS {row['peak_rss_mb']:.0f} MB"
        )
    return f"{row['label']} batch {row['batch']}: {row['status']}: {row['error']}"


def quality_line(entry: dict) -> str:
    """One line on what a reduced precision costs against fp32."""
    label = f"{entry['backend']} {entry['precision']}"
    if "error" in entry:
        return f"{label}: quality check failed: {entry['error']}"
    decided = ""
    if entry.get("top1_agreement_decided") is not None:  # tracker.bench.quality: fp32's clear decisions
        decided = f" ({100 * entry['top1_agreement_decided']:.1f}% on the {entry['decided_crops']} fp32 decides by >= {entry['decided_gap']} nats)"
    return (
        f"{label}: top-1 agreement {100 * entry['top1_agreement']:.1f}% on {entry['crops']} crops{decided}, "
        f"embedding cosine mean {entry['embedding_cosine_mean']:.4f} (min {entry['embedding_cosine_min']:.4f})"
    )


def runoff_line(entry: dict) -> str:
    """One line on a runoff (tracker.bench.runoff): each candidate's interleaved median beside its
    cell's, fastest first."""
    head = f"{entry['precision']} batch {entry['batch']}"
    if "error" in entry:
        return f"{head}: runoff of {', '.join(entry['backends'])} failed: {entry['error']}; the profile keeps their cells' medians"
    ms = entry["ms_per_image"]
    times = ", ".join(f"{name} {ms[name]:.3f} (cell {entry['cell_median_ms_per_image'][name]:.3f})"
                      for name in sorted(ms, key=ms.get))
    return f"{head}: {times} ms per image, {entry['rounds']} interleaved rounds"


__all__ = ["Column", "Results", "make_row", "quality_line", "runoff_line", "summary_line"]
