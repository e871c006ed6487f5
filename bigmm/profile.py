"""Stage timelines of a run: busy intervals per pipeline stage -> utilisation, trace, picture.

A :class:`Profile` collects :class:`Interval` records in host ``time.perf_counter()`` seconds:

* host threads (readers, the writer, and every stage of a backend without staging) through the
  stage clocks the executor wraps with :meth:`Profile.clock`: one wall interval per call;
* a GPU backend adds the device's own intervals for the stages it names in ``device_stages``
  (copies and kernels bracketed by CUDA events, converted to host time after the run); the
  executor's host-side intervals for those stages (the time spent *issuing* asynchronous work)
  are then left out.

From them: :meth:`busy` (the union of a stage's intervals), :meth:`utilisation` (busy over the
run's span), :meth:`table` (the summary printed with ``--profile``), :meth:`chrome_trace`
(JSON for Perfetto or chrome://tracing, one track per thread or stream) and :meth:`plot` (a PNG
timeline, when matplotlib is installed). Pure Python; no GPU code here.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

from .runstats import STAGES

_COLOURS = {"read": "#4c72b0", "copy_in": "#55a868", "compute": "#c44e52",
            "copy_out": "#8172b2", "write": "#ccb974"}


@dataclass(frozen=True)
class Interval:
    """One busy interval of a stage, in host seconds (``time.perf_counter``)."""

    stage: str
    start: float
    end: float
    lane: str = ""  # the thread or stream that did the work
    label: str = ""
    nbytes: int = 0
    flops: int = 0


@dataclass
class Profile:
    """Busy intervals of one run (thread-safe ``add``); see the module docstring."""

    intervals: list[Interval] = field(default_factory=list)
    #: Stages whose intervals come from the device, not from host wall clocks.
    device_stages: tuple[str, ...] = ()
    #: Where the device intervals were measured ("" without a device).
    device: str = ""
    start: float | None = None
    end: float | None = None
    #: Bytes moved per stage, for stages whose intervals carry none (host reads and writes).
    moved: dict = field(default_factory=dict)
    #: Flops of the compute stage, when its intervals carry none (host wall clocks).
    compute_flops: int = 0

    def __post_init__(self):
        self._lock = threading.Lock()
        self._local = threading.local()

    # ----- recording ----------------------------------------------------------------------
    def begin(self) -> None:
        self.start = time.perf_counter()

    def finish(self) -> None:
        self.end = time.perf_counter()

    def add(self, stage: str, start: float, end: float, *, lane: str = "", label: str = "",
            nbytes: int = 0, flops: int = 0) -> None:
        iv = Interval(stage, float(start), float(max(start, end)), lane, label, int(nbytes),
                      int(flops))
        with self._lock:
            self.intervals.append(iv)

    def clock(self, stage: str, inner=None) -> "StageClock":
        """A context manager recording a wall interval of ``stage`` per use (and entering
        ``inner``, the executor's own clock, whose ``total`` it passes through)."""
        return StageClock(self, stage, inner)

    # ----- analysis -----------------------------------------------------------------------
    @property
    def span(self) -> tuple[float, float]:
        """(start, end) of the run: as recorded, else the extent of the intervals."""
        lo = self.start if self.start is not None else min(
            (i.start for i in self.intervals), default=0.0)
        hi = self.end if self.end is not None else max(
            (i.end for i in self.intervals), default=lo)
        return lo, max(lo, hi)

    @property
    def seconds(self) -> float:
        lo, hi = self.span
        return hi - lo

    def stages(self) -> list[str]:
        """The pipeline's stages, then any others recorded, in first-seen order."""
        extra = [s for s in dict.fromkeys(i.stage for i in self.intervals) if s not in STAGES]
        return list(STAGES) + extra

    def merged(self, stage: str) -> list[tuple[float, float]]:
        """The union of a stage's intervals within the span, as sorted disjoint pairs."""
        lo, hi = self.span
        pairs = sorted((max(i.start, lo), min(i.end, hi)) for i in self.intervals
                       if i.stage == stage)
        out: list[list[float]] = []
        for a, b in pairs:
            if b <= a:
                continue
            if out and a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return [(a, b) for a, b in out]

    def busy(self) -> dict[str, float]:
        """Seconds during which each stage had work in flight."""
        return {s: sum(b - a for a, b in self.merged(s)) for s in self.stages()}

    def utilisation(self) -> dict[str, float]:
        t = self.seconds
        return {s: (b / t if t > 0 else 0.0) for s, b in self.busy().items()}

    def totals(self, stage: str) -> tuple[int, int, int]:
        """(intervals, bytes, flops) recorded for a stage."""
        ivs = [i for i in self.intervals if i.stage == stage]
        nbytes = sum(i.nbytes for i in ivs) or int(self.moved.get(stage, 0))
        flops = sum(i.flops for i in ivs) or (self.compute_flops if stage == "compute" else 0)
        return len(ivs), nbytes, int(flops)

    def summary(self) -> dict:
        """Per stage: busy seconds, utilisation, interval count, bytes, flops, and the rate
        while busy (bytes/s or flop/s); JSON-ready."""
        busy, util = self.busy(), self.utilisation()
        out = {}
        for s in self.stages():
            n, nbytes, flops = self.totals(s)
            b = busy[s]
            out[s] = {"busy_seconds": b, "utilisation": util[s], "intervals": n,
                      "bytes": nbytes, "flops": flops,
                      "source": "device" if s in self.device_stages else "host",
                      "rate_while_busy": ((flops or nbytes) / b) if b > 0 else 0.0}
        return out

    def table(self) -> str:
        """The stage-utilisation table (plain text, one stage a line)."""
        rows = [("stage", "busy", "util", "n", "moved", "rate while busy", "timed on")]
        for s, d in self.summary().items():
            if s not in STAGES and d["intervals"] == 0:
                continue
            if d["flops"]:
                moved, rate = f"{d['flops']:.3g} flop", f"{d['rate_while_busy'] / 1e12:.1f} TFLOP/s"
            else:
                moved = f"{d['bytes'] / 2**30:.2f} GiB"
                rate = f"{d['rate_while_busy'] / 1e9:.1f} GB/s" if d["bytes"] else "-"
            where = (self.device or "device") if d["source"] == "device" else "host wall clock"
            rows.append((s, f"{d['busy_seconds']:.3f} s", f"{100 * d['utilisation']:.0f}%",
                         str(d["intervals"]), moved, rate, where))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) if c in (0, 6) else v.rjust(w)
                           for c, (v, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
        lines.append(f"run span {self.seconds:.3f} s")
        return "\n".join(lines)

    # ----- exports ------------------------------------------------------------------------
    def chrome_trace(self) -> dict:
        """The intervals as a Chrome trace ("X" events in microseconds; one track per lane)."""
        lo, _ = self.span
        lanes = list(dict.fromkeys(
            sorted((i.lane or i.stage for i in self.intervals),
                   key=lambda x: (not x.startswith("GPU"), x))))
        tid = {lane: n + 1 for n, lane in enumerate(lanes)}
        events: list[dict] = [{"ph": "M", "pid": 1, "name": "process_name",
                               "args": {"name": "bigmm"}}]
        for lane, t in tid.items():
            events.append({"ph": "M", "pid": 1, "tid": t, "name": "thread_name",
                           "args": {"name": lane}})
            events.append({"ph": "M", "pid": 1, "tid": t, "name": "thread_sort_index",
                           "args": {"sort_index": t}})
        for i in sorted(self.intervals, key=lambda i: i.start):
            args = {"stage": i.stage}
            if i.nbytes:
                args["bytes"] = i.nbytes
            if i.flops:
                args["flops"] = i.flops
            events.append({"ph": "X", "pid": 1, "tid": tid[i.lane or i.stage],
                           "name": i.label or i.stage, "cat": i.stage,
                           "ts": round((i.start - lo) * 1e6, 3),
                           "dur": round((i.end - i.start) * 1e6, 3), "args": args})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"utilisation": self.utilisation(), "seconds": self.seconds,
                              "device": self.device}}

    def write_trace(self, path) -> str:
        path = os.fspath(path)
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
        return path

    def plot(self, path, title: str | None = None) -> bool:
        """Write a PNG timeline (one row per stage); False when matplotlib is not installed."""
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError:
            return False
        lo, _ = self.span
        stages = [s for s in self.stages() if s in STAGES or self.totals(s)[0]]
        util = self.utilisation()
        fig, ax = plt.subplots(figsize=(11, 0.45 * len(stages) + 1.1), dpi=100)
        for row, s in enumerate(stages):
            bars = [(a - lo, b - a) for a, b in self.merged(s)]
            ax.broken_barh(bars, (row - 0.38, 0.76), facecolors=_COLOURS.get(s, "#777777"),
                           linewidth=0)
            ax.text(1.005, row, f"{100 * util[s]:.0f}%", transform=ax.get_yaxis_transform(),
                    va="center", fontsize=9)
        ax.set_yticks(range(len(stages)))
        ax.set_yticklabels(stages)
        ax.set_ylim(len(stages) - 0.5, -0.5)
        ax.set_xlim(0, max(self.seconds, 1e-9))
        ax.set_xlabel("seconds since the start of the run")
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(title or "bigmm stage timeline (busy intervals; utilisation at right)",
                     fontsize=10)
        fig.tight_layout()
        fig.savefig(os.fspath(path))
        plt.close(fig)
        return True

    def save(self, prefix) -> dict[str, str]:
        """Write ``<prefix>.trace.json`` and (with matplotlib) ``<prefix>.png``; their paths."""
        prefix = os.fspath(prefix)
        files = {"trace": self.write_trace(prefix + ".trace.json")}
        if self.plot(prefix + ".png"):
            files["png"] = prefix + ".png"
        return files


class StageClock:
    """Context manager of one stage: records a wall interval per use unless the stage is timed
    on the device; enters the executor's own clock (``inner``) too."""

    def __init__(self, profile: Profile, stage: str, inner=None):
        self.profile, self.stage, self.inner = profile, stage, inner

    @property
    def total(self) -> float:
        return self.inner.total if self.inner is not None else 0.0

    def __enter__(self):
        if self.inner is not None:
            self.inner.__enter__()
        stack = getattr(self.profile._local, "stack", None)
        if stack is None:
            stack = self.profile._local.stack = []
        stack.append(time.perf_counter())
        return self

    def __exit__(self, *exc):
        t1 = time.perf_counter()
        t0 = self.profile._local.stack.pop()
        if self.stage not in self.profile.device_stages:
            self.profile.add(self.stage, t0, t1, lane=threading.current_thread().name)
        if self.inner is not None:
            return self.inner.__exit__(*exc)
        return False
