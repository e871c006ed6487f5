"""What a run reports: its summary (``--json`` and text) and its progress on stderr."""

from __future__ import annotations

import sys
import time

from .. import calibration
from ..runstats import STAGES
from ..units import format_bytes, format_seconds


def run_summary(plan, stats, out, a, b, backend: str | None = None) -> dict:
    """Machine-readable summary of a finished run (what ``--json`` prints, after ``ok``):
    with the plan's predicted time of the whole job in this process, and how old the figures
    it was planned with are."""
    seconds = max(float(stats.seconds), 1e-12)
    moved = stats.bytes_read + stats.bytes_written
    stages = {}
    for name in STAGES:
        busy = getattr(stats, f"{name}_busy", None)
        if busy is not None:
            stages[name] = {"busy_seconds": float(busy), "utilisation": float(busy) / seconds}
    a_shape = (plan.k, plan.m) if plan.trans_a else (plan.m, plan.k)
    b_shape = (plan.n, plan.k) if plan.trans_b else (plan.k, plan.n)
    return {
        "a": str(a), "b": str(b), "out": str(out),
        "shape_a": list(a_shape), "shape_b": list(b_shape), "shape_c": [plan.m, plan.n],
        "dtype": plan.dtype, "c_dtype": plan.written_dtype,
        "backend": getattr(stats, "backend", None) or backend,
        "seconds": float(stats.seconds), "flops": int(stats.flops),
        "tflops": stats.flops / seconds / 1e12, "gbps": moved / seconds / 1e9,
        "bytes_read": int(stats.bytes_read), "bytes_written": int(stats.bytes_written),
        "tiles_done": int(stats.tiles_done), "tiles_skipped": int(stats.tiles_skipped),
        "tiles_redone": int(getattr(stats, "tiles_redone", 0)),
        "notes": list(getattr(stats, "notes", ())),
        "tiles_total": plan.n_tiles, "tile": [plan.bm, plan.bn, plan.bk], "order": plan.order,
        "predicted_seconds": plan.predicted_seconds,
        "calibration": calibration.describe_use(calibration.used()),
        "stages": stages,
        **checksum_summary(stats),
    }


def checksum_summary(stats) -> dict:
    """{"checksum": counts and mismatches} for a run that checked its tiles, else {}."""
    checked = int(getattr(stats, "tiles_checked", 0) or 0)
    if not checked:
        return {}
    return {"checksum": {"tiles_checked": checked,
                         "mismatches": int(stats.checksum_mismatches),
                         "tiles_recomputed": int(stats.tiles_recomputed),
                         "details": [str(m) for m in getattr(stats, "mismatches", ())]}}


def print_notes(s: dict, quiet: bool) -> None:
    """The run's notes (journaled tiles computed again, an array not locked) on stderr."""
    if not quiet:
        for note in s.get("notes", ()):
            print(f"bigmm: note: {note}", file=sys.stderr)


def format_summary(s: dict) -> str:
    if s["tiles_done"] == 0 and s["tiles_skipped"] == s["tiles_total"] and not s["flops"]:
        return (f"{s['out']} is complete: an earlier run of the same job finished all "
                f"{s['tiles_total']} tiles (nothing computed)")
    lines = [
        f"wrote {s['out']}: C[{s['shape_c'][0]} x {s['shape_c'][1]}] {s['c_dtype']}"
        + (f" on {s['backend']}" if s["backend"] else ""),
        f"time {format_seconds(s['seconds'])}, {s['tflops']:.3f} TFLOP/s, {s['gbps']:.2f} GB/s "
        f"(read {format_bytes(s['bytes_read'])}, wrote {format_bytes(s['bytes_written'])})",
        f"tiles {s['tiles_done']} done, {s['tiles_skipped']} skipped of {s['tiles_total']}",
    ]
    if "checksum" in s:
        ck = s["checksum"]
        lines.append(f"checksum: {ck['tiles_checked']} tile checks, {ck['mismatches']} "
                     f"mismatches detected, {ck['tiles_recomputed']} tiles recomputed")
        lines += [f"  mismatch: {d}" for d in ck["details"]]
    if s["stages"]:
        lines.append("stages busy: " + ", ".join(
            f"{k} {format_seconds(v['busy_seconds'])} ({100 * v['utilisation']:.0f}%)"
            for k, v in s["stages"].items()))
    return "\n".join(lines)


class _progress_bar:
    """Context manager giving a progress callback: a rich bar on stderr, or a no-op."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._bar = None
        self._task = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._bar = Progress(TextColumn("multiply"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("tiles"), TimeElapsedColumn(), TextColumn("eta"),
                                 TimeRemainingColumn(), TextColumn("{task.fields[rates]}"),
                                 console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("multiply", total=None, rates="")
        return self

    def __call__(self, p) -> None:
        if self._bar is None:
            return
        t = max(float(p.elapsed), 1e-9)
        rates = (f"{p.flops_done / t / 1e12:.3f} TFLOP/s  "
                 f"{(p.bytes_read + p.bytes_written) / t / 1e9:.2f} GB/s")
        self._bar.update(self._task, completed=p.tiles_done, total=p.tiles_total, rates=rates)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __exit__(self, *exc):
        self.stop()
        return False


#: Without a terminal, a progress line at every tenth of the work, and at least this often.
LINE_SECONDS = 30.0


class _progress_lines:
    """Progress as plain lines on stderr (a batch job's log): at every 10% of the flops and
    at least every LINE_SECONDS, with tiles done, time, ETA and rates."""

    def __init__(self, total_flops: int, stream=None):
        self.total = max(int(total_flops), 1)
        self.stream = stream or sys.stderr
        self.next_tenth = 1
        self.last = time.monotonic()

    def __enter__(self):
        return self

    def __call__(self, p) -> None:
        skipped = self.total * p.tiles_skipped / max(p.tiles_total, 1)
        share = min(1.0, (skipped + p.flops_done) / self.total)
        now = time.monotonic()
        if share * 10 < self.next_tenth and now - self.last < LINE_SECONDS:
            return
        self.next_tenth = int(share * 10) + 1
        self.last = now
        t = max(float(p.elapsed), 1e-9)
        todo = self.total - skipped - p.flops_done
        eta = format_seconds(t * todo / p.flops_done) if p.flops_done else "n/a"
        skip = f", {p.tiles_skipped} skipped" if p.tiles_skipped else ""
        print(f"bigmm: {100 * share:.0f}% ({p.tiles_done} of {p.tiles_total} tiles{skip}), "
              f"{format_seconds(t)} elapsed, eta {eta}, "
              f"{p.flops_done / t / 1e12:.3f} TFLOP/s, "
              f"{(p.bytes_read + p.bytes_written) / t / 1e9:.2f} GB/s",
              file=self.stream, flush=True)

    def stop(self) -> None:
        pass

    def __exit__(self, *exc):
        return False


def progress_reporter(quiet: bool, total_flops: int = 0):
    """The progress callback of a run: a bar on a terminal, plain lines in a log (stderr not
    a terminal; with the plan's flops to count), nothing when ``quiet``."""
    if quiet or (not sys.stderr.isatty() and not total_flops):
        return _progress_bar(enabled=False)
    if sys.stderr.isatty():
        return _progress_bar(enabled=True)
    return _progress_lines(total_flops)
