"""One job resolved: operands opened and checked, budgets, rates, the plan, the output opened
for it (created, resumed or found complete), the job record. Shared by the API and dask."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import replace

import numpy as np

from . import filerates, io, planstore
from .backends import (Backend, Calibrates, Checksums, HostHints, Registers, SplitsPanels,
                       TimesShapes, get_backend)
from .backends.numpy import memory_available as host_memory_available
from .errors import BudgetError, DtypeError, OptionError, ResumeError, ShapeError
from .executor import RunStats, in_place
from .executor import calibrate as costs
from .executor.loads import eligible, operand_dtype
from .io.source import ArraySource
from .planner import READ_RATE, WRITE_RATE, Plan, Rates, cpu_step_bytes, make_plan
from .planner.decode import offered
from .planner.model import lock_seconds, snap_rate
from .precision import check_dtype, describe, kernel_precision, parse_precision
from .units import (DTYPES, HALF_DTYPES, common_dtype, dtype_name, numpy_dtype,
                    parse_out_dtype, parse_size)

#: Without a budget, the compute side may use this share of the memory the backend reports.
DEVICE_SHARE = {False: 0.25, True: 0.85}
#: Default host staging budget, as a share of available RAM (staging backends).
HOST_SHARE = 0.25
#: Default budgets are rounded down to whole multiples of this (when at least 4 of them), so
#: that what is free moving a little between calls keeps the same plan (plans are cached).
BUDGET_GRAIN = 64 << 20
#: A default budget within this share of the one the last call got (per backend) is that one:
#: what is free moves by more than a grain as the page cache fills with C and empties; the
#: device's only upwards (never more than its share of what is free now).
BUDGET_STICKY = 0.1
_LAST_BUDGETS: dict[tuple, int] = {}
#: Nominal speeds of reading a NumPy array input (a copy into the staging buffers, bound by
#: host memory bandwidth: ~15 GB/s on the H100 host) and of writing C into a NumPy array,
#: where the copies are not timed (:func:`_io_rates`).
ARRAY_READ_RATE, ARRAY_WRITE_RATE = 15e9, 5e9
#: The share of the host's timed copy rate that a run's readers and writer get, copying
#: beside each other while the device's copies read and write the staging buffers through
#: the same memory: on the H100 host, with the rows' cost counted, runs from 32768^2 to
#: 81920^2 arrays matched the model at 0.6-0.7 of the 49.4 GB/s timed alone.
COPY_SHARE = 0.6
#: Bytes the calibration of a host gemm may hold at least (two 1024^2 float32 operands).
HOST_CALIBRATION = 8 << 20
#: A chosen plan's steps are timed at their shape (``TimesShapes``) where it has at least
#: SHAPE_STEPS of them, and where that rate is more than SHAPE_TOLERANCE off the model's the
#: plan is chosen again under it, at most SHAPE_ROUNDS times: a library's kernels run some
#: shapes markedly slower than others (see BENCHMARKS.md).
SHAPE_STEPS, SHAPE_ROUNDS, SHAPE_TOLERANCE = 32, 3, 0.1
#: The most I/O threads taken: the calibration and the runs start and time each (10**7 kept
#: ``bigmm plan`` of a 60 x 40 product busy for minutes; 1024 plan it in 2 s on 2 cores).
MAX_IO_THREADS = 1024
#: Keys of the journal's job that must match for a resume.
_JOB_KEYS = ("m", "n", "k", "dtype", "trans_a", "trans_b", "reads_c")
#: The precision a job record without one stands for (the default is not recorded).
RECORDED_PRECISION = "float32"


def resolve_backend(name: str, kernel: str | None, precision: str | None = None):
    """The backend, with ``kernel`` and ``precision`` passed to it (only GPU backends take
    them; the CPU computes float32 products in IEEE float32 whatever the precision:
    :mod:`bigmm.precision`)."""
    precision = parse_precision(precision)
    kernel_precision(kernel, precision)  # the pairs no GPU runs are refused anywhere
    be = get_backend(name)
    if kernel is None and precision is None:
        return be
    resolved = be.name
    if not be.staging:
        if kernel is None:
            return be
        be.close()
        raise OptionError(f"Expected kernel= only with a GPU backend. Got kernel={kernel!r} "
                          f"with backend {resolved!r}.")
    be.close()
    options = {key: v for key, v in (("kernel", kernel), ("precision", precision))
               if v is not None}
    return get_backend(resolved, **options)


def job_precision(kernel: str | None, precision: str | None, dtype: str) -> str:
    """The precision of a job's float32 products (:func:`bigmm.precision.kernel_precision`),
    checked against the operands' ``dtype``: OptionError for a precision other than the
    default with operands that are not float32."""
    return check_dtype(kernel_precision(kernel, precision), dtype)


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
              io_threads: int | None = None, out_dtype=None, kernel: str | None = None,
              precision: str | None = None, symmetric: bool = False,
              upper: bool = False, measure_within: int | None = None,
              files: filerates.Files | None = None,
              timed: dict | None = None) -> tuple[Plan, dict]:
    """The Plan and journal job for these operands. With ``calibrate`` the backend's rates
    (and the operands' read and write speeds, the host's fixed costs per step and per read,
    and with ``verify`` its checksum costs) give the predicted time, and on a staging (GPU)
    backend the planner chooses the tiles by it (by the checks' costs too only where they
    are separate passes, not ``fuses_checks``), and how the user's arrays are copied
    (:func:`_host_paths`: staged, in place where page-locked, or page-locked for the run),
    whichever it predicts faster; ``matmul`` calibrates on staging backends only, so that on
    the CPU both plan by bytes moved. ``out_dtype``: C's dtype where C is new (checked here
    against the operands and an existing output: :func:`output_dtype`). ``kernel`` and
    ``precision`` as the backend was given them (:func:`job_precision`): the plan prints the
    arithmetic, and the job record holds the precision. ``symmetric``: a Gram plan (B is A,
    opposite transposes; ``upper``: its lower triangle not written). ``measure_within``: the
    most bytes the calibration's timed products and copies may hold (default: the smaller
    budget; on the CPU the device budget is the RAM for panels and tiles). Compressed inputs'
    decode buffers count in the host budget (:func:`decoding`): a budget below one decoded
    chunk is refused before anything is timed, and the timing decodes one chunk at a time.
    ``files``: what the files are now (:func:`bigmm.filerates.look`), where the caller has
    looked already. ``timed``: rates an earlier call of the same caller timed, by what they
    were timed within (taken from it and added to it), so that its plans compare under one
    timing."""
    m, k, n, dtype = check_operands(A, B, trans_a, trans_b)
    precision = job_precision(kernel, precision, dtype)
    if symmetric and verify is not None:
        raise OptionError(f"Expected verify=None for a Gram product (the checksums check "
                          f"general products). Got verify={verify!r}.")
    alpha, beta = parse_scalar(alpha, "alpha"), parse_scalar(beta, "beta")
    if beta != 0 and out is None:
        raise ShapeError(f"Expected an existing C as out when beta != 0. Got out=None with "
                         f"beta={beta}.")
    stored = dtype_name(output_dtype(out, dtype, out_dtype, resume=resume, reads_c=beta != 0))
    shape = getattr(out, "shape", None)  # an array, h5py.Dataset or zarr.Array given as out
    if shape is not None and tuple(shape) != (m, n):
        raise ShapeError(f"Expected shape {(m, n)} for {output_label(out)}. Got {tuple(shape)}.")
    if verify is not None and dtype in HALF_DTYPES:
        raise OptionError(f"Expected verify=None for {dtype} operands (checksums cover float32 "
                          f"and float64). Got verify={verify!r}.")
    device, host = resolve_budgets(be, memory, host_memory)
    readers = parse_io_threads(io_threads)
    args = dict(trans_a=bool(trans_a), trans_b=bool(trans_b), reads_c=beta != 0,
                device_budget=device, host_budget=host, staging=be.staging,
                symmetric=bool(symmetric), upper=bool(upper),
                presplit=be.split_parts if isinstance(be, SplitsPanels) else 0,
                whole=not _c_in_memory(out), out_dtype=stored,
                **operand_args(A, B, symmetric, readers))
    fixed = (resumed_schedule(out, m, n, k, dtype, alpha, beta, args, precision) if resume
             else {})
    if args["decoding"] is not None:  # a budget too small for a decoded chunk: refused now
        make_plan(m, n, k, dtype, **args)  # (a resumed schedule: checked on each host path)
        for src in (A, B):  # the calibration's reads decode one chunk at a time
            src.limit_decoders(1)
    # what the calibration may hold: the products within both budgets (on the CPU the device
    # budget is the RAM for panels and tiles), the host's copies within the host's
    within = measure_within or (min(device, host) if be.staging else device)
    copies_within = measure_within or (host if be.staging else device)
    key = (dtype, within, copies_within, readers)
    rates = timed.get(key) if timed is not None and calibrate else None
    if rates is None and calibrate:
        rates = _host_costs(_rates(be, dtype, within), A, B, be, dtype, readers, copies_within)
        if timed is not None:
            timed[key] = rates
    checked = None
    if rates is not None and verify is not None:
        fused = isinstance(be, Checksums) and bool(be.fuses_checks)
        checked = replace(rates, check_bytes=be.checksum_rate if isinstance(be, Checksums)
                          else None, check_step=be.checksum_step if isinstance(be, Checksums)
                          else 0.0, check_fused=fused)
        if not fused:  # separate passes over the panels at every step: tiles chosen for them
            rates = checked
    args["rates"] = rates if be.staging else None  # CPU: the fewest bytes, as matmul plans
    threads = be.gemm_threads() if isinstance(be, HostHints) else None
    if not be.staging and threads:  # a gemm call costs more with more BLAS threads
        args["step_bytes"] = cpu_step_bytes(threads)
    paths = (_host_paths(be, A, B, None if symmetric else out, dtype, verify, rates)
             if rates is not None else [None])  # a Gram plan's C: mirrored by the writer

    def choose(rates: Rates | None, checked: Rates | None):
        """The fastest plan over the host paths under ``rates`` (and the first refusal)."""
        best, refused = None, None
        for path in paths:  # the first of equally fast paths: fewer host copies, none locked
            path_rates = rates and _io_rates(rates, A, B, out, path[0] if path else "",
                                             readers, copies_within)
            if best is not None and path:  # where locking alone outlasts the best: skipped
                lock = lock_seconds(path[1], m, n, k, operand_dtype(dtype, "A").itemsize,
                                    operand_dtype(dtype, "C").itemsize, path_rates)
                if lock >= (best.predicted_seconds or math.inf):
                    continue
            kw = dict(args, in_place=path[0], registered=path[1]) if path else dict(args)
            if verify is not None:  # the checksums take each panel of A as it lands
                kw["a_span"] = 1
            if be.staging:
                kw["rates"] = path_rates
            try:
                q = planstore.plan(m, n, k, dtype, **kw, **fixed)  # kept for later runs
            except BudgetError as e:  # a resumed schedule may fit only the path it ran on
                if not fixed:
                    raise
                refused = refused or e
                continue
            if checked is not None or q.rates is None:
                # for the predicted time only; where the gemm does the checks' updates, the
                # tiles are those of an unchecked run (the checks' near-constant cost would
                # only tip near-ties)
                q = replace(q, rates=_checked(path_rates, checked))
            if best is None or (q.predicted_seconds or 0) < (best.predicted_seconds or 0):
                best = q
        return best, refused

    best, refused = choose(rates, checked)
    shapes: dict = {}
    while best is not None and best.rates is not None and isinstance(be, TimesShapes):
        shape = (best.bm, best.bn, best.bk)  # the chosen plan's steps timed at their shape
        if shape in shapes or best.n_steps < SHAPE_STEPS or len(shapes) == SHAPE_ROUNDS:
            break
        flops = be.shape_flops(*shape, dtype)
        if flops is None or abs(flops / _modelled(rates, best) - 1) <= SHAPE_TOLERANCE:
            break  # near what the model gives it: near ties are not chosen again on noise
        shapes[shape] = snap_rate(flops)
        rates = rates.with_shapes(shapes)
        checked = checked and checked.with_shapes(shapes)
        best, refused = choose(rates, checked)
    if best is None:
        raise refused
    if best.rates is not None:  # the time predicted with what the files are now
        files = files if files is not None else filerates.look(A, B, out)
        if files.inputs or files.output:
            best = replace(best, rates=_checked(_io_rates(
                rates, A, B, out, best.in_place or "", readers, copies_within, files), checked),
                files=files.describe())
    return (_with_arithmetic(best, describe(precision, dtype, bool(be.staging))),
            job_record(best, alpha, beta, precision))


def operand_args(A, B, symmetric: bool, readers: int) -> dict:
    """What a plan takes from the opened A and B: the chunks its panels align to, the decode
    buffers of compressed ones (:func:`decoding`, ``readers`` at most) and their dtypes as
    stored (``make_plan`` drops those equal to the dtype they are multiplied in)."""
    return {"a_chunks": A.panel_chunks, "b_chunks": B.panel_chunks,
            "decoding": decoding(A, B, symmetric, readers),
            "a_dtype": dtype_name(A.dtype), "b_dtype": dtype_name(B.dtype)}


def decoding(A, B, symmetric: bool, readers: int):
    """The decode buffers of inputs whose chunks are decoded whole, for the planner
    (:func:`bigmm.planner.decode.offered`): per input the bytes one decoding reader holds,
    and at most the run's ``readers`` decoding at once (or the source's own bound); a Gram
    product's B is A. None where neither is decoded."""
    sources = (A, None if symmetric else B)
    return offered(tuple(s.decode_bytes if s else 0 for s in sources),
                   tuple((s.decode_threads or readers) if s else 0 for s in sources))


def _modelled(rates: Rates, p: Plan) -> float:
    """The flops per second ``rates`` give a step of ``p`` that adds into its C tile."""
    r = rates.for_plan(p)
    flops = 2.0 * p.bm * p.bn * p.bk
    return flops / (r.gemm_seconds(flops, 1, p.bk, p.c_itemsize * p.bm * p.bn) - r.per_step)


def _with_arithmetic(p: Plan, arithmetic: str) -> Plan:
    """``p`` stating its arithmetic, its predicted time kept (not simulated again)."""
    q = replace(p, arithmetic=arithmetic)
    if "_predicted" in p.__dict__:
        object.__setattr__(q, "_predicted", p.__dict__["_predicted"])
    return q


def _checked(rates: Rates | None, checked: Rates | None) -> Rates | None:
    """``rates`` with the checksum costs of ``checked`` (where there are checks)."""
    if rates is None or checked is None:
        return rates
    return replace(rates, check_bytes=checked.check_bytes, check_step=checked.check_step,
                   check_fused=checked.check_fused)


def _host_paths(be, A, B, out, dtype: str, verify, rates: Rates) -> list:
    """How the user's arrays may be copied, as (in_place, registered) operand strings, the
    ones to try in order: those page-locked already in place and the others staged; all
    staged; all in place, those not page-locked locked for the run (a backend that
    :class:`~bigmm.backends.base.Registers`, at a known rate). [None] (the executor decides)
    without staging or without arrays. C is never in place under ``verify`` (a tile that
    fails its check must not reach the output) nor when it is a new array (its pages are
    not touched yet)."""
    if not be.staging:
        return [None]
    arrays = {"A": A.array if isinstance(A, ArraySource) else None,
              "B": B.array if isinstance(B, ArraySource) else None,
              "C": out if isinstance(out, np.ndarray) and verify is None else None}
    usable = "".join(op for op, x in arrays.items()
                     if x is not None and eligible(x, operand_dtype(dtype, op), op == "C"))
    if not usable:
        return [None]
    pinned = "".join(op for op in usable
                     if in_place(be, arrays[op], operand_dtype(dtype, op), op == "C"))
    paths = [(pinned, ""), ("", "")] if pinned else [("", "")]
    if pinned != usable and isinstance(be, Registers) and rates.register_bytes:
        paths.append((usable, "".join(op for op in usable if op not in pinned)))
    return paths


def job_record(p: Plan, alpha: float, beta: float, precision: str = "float32") -> dict:
    """What identifies a run for its journal (the output adds its inputs' identities): the
    schedule, alpha, beta and, where not the default (so that outputs and journals written
    before the option still match), the precision of its float32 products."""
    record = {"plan": p.key(), "alpha": float(alpha), "beta": float(beta)}
    if precision != RECORDED_PRECISION:
        record["precision"] = precision
    return record


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
        device = _sticky(("device", type(be), be.name, limit),
                         _grain(int(free * DEVICE_SHARE[bool(be.staging)])), down=False)
    if host is None:
        host = device
        if be.staging:
            ram = host_memory_available()
            host = _sticky(("host", type(be), be.name, limit),
                           _grain(int(min(ram, limit or ram) * HOST_SHARE)), down=True)
    return device, host


def _sticky(key: tuple, value: int, down: bool) -> int:
    """The last default budget of ``key`` where ``value`` is within BUDGET_STICKY above it (or
    below it, where ``down``), else ``value`` (remembered)."""
    last = _LAST_BUDGETS.get(key)
    low = last * (1 - BUDGET_STICKY) if last is not None and down else last
    if last is not None and low <= value <= last * (1 + BUDGET_STICKY):
        return last
    _LAST_BUDGETS[key] = value
    return value


def _grain(nbytes: int) -> int:
    return nbytes - nbytes % BUDGET_GRAIN if nbytes >= 4 * BUDGET_GRAIN else nbytes


def resumed_schedule(out, m, n, k, dtype, alpha, beta, args,
                     precision: str = "float32") -> dict:
    """tile=, order= (and resident-c's tail=) of the interrupted run recorded for ``out``
    ({} where there is no journal: the run starts, or finds the output complete); ResumeError
    if the job differs (a journal without a precision recorded RECORDED_PRECISION)."""
    if out is None:
        raise ResumeError("Expected an output to resume. Got out=None.")
    job = io.read_journal(out)
    if job is None:
        return {}
    old = job.get("plan", {})
    now = dict(m=m, n=n, k=k, dtype=dtype, trans_a=args["trans_a"], trans_b=args["trans_b"],
               reads_c=args["reads_c"], symmetric=args.get("symmetric", False),
               upper=args.get("upper", False))
    was = dict(old, symmetric=old.get("symmetric", False), upper=old.get("upper", False))
    diff = [f"{key}: recorded {was.get(key)!r}, now {now[key]!r}"
            for key in _JOB_KEYS + ("symmetric", "upper") if was.get(key) != now[key]]
    diff += [f"{key}: recorded {job.get(key)!r}, now {v!r}" for key, v in
             (("alpha", alpha), ("beta", beta)) if job.get(key) != v]
    recorded = job.get("precision", RECORDED_PRECISION)
    if recorded != precision:
        diff.append(f"precision: recorded {recorded!r}, now {precision!r}")
    if diff:
        raise ResumeError(f"Expected the same job as the interrupted run on {output_label(out)}. "
                          f"Got a different one ({'; '.join(diff)}); start over with "
                          f"overwrite=True.")
    try:
        fixed = {"tile": (int(old["bm"]), int(old["bn"]), int(old["bk"])),
                 "order": str(old["order"])}
        if fixed["order"] == "resident-c":  # its tail orders the last K panel's strips
            fixed["tail"] = int(old.get("tail", 1))
        return fixed
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


#: Edges of the square blocks of old C compared with their mirrors: at most, and at least.
SYMMETRY_BLOCK, SYMMETRY_MIN_BLOCK = 1024, 64


def symmetry_block(budget: int, itemsize: int) -> int:
    """The edge of :func:`check_symmetric_c`'s blocks within ``budget`` bytes: a block and its
    mirror of ``itemsize`` bytes an element, and four boolean masks (multiples of
    SYMMETRY_MIN_BLOCK)."""
    step = SYMMETRY_MIN_BLOCK
    edge = math.isqrt(max(0, int(budget)) // (2 * itemsize + 4)) // step * step
    return min(SYMMETRY_BLOCK, max(SYMMETRY_MIN_BLOCK, edge))


def check_symmetric_c(out, n: int, budget: int) -> None:
    """Refuse an old C ``out`` that is not symmetric (OptionError naming the first element
    found that differs from its mirror; NaNs equal), opened read-only and read once in square
    blocks held within the host ``budget`` (:func:`symmetry_block`): a Gram product with
    beta != 0 writes its lower triangle as the transpose of its upper. ShapeError where it is
    not n x n."""
    with io.open_input(out, name="C") as src:
        if tuple(src.shape) != (n, n):
            raise ShapeError(f"Expected shape {(n, n)} for {output_label(out)}. "
                             f"Got {tuple(src.shape)}.")
        b = symmetry_block(budget, src.dtype.itemsize)
        held = [np.empty(b * b, src.dtype) for _ in range(2)]  # the two blocks' buffers
        for i0 in range(0, n, b):
            i1 = min(n, i0 + b)
            for j0 in range(i0, n, b):
                j1 = min(n, j0 + b)
                x = held[0][:(i1 - i0) * (j1 - j0)].reshape(i1 - i0, j1 - j0)
                src.read(i0, i1, j0, j1, x)
                y = x
                if j0 != i0:
                    y = held[1][:(j1 - j0) * (i1 - i0)].reshape(j1 - j0, i1 - i0)
                    src.read(j0, j1, i0, i1, y)
                y = y.T
                differ = x != y
                if differ.any():  # NaN differs from itself: NaNs in both places are equal
                    differ &= ~(np.isnan(x) & np.isnan(y))
                if differ.any():
                    r, c = (int(v) for v in np.argwhere(differ)[0])
                    raise OptionError(
                        f"Expected a symmetric old C for beta != 0 in a Gram product (its "
                        f"lower triangle is written as the transpose of its upper). Got "
                        f"C[{i0 + r}, {j0 + c}] = {float(x[r, c])!r} and C[{j0 + c}, "
                        f"{i0 + r}] = {float(y[r, c])!r} in {src.label}. Pass upper=True "
                        f"(--upper) to update its upper triangle only, or gram=False (bigmm "
                        f"multiply) for the general product.")


def complete_stats(p: Plan) -> RunStats:
    """The statistics of a resumed run that found its output already complete."""
    return RunStats(0.0, 0, 0, 0, 0, p.n_tiles, p.n_tiles)


def _rates(be, dtype: str, limit: int) -> Rates | None:
    """The backend's own rates for the predicted time (None where it has none: not
    :class:`bigmm.backends.Calibrates`), snapped to a grid (:meth:`Rates.snapped`). The
    calibration holds at most ``limit`` bytes (the run's smaller budget), so planning stays
    within the budgets; where the gemm runs on the host, at least HOST_CALIBRATION bytes,
    held only while timing (a smaller product times its call's start, not its arithmetic,
    which the steps' fixed cost counts already)."""
    if not isinstance(be, Calibrates):
        return None
    return be.rates(dtype, limit if be.staging else max(limit, HOST_CALIBRATION)).snapped()


def _host_costs(rates: Rates | None, A, B, be, dtype: str, threads: int,
                host: int) -> Rates | None:
    """``rates`` with the host's fixed costs: where the gemm runs on the host, the executor's
    fixed cost per step with its small reads of A and B (the cores are shared:
    :func:`bigmm.executor.calibrate.step_seconds`); else one read of the slower input file
    (:func:`bigmm.executor.calibrate.load_seconds`; none for arrays) and the issuing
    thread's work per step and per staged load, and a run's own start and end
    (:func:`bigmm.executor.calibrate.issue_seconds`); and for both, one reader's rate of
    decoding each compressed input (:func:`bigmm.executor.calibrate.decode_rate`, its
    buffers within the ``host`` budget)."""
    if rates is None:
        return None
    rates = replace(rates, decode_bytes=tuple(costs.decode_rate(src, threads, host) or 0.0
                                                  for src in (A, B)))
    if not be.staging:  # reads share the cores with the gemm: all in a step's cost
        return replace(rates, per_step=costs.step_seconds(be, threads, A, B)).snapped()
    per_load = max([costs.load_seconds(src) for src in (A, B) if src.layout != "array"],
                   default=0.0)
    # (a backend that only plans, such as a test's, has nothing to run: no issuing costs)
    per_issue, per_handoff, per_run = (costs.issue_seconds(be, threads)
                                       if isinstance(be, Backend) else (0.0, 0.0, 0.0))
    return replace(rates, per_load=per_load, per_issue=per_issue, per_handoff=per_handoff,
                   per_run=per_run).snapped()


def _c_in_memory(out) -> bool:
    """Whether C is a NumPy array (the one given, or a new one where ``out`` is None), not a
    file or store."""
    return out is None or isinstance(out, np.ndarray)


def _io_rates(rates: Rates, A, B, out, in_place_ops: str, threads: int, host: int,
              files: filerates.Files | None = None) -> Rates:
    """``rates`` with the read and write speeds of these operands where they are staged
    (those in ``in_place_ops`` are copied in place: the model counts no host work for
    them): for files READ_RATE and WRITE_RATE (with ``files``, those of what the files are
    now: :mod:`bigmm.filerates`); for NumPy arrays the host's copy rate with
    ``threads`` threads, of which the run has COPY_SHARE, and a thread's rate in pieces
    while all of them copy (``Rates.thread_bytes``: a small panel is read by few threads,
    :func:`~bigmm.executor.calibrate.piece_rate`); for both the cost per row
    of a panel (:func:`bigmm.executor.calibrate.copy_rate`,
    :func:`~bigmm.executor.calibrate.copy_row_seconds`, timed within a quarter of the
    ``host`` budget)."""
    staged = {"A": A, "B": B}
    array_in = [src for op, src in staged.items()
                if op not in in_place_ops and src.layout == "array"]
    array_out = "C" not in in_place_ops and _c_in_memory(out)
    copies = row = one = None
    size = min(costs.COPY_BYTES, max(16 << 20, host // 4))
    if array_in or array_out:
        copies = snap_rate(COPY_SHARE * costs.copy_rate(threads, size))  # on the rates'
        # grid: one plan
        one = snap_rate(costs.piece_rate(size, threads)) if array_in else None  # a reader's
        # share while all copy
    if set("ABC") - set(in_place_ops):  # staged panels of files are copied row by row too
        row = snap_rate(costs.copy_row_seconds(threads, size))  # in every process

    reads = [copies if src.layout == "array" else files.read_rate(op) if files else READ_RATE
             for op, src in staged.items() if op not in in_place_ops]
    write = files.write_rate() if files else WRITE_RATE
    return replace(rates, read_bytes=min(reads, default=math.inf),
                   write_bytes=copies if array_out else write,
                   per_host_row=row or 0.0, thread_bytes=one)


def parse_io_threads(n: int | None) -> int:
    """Disk I/O threads: ``n``, or by default one per CPU core between 2 and 16; OptionError
    unless ``n`` is an integer from 1 to MAX_IO_THREADS."""
    if n is None:
        return min(16, max(2, os.cpu_count() or 1))
    if (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1
            or n > MAX_IO_THREADS):
        raise OptionError(f"Expected io_threads as an integer from 1 to {MAX_IO_THREADS}. "
                          f"Got {n!r}.")
    return int(n)
