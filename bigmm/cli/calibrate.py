"""``bigmm calibrate``: measure the figures a job's plan is made from, keep them, print them."""

from __future__ import annotations

import time

from ..precision import PRECISIONS
from ..units import format_seconds
from ._common import ok_json

#: Rows and columns of the small operands a calibration plans for: what the plan times
#: depends on the budgets, threads, kernel and dtype, not on the operands' size.
_SIDE = 256


def add_parser(sub, common, backends, dtypes) -> None:
    """The ``calibrate`` command's parser, under ``sub``."""
    c = sub.add_parser(
        "calibrate", parents=[common], help="measure this machine for the planner and keep it",
        description="Time this machine as a job's plan does (the gemm of the kernel and "
                    "dtype, the copies to and from the GPU, the host's copies, the issuing "
                    "thread's costs), keep the figures for later jobs on this boot of the "
                    "machine (a week at most; BIGMM_CALIBRATION=off keeps none), and print "
                    "them. Later jobs of the same kernel, dtype and budgets plan without "
                    "timing anything.")
    c.add_argument("--dtype", nargs="+", default=["float32"], choices=dtypes,
                   help="operand dtypes to time (default: float32)")
    c.add_argument("--backend", default="auto", choices=backends,
                   help="auto: cupy where a GPU is usable, else numpy (default: %(default)s)")
    c.add_argument("--kernel", default=None, choices=("bigmm", "cublas", "cublas-tf32"),
                   help="GPU tile products the jobs will use (as for multiply)")
    c.add_argument("--precision", default=None, type=str.lower, choices=PRECISIONS,
                   help="arithmetic of float32 products the jobs will use (as for multiply)")
    c.add_argument("--memory", default=None,
                   help="device budget the jobs will give (default: as multiply's)")
    c.add_argument("--host-memory", default=None,
                   help="host staging budget the jobs will give (default: as multiply's)")
    c.add_argument("--io-threads", type=int, default=None,
                   help="I/O threads the jobs will use (default: as multiply's)")
    what = c.add_mutually_exclusive_group()
    what.add_argument("--show", action="store_true",
                      help="print the figures kept for this machine; measure nothing")
    what.add_argument("--forget", action="store_true",
                      help="drop the figures kept for this machine")
    c.add_argument("--json", action="store_true", help="print JSON on stdout")
    c.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    from .. import calibration

    path = calibration.store_path()
    if args.forget:
        had = calibration.forget()
        _print(args, {"store": path, "forgotten": had},
               f"forgot the figures kept in {path}" if had else
               f"no figures kept for this machine ({path})")
        return 0
    if args.show:
        return _show(args, calibration, path)
    from .run import backend_info

    t0 = time.perf_counter()
    with calibration.measuring() as use:
        figures = {dtype: measure(args, dtype) for dtype in args.dtype}
    seconds = time.perf_counter() - t0
    name, where = backend_info(args.backend, kernel=args.kernel, precision=args.precision)
    stored = sum(f.stored for f in use)
    from ..io import hostcopy

    copies = hostcopy.kind()
    summary = {"backend": name, "device": where, "store": path, "kept": stored,
               "seconds": seconds, "figures": figures, "host_copies": copies}
    lines = [f"calibrated {name} on {where} in {format_seconds(seconds)}",
             "host copies: " + ("non-temporal stores" if copies == "stream" else
                                f"NumPy's ({hostcopy.why_numpy()})")]
    for dtype, rows in figures.items():
        lines.append(f"{dtype}:")
        lines += [f"  {label:<34} {text}" for label, text in _rows(rows)]
    if stored:
        lines.append(f"kept {stored} of {len(use)} figures in {path} for later jobs on this "
                     f"boot (a week at most; bigmm calibrate --forget drops them)")
    if stored < len(use):
        lines.append(calibration.describe_use(use))
    _print(args, summary, "\n".join(lines))
    return 0


def measure(args, dtype: str) -> dict:
    """The rates a job of ``dtype`` NumPy operands plans with under ``args``' options, by
    field (within :func:`bigmm.calibration.measuring`: measured afresh and kept)."""
    import numpy as np

    from .. import api
    from ..units import numpy_dtype

    # every other column of a wider array: rows not contiguous, so that the plan stages the
    # operands (the figures of the host's copies, not those of copies in place)
    a, b = (np.ones((_SIDE, 2 * _SIDE), numpy_dtype(dtype))[:, ::2] for _ in range(2))
    p = api.plan(a, b, memory=args.memory, host_memory=args.host_memory,
                 backend=args.backend, kernel=args.kernel, precision=args.precision,
                 io_threads=args.io_threads)
    if p.rates is None:
        return {}
    copies = p.rates.h2d_bytes is not None  # no copies: nothing runs both ways
    return {k: v for k, v in vars(p.rates).items()
            if v is not None and (copies or k != "duplex")}


#: The figures printed: field, label, scale and unit (seconds are formatted).
_FIELDS = (("flops", "gemm", 1e12, "TFLOP/s"),
           ("unsplit_flops", "gemm, panels not split ahead", 1e12, "TFLOP/s"),
           ("h2d_bytes", "copies to the GPU", 1e9, "GB/s"),
           ("duplex", "copies both ways at once, each", 1e-2, "% of one way"),
           ("memory_bytes", "device memory", 1e9, "GB/s"),
           ("read_bytes", "host copies out of arrays", 1e9, "GB/s"),
           ("write_bytes", "host copies into arrays", 1e9, "GB/s"),
           ("thread_bytes", "one reader thread among all", 1e9, "GB/s"),
           ("register_bytes", "page-locking arrays in place", 1e9, "GB/s"),
           ("pin_bytes", "allocating pinned staging", 1e9, "GB/s"),
           ("per_step", "a gemm step", None, ""),
           ("per_issue", "issuing a step", None, ""),
           ("per_handoff", "taking over a staged load", None, ""),
           ("per_run", "a run's start and end", None, ""),
           ("per_host_row", "a row of a host copy", None, ""),
           ("per_row", "a row of a pitched copy", None, ""))


def _rows(figures: dict) -> list[tuple[str, str]]:
    rows = []
    for field, label, scale, unit in _FIELDS:
        value = figures.get(field)
        if not value or value == float("inf"):
            continue
        rows.append((label, f"{value / scale:.1f} {unit}" if scale else
                     f"{value * 1e9:.0f} ns" if value < 1e-6 else format_seconds(value)))
    return rows


#: What each kind of kept figure is, for --show (its key follows it).
_KINDS = {"cupy-rates": "the GPU's gemm and copies (device, kernel, precision, dtype, bytes)",
          "copy-rate": "host copies (threads, bytes, piece, how)",
          "copy-row-seconds": "host copies' cost per row (threads, bytes, how)",
          "issue-seconds": "the issuing thread's costs (backend, threads)",
          "disk-read": "file reads a run showed (disk, or the page cache)",
          "disk-write": "file writes a run showed (disk)",
          "load-seconds": "one read of an input (its name, layout, chunks and shapes)",
          "decode-rate": "a reader decoding an input's chunks (the input, readers)",
          "plan": "a GPU job's schedule (a digest of the planner's arguments)"}


def _show(args, calibration, path: str) -> int:
    now = time.time()
    kept = calibration.kept()
    entries = [{"figure": name, "age_seconds": now - at, "value": value}
               for name, (at, value) in sorted(kept.items(), key=lambda kv: kv[1][0])]
    lines = [f"{len(entries)} figures kept for this machine in {path}"]
    for e in entries:
        kind, _, key = e["figure"].partition(":")
        lines.append(f"  {_KINDS.get(kind, kind)} {key}: measured "
                     f"{format_seconds(e['age_seconds'])} ago")
    if not entries:
        lines = [f"no figures kept for this machine ({path})"]
    _print(args, {"store": path, "figures": entries}, "\n".join(lines))
    return 0


def _print(args, summary: dict, text: str) -> None:
    if args.json:
        ok_json(summary)
    else:
        print(text)
