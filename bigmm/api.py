"""The Python API: ``matmul``, ``gram``, ``plan`` and ``page_locked``.

``matmul("a.h5:/A", "b.h5:/B", out="c.h5:/C", memory="8GiB")`` computes
C = alpha * op(A) @ op(B) + beta * C out of core and returns the output (a spec string for
files, an array for arrays). ``gram("a.h5:/A", out="c.h5:/C")`` computes the symmetric
C = alpha * A^T A + beta * C (or A A^T) with half the work; ``matmul`` of one operand's data
with opposite transposes takes the same path. Resolving the job (operands, budgets, rates,
the plan, resume) is :mod:`bigmm.job`'s; this module adds the defaults, profiling and the
result.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Union

from . import filerates, io
from .backends import Profiles, get_backend
from .backends.numpy import memory_available as host_memory_available
from .backends.numpy import memory_total as host_memory_total
from .checksum import parse_verify
from .errors import BudgetError, OptionError, OutputTooLarge
from .executor import STAGES, Progress, RunStats, execute
from .executor.register import Locked, held
from .advice import budget_note as job_budget_note
from .io.existing import check_output
from .job import (check_operands, check_symmetric_c, complete_stats, open_inputs, open_output,
                  output_dtype, parse_io_threads, parse_scalar, plan_job, resolve_backend)
from .planner import Plan
from .planner.decode import host_total
from .profile import Profile
from .units import format_bytes

if TYPE_CHECKING:
    import h5py
    import numpy as np
    import zarr

#: An operand: a "file.h5:/dataset" or "store.zarr[:/array]" spec (a string or path), an h5py
#: Dataset, a zarr Array or a NumPy array.
Operand = Union[str, "os.PathLike[str]", "io.Spec", "h5py.Dataset", "zarr.Array", "np.ndarray"]
#: A memory budget: bytes, or a string such as "8GiB" or "512MB"; None for the default.
Size = Union[int, float, str, None]


def matmul(a: Operand, b: Operand, out: Operand | None = None, *, alpha: float = 1.0,
           beta: float = 0.0, trans_a: bool = False, trans_b: bool = False,
           memory: Size = None, host_memory: Size = None, backend: str = "auto",
           progress: Callable[[Progress], None] | None = None, resume: bool = False,
           overwrite: bool = False, io_threads: int | None = None, stats: bool = False,
           kernel: str | None = None, profile: bool | str | os.PathLike | Profile | None = None,
           verify: str | None = None, out_dtype=None, precision: str | None = None,
           gram: bool | None = None):
    """C = alpha * op(A) @ op(B) + beta * C, out of core.

    ``a``, ``b``: "file.h5:/dataset" or "store.zarr[:/array]" specs, h5py Datasets, zarr
    Arrays or NumPy arrays (stored matrices; ``trans_a``/``trans_b`` use their transposes
    without copying). ``out``: a spec, a Dataset, a zarr Array, an array, or None for a new
    array; beta != 0 needs an existing C. ``memory``/
    ``host_memory``: budgets such as "8GiB", "512MB" or bytes (default: a share of what is
    free). ``resume``: continue an interrupted run into ``out`` without redoing its finished
    tiles. Returns the output, or (output, RunStats) with ``stats=True``.

    Dtypes (float16, bfloat16, float32, float64) follow NumPy: A and B of different dtypes are
    multiplied in ``numpy.result_type`` of the two (float32 @ float64 in float64), the other
    converted as its panels load. float16 and bfloat16 are multiplied with float32
    accumulation (tensor cores on a GPU) into a float32 C, or one in the operands' dtype with
    ``out_dtype`` ("bfloat16"); ``out_dtype`` names the dtype of a new C. An existing output
    (an array, a Dataset, or a spec resumed or holding old C) decides its own dtype.

    ``kernel`` (GPU backend): "bigmm" (its own kernel, the default), "cublas", or
    "cublas-tf32" (cuBLAS on TF32 tensor cores: kernel "cublas" with precision "tf32").
    ``precision`` (float32 operands; any case): "float32" (IEEE on the CUDA cores, the
    default), "tf32x3" (float32's accuracy on the TF32 tensor cores, bigmm's kernel only) or
    "tf32" (one TF32 pass: about 3e-4 relative error); on the CPU products are IEEE float32
    whatever it says (see README, Precision). ``profile``: record each stage's busy
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

    ``gram``: where A and B are the same data (the same object or array, or the same dataset
    of the same file) with opposite transposes, C = A^T A (A A^T) is computed as :func:`gram`
    computes it, with half the work (None: detected, unless ``verify`` is asked for; False:
    the general product; True: required, an OptionError otherwise). Not detected where beta
    != 0 (an old C need not be symmetric); with ``gram=True`` and beta != 0 old C is read once
    first and refused unless symmetric.
    """
    return _multiply(a, b, out, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b,
                     memory=memory, host_memory=host_memory, backend=backend,
                     progress=progress, resume=resume, overwrite=overwrite,
                     io_threads=io_threads, stats=stats, kernel=kernel, profile=profile,
                     verify=verify, out_dtype=out_dtype, precision=precision, gram=gram,
                     upper=False)


def gram(a: Operand, out: Operand | None = None, *, trans: bool = True, upper: bool = False,
         alpha: float = 1.0, beta: float = 0.0, memory: Size = None, host_memory: Size = None,
         backend: str = "auto", progress: Callable[[Progress], None] | None = None,
         resume: bool = False, overwrite: bool = False, io_threads: int | None = None,
         stats: bool = False, kernel: str | None = None,
         profile: bool | str | os.PathLike | Profile | None = None, out_dtype=None,
         precision: str | None = None):
    """The Gram product C = alpha * A^T A + beta * C (``trans=True``, C n x n for A m x n) or
    C = alpha * A A^T + beta * C (``trans=False``, C m x m), out of core, with half the work.

    Only the tiles of C on and above the diagonal are computed (a diagonal tile by a rank-k
    update of its upper triangle: BLAS/cuBLAS syrk); every tile below the diagonal is written
    as the transpose of its mirror. ``upper=True`` writes C's strictly lower triangle as
    zeros instead (no transposes). beta != 0 reads the old C's
    tiles on and above the diagonal; without ``upper`` old C must be symmetric (it is read
    once first, and an OptionError names an element that differs from its mirror; with
    ``upper`` its lower triangle is not read). A is read once where C
    fits on the device (one tile of C: the tall-skinny case). The other arguments are
    :func:`matmul`'s; ``verify="checksum"`` is not available for Gram products.
    """
    return _multiply(a, a, out, alpha=alpha, beta=beta, trans_a=bool(trans),
                     trans_b=not trans, memory=memory, host_memory=host_memory,
                     backend=backend, progress=progress, resume=resume, overwrite=overwrite,
                     io_threads=io_threads, stats=stats, kernel=kernel, profile=profile,
                     verify=None, out_dtype=out_dtype, precision=precision, gram=True,
                     upper=upper)


def _multiply(a, b, out, *, alpha, beta, trans_a, trans_b, memory, host_memory, backend,
              progress, resume, overwrite, io_threads, stats, kernel, profile, verify,
              out_dtype, precision, gram, upper):
    """``matmul`` and ``gram``: one run."""
    threads = parse_io_threads(io_threads)
    verify = parse_verify(verify)
    check_callbacks(progress, profile, out)
    with _opened(a, b, backend, kernel, precision) as (be, A, B, closing):
        symmetric = _symmetric(A, B, trans_a, trans_b, gram, verify, beta)
        if symmetric:
            B = A
        files = filerates.look(A, B, out)  # for the predicted time, and what the run shows
        p, job = plan_job(A, B, out, be, alpha=alpha, beta=beta, trans_a=trans_a,
                          trans_b=trans_b, memory=memory, host_memory=host_memory,
                          resume=resume, calibrate=be.staging, verify=verify,
                          out_dtype=out_dtype, io_threads=threads, kernel=kernel,
                          precision=precision, symmetric=symmetric, upper=upper, files=files)
        _check_fits_ram(p)
        if out is None:
            _check_array_result(p, output_dtype(None, p.dtype, out_dtype).itemsize)
        if (p.symmetric and p.reads_c and not p.upper
                and not (resume and io.read_journal(out) is not None)):
            # (a resumed run's C was checked when it started)
            check_symmetric_c(out, p.n, p.host_budget)
        sink = open_output(out, p, job, A, B, overwrite=overwrite, resume=resume,
                           out_dtype=out_dtype)
        closing.append(sink)
        if sink.complete:  # resumed after it had finished: nothing to do
            result = sink.result
            return (result, complete_stats(p)) if stats else result
        prof = _start_profile(profile, be)
        run = execute(p, A, B, sink, be, alpha=alpha, beta=parse_scalar(beta, "beta"),
                      progress=progress, io_threads=threads, profile=prof, verify=verify)
        if prof is not None:
            run = _finish_profile(profile, prof, be, run, out)
        result = sink.result
        closing.remove(sink)
        sink.close()  # on success a failure to close is an error; otherwise the first error wins
        filerates.learn(files, run, "".join(op for op in "AB" if op not in (p.in_place or "")),
                        p.reads_c)
    return (result, run) if stats else result


def plan(a: Operand, b: Operand, out: Operand | None = None, *, alpha: float = 1.0,
         beta: float = 0.0, trans_a: bool = False, trans_b: bool = False, memory: Size = None,
         host_memory: Size = None, backend: str = "auto",
         resume: bool = False, kernel: str | None = None, verify: str | None = None,
         out_dtype=None, precision: str | None = None, gram: bool | None = None,
         upper: bool = False, io_threads: int | None = None) -> Plan:
    """The Plan ``matmul`` would run with the same arguments (opens inputs read-only, writes
    nothing; ``out_dtype`` is checked as ``matmul`` checks it); with ``gram=True`` (or the
    same data with opposite transposes, detected) and ``upper``, the Plan of :func:`gram`.
    ``io_threads`` as ``matmul``'s: on a GPU the host's copy rates, and so the plan, depend
    on it. An ``out`` that is one of the inputs, that cannot be written, or (beta != 0) that
    holds no old C of C's shape is refused as ``matmul`` refuses it."""
    verify = parse_verify(verify)
    with _opened(a, b, backend, kernel, precision) as (be, A, B, _):
        io.refuse_output_alias(out, [A, B])
        symmetric = _symmetric(A, B, trans_a, trans_b, gram, verify, beta)
        m, _, n, _ = check_operands(A, A if symmetric else B, trans_a, trans_b)
        check_output(out, (m, n), reads_c=parse_scalar(beta, "beta") != 0, resume=resume)
        p, _ = plan_job(A, A if symmetric else B, out, be, alpha=alpha, beta=beta,
                        trans_a=trans_a, trans_b=trans_b, memory=memory,
                        host_memory=host_memory, resume=resume, calibrate=True,
                        verify=verify, out_dtype=out_dtype, kernel=kernel,
                        precision=precision, symmetric=symmetric, upper=upper and symmetric,
                        io_threads=parse_io_threads(io_threads))
    return p


def _symmetric(A, B, trans_a: bool, trans_b: bool, gram: bool | None, verify, beta) -> bool:
    """Whether the product of opened A and B runs as a Gram product (see ``matmul``'s
    ``gram``). Not detected where beta != 0: the old C of a general product need not be
    symmetric."""
    same = bool(trans_a) != bool(trans_b) and io.same_data(A, B)
    if gram is None:
        return same and verify is None and parse_scalar(beta, "beta") == 0
    if gram and not same:
        raise OptionError(f"Expected one operand's data with opposite transposes for a Gram "
                          f"product. Got {A.label} and {B.label} with trans_a={trans_a}, "
                          f"trans_b={trans_b}.")
    if gram and verify is not None:
        raise OptionError(f"Expected verify=None for a Gram product (the checksums check "
                          f"general products). Got verify={verify!r}.")
    return bool(gram)


def budget_note(a: Operand, b: Operand, out: Operand | None = None, *, alpha: float = 1.0,
                beta: float = 0.0, trans_a: bool = False, trans_b: bool = False,
                memory: Size = None, host_memory: Size = None, backend: str = "auto",
                kernel: str | None = None, verify: str | None = None, out_dtype=None,
                plan: Plan | None = None, precision: str | None = None,
                io_threads: int | None = None) -> str | None:
    """One line when the budgets given make the plan (``plan``, or the one :func:`plan`
    would return) predicted much slower than the default budgets would, with the budget that
    would help; None otherwise (see :func:`bigmm.advice.budget_note`)."""
    verify = parse_verify(verify)
    with _opened(a, b, backend, kernel, precision) as (be, A, B, _):
        kw = dict(alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, resume=False,
                  calibrate=True, verify=verify, out_dtype=out_dtype, kernel=kernel,
                  precision=precision, io_threads=parse_io_threads(io_threads))
        if plan is None:
            plan = plan_job(A, B, out, be, memory=memory, host_memory=host_memory, **kw)[0]
        return job_budget_note(A, B, out, be, plan, memory=memory, host_memory=host_memory,
                               **kw)


@contextlib.contextmanager
def page_locked(*arrays: "np.ndarray", backend: str = "auto") -> Iterator[Locked]:
    """Keep NumPy arrays page-locked while the block runs, so that every bigmm call in it
    copies them to and from the GPU in place (DMA, no host copies through staging buffers)
    without locking them again each call. Arrays already page-locked are left as they are;
    the others are locked where they lie and released on the way out, also after an error
    (calls using them from other threads must have returned by then). Yields what was
    locked (``nbytes``, ``seconds``, ``notes()`` naming any array left unlocked). On a
    backend without staging (NumPy) nothing is locked: host memory is its compute memory."""
    import numpy as np

    bad = [type(x).__name__ for x in arrays if not isinstance(x, np.ndarray)]
    if bad:
        raise OptionError(f"Expected NumPy arrays to page-lock. Got {', '.join(bad)}.")
    be = get_backend(backend)
    try:
        if not be.staging:
            yield Locked()
            return
        with held(be, arrays) as locked:
            yield locked
    finally:
        be.close()


@contextlib.contextmanager
def _opened(a, b, backend: str, kernel: str | None, precision: str | None = None):
    """(backend, A, B, closing) for one call; everything in ``closing`` (the inputs first, and
    what the caller adds) and the backend are closed on the way out, quietly."""
    be = resolve_backend(backend, kernel, precision)
    closing: list = []
    try:
        A, B = open_inputs(a, b, closing, be)
        yield be, A, B, closing
    finally:
        _close_quietly(closing, be)


def _check_fits_ram(p: Plan) -> None:
    """BudgetError before anything is written where the plan's host buffers (the compute
    buffers without staging, staging and decode buffers) exceed this machine's RAM: budgets
    given larger than the machine would end the run by swapping or an out-of-memory kill."""
    need, total = host_total(p), host_memory_total()
    if need > total:
        raise BudgetError(f"Expected budgets whose plan fits in this machine's RAM "
                          f"({format_bytes(total)}). Got a plan holding {format_bytes(need)} "
                          f"of host memory (memory={format_bytes(p.device_budget)}, "
                          f"host_memory={format_bytes(p.host_budget)}); give smaller "
                          f"budgets, or none for the defaults.")


def _check_array_result(p: Plan, itemsize: int) -> None:
    """out=None returns C as a NumPy array (``itemsize`` bytes an element): it must fit in the
    memory available now."""
    need, free = p.m * p.n * itemsize, host_memory_available()
    if need > free:
        raise OutputTooLarge(f"Expected C to fit in memory for out=None (the result is a NumPy "
                             f"array). Got C of {format_bytes(need)} with {format_bytes(free)} "
                             f"available; write it to a file instead (out='c.h5:/C').")


def check_callbacks(progress, profile, out) -> None:
    """OptionError for a ``progress`` that cannot be called or a ``profile`` that is neither
    off, True, a path prefix (a file name in an existing folder) nor a Profile, before
    anything is opened (a run that failed at its first tile or after its last would leave
    an output)."""
    if progress is not None and (not callable(progress) or not _takes_one(progress)):
        raise OptionError(f"Expected progress as a callable taking a Progress, or None. "
                          f"Got {progress!r}.")
    if profile is None or profile is False or isinstance(profile, Profile):
        return
    if not isinstance(profile, (bool, str, os.PathLike)):
        raise OptionError(f"Expected profile as True, a path prefix or a Profile. "
                          f"Got {profile!r}.")
    prefix = profile_prefix(profile, out)
    if not os.path.basename(prefix):  # "" or "dir/": files named ".trace.json" and ".png"
        raise OptionError(f"Expected profile as a path prefix ending in a file name (its files "
                          f"are PREFIX.trace.json and PREFIX.png). Got {prefix!r}.")
    folder = os.path.dirname(os.path.abspath(prefix))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise OptionError(f"Expected profile's files in a writable folder. Got "
                          f"{prefix!r}, in {folder!r}, which "
                          f"{'is not writable' if os.path.isdir(folder) else 'does not exist'}.")


def _takes_one(f) -> bool:
    """Whether ``f`` can be called with one argument (True where its signature is unknown)."""
    try:
        inspect.signature(f).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature to look at (some builtins)
        pass
    return True


def _start_profile(profile, be):
    """A Profile to record into (None when profiling is off); the backend times its own
    stages when it can."""
    if profile is None or profile is False:
        return None
    prof = profile if isinstance(profile, Profile) else Profile()
    if isinstance(be, Profiles):
        be.start_profile(prof)
    prof.begin()
    return prof


def _finish_profile(profile, prof: Profile, be, run: RunStats, out) -> RunStats:
    """Collect the device's intervals, write the files asked for, and return ``run`` with the
    busy times of the device-timed stages taken from the profile."""
    prof.finish()
    if isinstance(be, Profiles):
        be.stop_profile()
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


def _close_quietly(closing: list, be) -> None:
    """Close what was opened, in reverse; a failure to close an input loses nothing."""
    for x in reversed(closing):
        try:
            x.close()
        except Exception:
            pass
    be.close()
