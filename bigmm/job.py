"""One job resolved: operands opened and checked, budgets, rates, the plan, the output opened
for it (created, resumed or found complete), the job record. Shared by the API and dask."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import numpy as np

from . import io
from .backends import Calibrates, Checksums, HostHints, get_backend
from .backends.numpy import memory_available as host_memory_available
from .errors import DtypeError, OptionError, ResumeError, ShapeError
from .executor import RunStats, in_place
from .planner import READ_RATE, WRITE_RATE, Plan, Rates, cpu_step_bytes, make_plan
from .units import (DTYPES, HALF_DTYPES, accumulate_dtype, common_dtype, dtype_name, numpy_dtype,
                    parse_out_dtype, parse_size)

#: Without a budget, the compute side may use this share of the memory the backend reports.
DEVICE_SHARE = {False: 0.25, True: 0.85}
#: Default host staging budget, as a share of available RAM (staging backends).
HOST_SHARE = 0.25
#: Default budgets are rounded down to whole multiples of this (when at least 4 of them), so
#: that what is free moving a little between calls keeps the same plan (plans are cached).
BUDGET_GRAIN = 64 << 20
#: Nominal speeds of reading a NumPy array input (a copy into the staging buffers, bound by
#: host memory bandwidth: ~15 GB/s on the H100 host) and of writing C into a NumPy array.
ARRAY_READ_RATE, ARRAY_WRITE_RATE = 15e9, 5e9
#: Keys of the journal's job that must match for a resume.
_JOB_KEYS = ("m", "n", "k", "dtype", "trans_a", "trans_b", "reads_c")


def resolve_backend(name: str, kernel: str | None):
    """The backend, with ``kernel`` passed to it (only GPU backends take one)."""
    be = get_backend(name)
    if kernel is None:
        return be
    resolved = be.name
    be.close()
    if not be.staging:
        raise OptionError(f"Expected kernel= only with a GPU backend. Got kernel={kernel!r} "
                          f"with backend {resolved!r}.")
    return get_backend(resolved, kernel=kernel)


def open_inputs(a, b, closing: list, be=None):
    """A and B opened (added to ``closing``), read with the backend's ``reader_threads`` per
    file and its ``map_step`` (blocks of mapped copies) where it names them."""
    opts = {}
    if isinstance(be, HostHints):
        opts = {key: value for key, value in (("threads", be.reader_threads),
                                              ("map_step", be.map_step)) if value}
    A = io.open_input(a, name="A", **opts)
    closing.append(A)
    B = io.open_input(b, name="B", **opts)
    closing.append(B)
    return A, B


def plan_job(A, B, out, be, *, alpha, beta, trans_a, trans_b, memory, host_memory, resume,
              calibrate: bool, verify: str | None = None,
              out_dtype=None) -> tuple[Plan, dict]:
    """The Plan and journal job for these operands. With ``calibrate`` the backend's rates
    (and the operands' read and write speeds, and with ``verify`` its checksum costs) give
    the predicted time, and on a staging (GPU) backend the planner chooses the tiles by it
    (by the checks' costs too only where they are separate passes, not ``fuses_checks``);
    ``matmul`` calibrates on staging backends only, so that on the CPU both plan by bytes
    moved. ``out_dtype``: C's dtype where C is new (checked here against the operands and an
    existing output: :func:`output_dtype`)."""
    m, k, n, dtype = check_operands(A, B, trans_a, trans_b)
    alpha, beta = parse_scalar(alpha, "alpha"), parse_scalar(beta, "beta")
    if beta != 0 and out is None:
        raise ShapeError(f"Expected an existing C as out when beta != 0. Got out=None with "
                         f"beta={beta}.")
    output_dtype(out, dtype, out_dtype, resume=resume, reads_c=beta != 0)
    if verify is not None and dtype in HALF_DTYPES:
        raise OptionError(f"Expected verify=None for {dtype} operands (checksums cover float32 "
                          f"and float64). Got verify={verify!r}.")
    device, host = resolve_budgets(be, memory, host_memory)
    rates = (_io_rates(_rates(be, dtype, min(device, host)), A, B, out, be, verify, dtype)
             if calibrate else None)
    checked = None
    if rates is not None and verify is not None:
        fused = isinstance(be, Checksums) and bool(be.fuses_checks)
        checked = replace(rates, check_bytes=be.checksum_rate if isinstance(be, Checksums)
                          else None, check_step=be.checksum_step if isinstance(be, Checksums)
                          else 0.0, check_fused=fused)
        if not fused:  # separate passes over the panels at every step: tiles chosen for them
            rates = checked
    args = dict(trans_a=bool(trans_a), trans_b=bool(trans_b), reads_c=beta != 0,
                device_budget=device, host_budget=host, staging=be.staging,
                a_chunks=A.chunks, b_chunks=B.chunks,
                rates=rates if be.staging else None)  # CPU: the fewest bytes, as matmul plans
    threads = be.gemm_threads() if isinstance(be, HostHints) else None
    if not be.staging and threads:  # a gemm call costs more with more BLAS threads
        args["step_bytes"] = cpu_step_bytes(threads)
    fixed = resumed_schedule(out, m, n, k, dtype, alpha, beta, args) if resume else {}
    p = make_plan(m, n, k, dtype, **args, **fixed)
    if checked is not None or (p.rates is None and rates is not None):
        # for the predicted time only; where the gemm does the checks' updates, the tiles are
        # those of an unchecked run (the checks' near-constant cost would only tip near-ties)
        p = replace(p, rates=checked or rates)
    return p, job_record(p, alpha, beta)


def job_record(p: Plan, alpha: float, beta: float) -> dict:
    """What identifies a run for its journal (the output adds its inputs' identities)."""
    return {"plan": p.key(), "alpha": float(alpha), "beta": float(beta)}


def check_operands(A, B, trans_a: bool, trans_b: bool) -> tuple[int, int, int, str]:
    """(m, k, n, dtype name) of op(A) @ op(B) for opened inputs, the dtype the one A and B
    are multiplied in (:func:`bigmm.units.common_dtype`: NumPy's ``result_type``; an operand
    of another dtype is converted as its panels load); ShapeError naming the stored operands
    when they do not fit together."""
    m, k = A.shape[::-1] if trans_a else A.shape
    kb, n = B.shape[::-1] if trans_b else B.shape
    if k != kb:
        opa = "A^T" if trans_a else "A"
        opb = "B^T" if trans_b else "B"
        raise ShapeError(
            f"Expected the inner dimensions to match: columns of {opa} == rows of {opb}. Got "
            f"{opa} {m}x{k} ({A.label}, stored {A.shape[0]}x{A.shape[1]}) and {opb} {kb}x{n} "
            f"({B.label}, stored {B.shape[0]}x{B.shape[1]}): {k} != {kb}.")
    return m, k, n, common_dtype(dtype_name(A.dtype), dtype_name(B.dtype))


def output_dtype(out, operands: str, out_dtype=None, *, resume: bool = False,
                 reads_c: bool = False) -> np.dtype:
    """C's dtype for operands multiplied in ``operands``: an existing output that is kept (an
    array or h5py.Dataset, a spec resumed or holding old C: :func:`bigmm.io.existing_dtype`)
    decides its own (any of DTYPES: the result is rounded to it as it is written; DtypeError
    for others, and where ``out_dtype`` names another); a new C is in ``out_dtype``
    (:func:`bigmm.units.parse_out_dtype`: by default float32 for half-precision operands,
    else their dtype)."""
    have = io.existing_dtype(out, resume=resume, reads_c=reads_c)
    if have is None:
        return numpy_dtype(parse_out_dtype(out_dtype, operands))
    name = dtype_name(have)
    if name is None:
        raise DtypeError(f"Expected an output C of a dtype the result can be written to "
                         f"({', '.join(DTYPES)}). Got {output_label(out)} of "
                         f"{io.describe_dtype(have)}.")
    if out_dtype is not None and dtype_name(out_dtype) != name:
        raise DtypeError(f"Expected out_dtype={name} (or none) for the existing output "
                         f"{output_label(out)}, whose dtype decides C's. Got {out_dtype!r}.")
    return numpy_dtype(name)  # (a byte-swapped output is refused by the io layer, as before)


def parse_scalar(x, name: str) -> float:
    """``x`` (alpha or beta) as a finite float; OptionError naming ``name`` otherwise."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise OptionError(f"Expected {name} as a real number. Got {x!r}.") from None
    if not np.isfinite(v):
        raise OptionError(f"Expected a finite {name}. Got {x!r}.")
    return v


def resolve_budgets(be, memory, host_memory, *, limit: int | None = None) -> tuple[int, int]:
    """(device, host) budgets in bytes for backend ``be``: ``memory`` and ``host_memory``
    parsed, else DEVICE_SHARE of what the backend reports and HOST_SHARE of available RAM
    (without staging the host budget is the device budget). ``limit``, where given, caps
    the RAM those shares are taken of (a dask worker's memory limit)."""
    device = parse_size(memory, name="memory")
    host = parse_size(host_memory, name="host_memory")
    if device is None:
        free = be.memory_available()
        if not be.staging and limit:
            free = min(free, limit)
        device = _grain(int(free * DEVICE_SHARE[bool(be.staging)]))
    if host is None:
        host = device
        if be.staging:
            ram = host_memory_available()
            host = _grain(int(min(ram, limit or ram) * HOST_SHARE))
    return device, host


def _grain(nbytes: int) -> int:
    return nbytes - nbytes % BUDGET_GRAIN if nbytes >= 4 * BUDGET_GRAIN else nbytes


def resumed_schedule(out, m, n, k, dtype, alpha, beta, args) -> dict:
    """tile= and order= of the interrupted run recorded for ``out`` ({} where there is no
    journal: the run starts, or finds the output complete); ResumeError if the job differs."""
    if out is None:
        raise ResumeError("Expected an output to resume. Got out=None.")
    job = io.read_journal(out)
    if job is None:
        return {}
    old = job.get("plan", {})
    now = dict(m=m, n=n, k=k, dtype=dtype, trans_a=args["trans_a"], trans_b=args["trans_b"],
               reads_c=args["reads_c"])
    diff = [f"{key}: recorded {old.get(key)!r}, now {now[key]!r}" for key in _JOB_KEYS
            if old.get(key) != now[key]]
    diff += [f"{key}: recorded {job.get(key)!r}, now {v!r}" for key, v in
             (("alpha", alpha), ("beta", beta)) if job.get(key) != v]
    if diff:
        raise ResumeError(f"Expected the same job as the interrupted run on {output_label(out)}. "
                          f"Got a different one ({'; '.join(diff)}); start over with "
                          f"overwrite=True.")
    try:
        return {"tile": (int(old["bm"]), int(old["bn"]), int(old["bk"])),
                "order": str(old["order"])}
    except (KeyError, TypeError, ValueError):
        raise ResumeError(f"Expected a journal recording the schedule of "
                          f"{output_label(out)}. Got a journal without one.") from None


def output_label(out) -> str:
    """A short name of the output for messages (never an array's contents)."""
    if isinstance(out, np.ndarray):
        return "C (NumPy array)"
    if isinstance(out, (str, os.PathLike, io.Spec)):
        return f"C ({os.fspath(out) if isinstance(out, os.PathLike) else out})"
    name = getattr(out, "name", None)
    file = getattr(getattr(out, "file", None), "filename", None)
    return f"C ({file}:{name})" if name and file else f"C ({type(out).__name__})"


def open_output(out, p: Plan, job: dict, A, B, *, overwrite: bool, resume: bool,
                out_dtype=None):
    """The output Sink of job ``job`` (io.open_output with the plan's shape and tiles, in
    :func:`output_dtype`); a fresh run refuses an output that holds finished tiles of
    another."""
    dtype = output_dtype(out, p.dtype, out_dtype, resume=resume, reads_c=p.reads_c)
    sink = io.open_output(out, shape=(p.m, p.n), dtype=dtype, inputs=[A, B],
                          job=job, overwrite=overwrite, resume=resume, reads_c=p.reads_c,
                          tile=(p.bm, p.bn))
    if not resume and sink.done:
        sink.close()
        raise ResumeError(f"Expected a fresh output. Got {sink.label} with finished tiles.")
    return sink


def complete_stats(p: Plan) -> RunStats:
    """The statistics of a resumed run that found its output already complete."""
    return RunStats(0.0, 0, 0, 0, 0, p.n_tiles, p.n_tiles)


def _rates(be, dtype: str, limit: int) -> Rates | None:
    """The backend's own rates for the predicted time (None where it has none: not
    :class:`bigmm.backends.Calibrates`), snapped to a grid (:meth:`Rates.snapped`). The
    calibration holds at most ``limit`` bytes (the run's smaller budget), so planning stays
    within the budgets."""
    return be.rates(dtype, limit).snapped() if isinstance(be, Calibrates) else None


def _io_rates(rates: Rates | None, A, B, out, be, verify=None,
              dtype: str | None = None) -> Rates | None:
    """``rates`` with the read and write speeds of these operands: none at all (infinite)
    for pinned arrays that the copies use in place (:func:`bigmm.executor.in_place`; for C
    not under ``verify``), else a source's own ``read_rate`` attribute (bytes per second)
    where it has one, else ARRAY_READ_RATE for NumPy arrays and READ_RATE for files (the
    slower of A and B); ARRAY_WRITE_RATE when C is a NumPy array (or a new one), else
    WRITE_RATE. ``dtype``: the plan's (arrays of another are converted, not used in place;
    default: A's)."""
    if rates is None:
        return None
    panels = numpy_dtype(dtype or dtype_name(A.dtype))
    tiles = numpy_dtype(accumulate_dtype(panels.name))

    def read_rate(src) -> float:
        if getattr(src, "layout", None) == "array" and in_place(be, src.array, panels):
            return math.inf
        own = getattr(src, "read_rate", None)
        if own:
            return float(own)
        return ARRAY_READ_RATE if getattr(src, "layout", None) == "array" else READ_RATE

    if out is not None and verify is None and in_place(be, out, tiles, write=True):
        write = math.inf
    else:
        write = ARRAY_WRITE_RATE if out is None or isinstance(out, np.ndarray) else WRITE_RATE
    return replace(rates, read_bytes=min(read_rate(A), read_rate(B)), write_bytes=write)


def parse_io_threads(n: int | None) -> int:
    """Disk I/O threads: ``n``, or by default one per CPU core between 2 and 16; OptionError
    unless ``n`` is a positive integer."""
    if n is None:
        return min(16, max(2, os.cpu_count() or 1))
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OptionError(f"Expected io_threads as a positive integer. Got {n!r}.")
    return n
