"""The Python API: ``matmul`` and ``plan``. The only place that resolves defaults.

``matmul("a.h5:/A", "b.h5:/B", out="c.h5:/C", memory="8GiB")`` computes
C = alpha * op(A) @ op(B) + beta * C out of core and returns the output (a spec string for
files, an array for arrays).
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import replace
from typing import Callable

import numpy as np

from . import io
from .backends import Calibrates, get_backend
from .backends.numpy import memory_available as host_memory_available
from .checksum import parse_verify
from .errors import DtypeError, OptionError, OutputTooLarge, ResumeError, ShapeError
from .executor import STAGES, Progress, RunStats, execute, in_place
from .plan import READ_RATE, WRITE_RATE, Plan, Rates, cpu_step_bytes, make_plan
from .profile import Profile
from .units import format_bytes, parse_size

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


def matmul(a, b, out=None, *, alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False,
           trans_b: bool = False, memory=None, host_memory=None, backend: str = "auto",
           progress: Callable[[Progress], None] | None = None, resume: bool = False,
           overwrite: bool = False, io_threads: int | None = None, stats: bool = False,
           kernel: str | None = None, profile=None, verify: str | None = None):
    """C = alpha * op(A) @ op(B) + beta * C, out of core.

    ``a``, ``b``: "file.h5:/dataset" specs, h5py Datasets or NumPy arrays (stored matrices;
    ``trans_a``/``trans_b`` use their transposes without copying). ``out``: a spec, a Dataset,
    an array, or None for a new array; beta != 0 needs an existing C. ``memory``/
    ``host_memory``: budgets such as "8GiB", "512MB" or bytes (default: a share of what is
    free). ``resume``: continue an interrupted run into ``out`` without redoing its finished
    tiles. Returns the output, or (output, RunStats) with ``stats=True``.

    ``kernel`` (GPU backend): "bigmm" (its own kernel, the default), "cublas", or
    "cublas-tf32" (cuBLAS on TF32 tensor cores). ``profile``: record each stage's busy
    intervals (a GPU's copies and kernels timed with CUDA events); the RunStats' busy times
    then come from them. True writes ``<prefix>.trace.json`` (Chrome trace; opens in Perfetto)
    and ``<prefix>.png`` (timeline, with matplotlib) where prefix is the output file plus
    ".profile", or "bigmm-profile" for array outputs; a string or path is the prefix; a
    :class:`bigmm.profile.Profile` is filled and nothing is written.

    ``verify="checksum"``: check every C tile with Huang-Abraham checksums as it is computed
    (column and row sums of C against those predicted from the panels, under a rigorous
    rounding bound) and compute a tile that fails again; a second failure raises
    :class:`bigmm.errors.ChecksumError`. The RunStats count the checks, mismatches and
    recomputed tiles. Off by default (None): see README, Checksums during the run.
    """
    threads = parse_io_threads(io_threads)
    verify = parse_verify(verify)
    with _opened(a, b, backend, kernel) as (be, A, B, closing):
        p, job = _plan_job(A, B, out, be, alpha=alpha, beta=beta, trans_a=trans_a,
                           trans_b=trans_b, memory=memory, host_memory=host_memory,
                           resume=resume, calibrate=be.staging, verify=verify)
        if out is None:
            _check_array_result(p)
        sink = io.open_output(out, shape=(p.m, p.n), dtype=np.dtype(p.dtype), inputs=[A, B],
                              job=job, overwrite=overwrite, resume=resume, reads_c=p.reads_c,
                              tile=(p.bm, p.bn))
        if not resume and sink.done:
            raise ResumeError(f"Expected a fresh output. Got {sink.label} with finished tiles.")
        closing.append(sink)
        prof = _start_profile(profile, be)
        run = execute(p, A, B, sink, be, alpha=alpha, beta=parse_scalar(beta, "beta"),
                      progress=progress, io_threads=threads, profile=prof, verify=verify)
        if prof is not None:
            run = _finish_profile(profile, prof, be, run, out)
        result = sink.result
        closing.remove(sink)
        sink.close()  # on success a failure to close is an error; otherwise the first error wins
    return (result, run) if stats else result


def plan(a, b, out=None, *, alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False,
         trans_b: bool = False, memory=None, host_memory=None, backend: str = "auto",
         resume: bool = False, kernel: str | None = None, verify: str | None = None,
         **_ignored) -> Plan:
    """The Plan ``matmul`` would run with the same arguments (opens inputs read-only, writes
    nothing)."""
    verify = parse_verify(verify)
    with _opened(a, b, backend, kernel) as (be, A, B, _):
        p, _ = _plan_job(A, B, out, be, alpha=alpha, beta=beta, trans_a=trans_a,
                         trans_b=trans_b, memory=memory, host_memory=host_memory,
                         resume=resume, calibrate=True, verify=verify)
    return p


@contextlib.contextmanager
def _opened(a, b, backend: str, kernel: str | None):
    """(backend, A, B, closing) for one call; everything in ``closing`` (the inputs first, and
    what the caller adds) and the backend are closed on the way out, quietly."""
    be = resolve_backend(backend, kernel)
    closing: list = []
    try:
        A, B = open_inputs(a, b, closing, be)
        yield be, A, B, closing
    finally:
        _close_quietly(closing, be)


# ----- resolving the job --------------------------------------------------------------------

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
    opts = {key: getattr(be, attr) for key, attr in (("threads", "reader_threads"),
                                                     ("map_step", "map_step"))
            if getattr(be, attr, None)}
    A = io.open_input(a, name="A", **opts)
    closing.append(A)
    B = io.open_input(b, name="B", **opts)
    closing.append(B)
    return A, B


def _plan_job(A, B, out, be, *, alpha, beta, trans_a, trans_b, memory, host_memory, resume,
              calibrate: bool, verify: str | None = None) -> tuple[Plan, dict]:
    """The Plan and journal job for these operands. With ``calibrate`` the backend's rates
    (and the operands' read and write speeds, and with ``verify`` its checksum costs) give
    the predicted time, and on a staging (GPU) backend the planner chooses the tiles by it
    (by the checks' costs too only where they are separate passes, not ``fuses_checks``);
    ``matmul`` calibrates on staging backends only, so that on the CPU both plan by bytes
    moved."""
    m, k, n, dtype = check_operands(A, B, trans_a, trans_b)
    alpha, beta = parse_scalar(alpha, "alpha"), parse_scalar(beta, "beta")
    if beta != 0 and out is None:
        raise ShapeError(f"Expected an existing C as out when beta != 0. Got out=None with "
                         f"beta={beta}.")
    device, host = resolve_budgets(be, memory, host_memory)
    rates = (_io_rates(_rates(be, dtype, min(device, host)), A, B, out, be, verify) if calibrate
             else None)
    checked = None
    if rates is not None and verify is not None:
        fused = bool(getattr(be, "fuses_checks", False))
        checked = replace(rates, check_bytes=getattr(be, "checksum_rate", None),
                          check_step=getattr(be, "checksum_step", 0.0), check_fused=fused)
        if not fused:  # separate passes over the panels at every step: tiles chosen for them
            rates = checked
    args = dict(trans_a=bool(trans_a), trans_b=bool(trans_b), reads_c=beta != 0,
                device_budget=device, host_budget=host, staging=be.staging,
                a_chunks=A.chunks, b_chunks=B.chunks,
                rates=rates if be.staging else None)  # CPU: the fewest bytes, as matmul plans
    threads = getattr(be, "gemm_threads", None)
    if not be.staging and callable(threads):  # a gemm call costs more with more BLAS threads
        args["step_bytes"] = cpu_step_bytes(threads())
    fixed = resumed_schedule(out, m, n, k, dtype, alpha, beta, args) if resume else {}
    p = make_plan(m, n, k, dtype, **args, **fixed)
    if checked is not None or (p.rates is None and rates is not None):
        # for the predicted time only; where the gemm does the checks' updates, the tiles are
        # those of an unchecked run (the checks' near-constant cost would only tip near-ties)
        p = replace(p, rates=checked or rates)
    job = {"plan": p.key(), "alpha": alpha, "beta": beta,
           "a": A.label, "b": B.label}
    return p, job


def _check_array_result(p: Plan) -> None:
    """out=None returns C as a NumPy array: it must fit in the memory available now."""
    need, free = p.m * p.n * p.itemsize, host_memory_available()
    if need > free:
        raise OutputTooLarge(f"Expected C to fit in memory for out=None (the result is a NumPy "
                             f"array). Got C of {format_bytes(need)} with {format_bytes(free)} "
                             f"available; write it to a file instead (out='c.h5:/C').")


def check_operands(A, B, trans_a: bool, trans_b: bool) -> tuple[int, int, int, str]:
    """(m, k, n, dtype name) of op(A) @ op(B) for opened inputs; ShapeError or DtypeError
    naming the stored operands when they do not fit together."""
    m, k = A.shape[::-1] if trans_a else A.shape
    kb, n = B.shape[::-1] if trans_b else B.shape
    if k != kb:
        opa = "A^T" if trans_a else "A"
        opb = "B^T" if trans_b else "B"
        raise ShapeError(
            f"Expected the inner dimensions to match: columns of {opa} == rows of {opb}. Got "
            f"{opa} {m}x{k} ({A.label}, stored {A.shape[0]}x{A.shape[1]}) and {opb} {kb}x{n} "
            f"({B.label}, stored {B.shape[0]}x{B.shape[1]}): {k} != {kb}.")
    if np.dtype(A.dtype) != np.dtype(B.dtype):
        raise DtypeError(f"Expected A and B of one dtype. Got {np.dtype(A.dtype)} for "
                         f"{A.label} and {np.dtype(B.dtype)} for {B.label}.")
    return m, k, n, np.dtype(A.dtype).name


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
    """tile= and order= of the interrupted run recorded for ``out``; ResumeError if the job
    differs."""
    if out is None:
        raise ResumeError("Expected an output to resume. Got out=None.")
    job = io.read_journal(out)
    if job is None:
        raise ResumeError(f"Expected an interrupted output with a journal to resume. Got "
                          f"{out!r}, which has none (start it without resume).")
    old = job.get("plan", {})
    now = dict(m=m, n=n, k=k, dtype=dtype, trans_a=args["trans_a"], trans_b=args["trans_b"],
               reads_c=args["reads_c"])
    diff = [f"{key}: recorded {old.get(key)!r}, now {now[key]!r}" for key in _JOB_KEYS
            if old.get(key) != now[key]]
    diff += [f"{key}: recorded {job.get(key)!r}, now {v!r}" for key, v in
             (("alpha", alpha), ("beta", beta)) if job.get(key) != v]
    if diff:
        raise ResumeError(f"Expected the same job as the interrupted run on {out!r}. Got a "
                          f"different one ({'; '.join(diff)}); start over with overwrite.")
    try:
        return {"tile": (int(old["bm"]), int(old["bn"]), int(old["bk"])),
                "order": str(old["order"])}
    except (KeyError, TypeError, ValueError):
        raise ResumeError(f"Expected a journal recording the schedule. Got {job!r}.") from None


def _rates(be, dtype: str, limit: int) -> Rates | None:
    """The backend's own rates for the predicted time (None where it has none: not
    :class:`bigmm.backends.Calibrates`), snapped to a grid (:meth:`Rates.snapped`). The
    calibration holds at most ``limit`` bytes (the run's smaller budget), so planning stays
    within the budgets."""
    return be.rates(dtype, limit).snapped() if isinstance(be, Calibrates) else None


def _io_rates(rates: Rates | None, A, B, out, be, verify=None) -> Rates | None:
    """``rates`` with the read and write speeds of these operands: none at all (infinite)
    for pinned arrays that the copies use in place (:func:`bigmm.executor.in_place`; for C
    not under ``verify``), else a source's own ``read_rate`` attribute (bytes per second)
    where it has one, else ARRAY_READ_RATE for NumPy arrays and READ_RATE for files (the
    slower of A and B); ARRAY_WRITE_RATE when C is a NumPy array (or a new one), else
    WRITE_RATE."""
    if rates is None:
        return None

    def read_rate(src) -> float:
        if getattr(src, "layout", None) == "array" and in_place(be, src.array, src.dtype):
            return math.inf
        own = getattr(src, "read_rate", None)
        if own:
            return float(own)
        return ARRAY_READ_RATE if getattr(src, "layout", None) == "array" else READ_RATE

    if out is not None and verify is None and in_place(be, out, A.dtype, write=True):
        write = math.inf
    else:
        write = ARRAY_WRITE_RATE if out is None or isinstance(out, np.ndarray) else WRITE_RATE
    return replace(rates, read_bytes=min(read_rate(A), read_rate(B)), write_bytes=write)


def _start_profile(profile, be):
    """A Profile to record into (None when profiling is off); the backend times its own
    stages when it can."""
    if profile is None or profile is False:
        return None
    if not isinstance(profile, (bool, str, os.PathLike, Profile)):
        raise OptionError(f"Expected profile as True, a path prefix or a Profile. "
                          f"Got {profile!r}.")
    prof = profile if isinstance(profile, Profile) else Profile()
    start = getattr(be, "start_profile", None)
    if start is not None:
        start(prof)
    prof.begin()
    return prof


def _finish_profile(profile, prof: Profile, be, run: RunStats, out) -> RunStats:
    """Collect the device's intervals, write the files asked for, and return ``run`` with the
    busy times of the device-timed stages taken from the profile."""
    prof.finish()
    stop = getattr(be, "stop_profile", None)
    if stop is not None:
        stop()
    prof.moved.setdefault("read", run.bytes_read)
    prof.moved.setdefault("write", run.bytes_written)
    prof.compute_flops = prof.compute_flops or run.flops
    if not isinstance(profile, Profile):
        prof.save(profile_prefix(profile, out))
    busy = prof.busy()
    return replace(run, **{f"{s}_busy": busy[s] for s in prof.device_stages if s in STAGES})


def profile_prefix(profile, out) -> str:
    """Where ``profile=True`` writes its files: beside a file output, else the current
    directory; a string or path given as ``profile`` is the prefix itself."""
    if profile is not True:
        return os.fspath(profile)
    if isinstance(out, io.Spec):
        return out.path + ".profile"
    if isinstance(out, (str, os.PathLike)):
        return io.parse_spec(os.fspath(out)).path + ".profile"
    return "bigmm-profile"


def parse_io_threads(n: int | None) -> int:
    """Disk I/O threads: ``n``, or by default one per CPU core between 2 and 16; OptionError
    unless ``n`` is a positive integer."""
    if n is None:
        return min(16, max(2, os.cpu_count() or 1))
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OptionError(f"Expected io_threads as a positive integer. Got {n!r}.")
    return n


def _close_quietly(closing: list, be) -> None:
    """Close what was opened, in reverse; a failure to close an input loses nothing."""
    for x in reversed(closing):
        try:
            x.close()
        except Exception:
            pass
    be.close()
