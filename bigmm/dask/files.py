"""bigmm.dask.matmul_files: an HDF5 or Zarr job as C-tile tasks on a dask.distributed cluster.

Each tile task reopens A and B by path on its worker and runs bigmm's executor on its tile, in
sub-tiles (:func:`_sub_plan`). The calling process creates C (its storage reserved, so every
tile has fixed byte offsets) and hands each task where its tile lies in the file
(:meth:`bigmm.io.Sink.raw_region`); the worker's executor writes each sub-tile there while it
computes the next (:class:`bigmm.io.region.RegionSink`), the task returns only its statistics
once they are durable, with the tile's sample as written (:mod:`bigmm.io.tilesums`), and the
caller journals the tile with its sample. The caller alone touches HDF5 metadata and the
journal. Where C can only be written through h5py (an existing filtered dataset), tiles come
back to the caller, which writes them. A Zarr C bigmm creates is chunked by the tiles: a task writes its tile's chunk
files itself (:class:`bigmm.io.zarrsink.ZarrRegion`: each chunk into a temporary file, made
durable and renamed into place before the task returns), and the caller journals the tile.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from .. import io
from ..job import (check_operands, complete_stats, decoding, job_precision, job_record,
                   open_inputs, open_output, parse_io_threads, parse_scalar, resolve_backend,
                   resolve_budgets, resumed_schedule, operand_args)
from ..backends import get_backend
from ..checksum import parse_verify
from ..errors import BudgetError, Interrupted, OptionError
from ..executor import COMMIT_INTERVAL, STAGES, Progress, RunStats, execute
from ..io import tilesums
from ..io.region import RawRegion, RegionSink
from ..io.zarrsink import ZarrRegion, ZarrRegionSink
from ..planner import Plan, Tile, even_edge, make_plan
from ..precision import parse_precision
from ..units import dtype_name, numpy_dtype, parse_size
from ._common import RESOURCE
from ._common import distributed as _distributed
from ._seen import check_seen, input_seen, output_seen

#: RunStats checksum counts summed over the tile tasks.
_CHECKS = ("tiles_checked", "checksum_mismatches", "tiles_recomputed")
#: Tile tasks in flight per task slot: one running, one queued behind it.
WINDOW_PER_SLOT = 2
#: The grid of a fresh job has at least this many tiles per task slot, so that every slot
#: gets work; beyond that the planner's tiles stand. Each tile task pays a start (its inputs
#: opened, its first sub-tile waiting for the whole resident panel) and reads its panels anew,
#: so splitting further costs time: measured on 2 x H200, n = 32768 float32, two GPUs took
#: 0.96 s with one 32768 x 16384 tile each and 1.22 s with two 16384 x 16384 tiles each.
TILES_PER_SLOT = 1
#: After an error or an interrupt, how long to wait for the tasks in flight to finish.
DRAIN_SECONDS = 600.0
#: A tile task computes its tile in about this many sub-tiles, each written into C's file while
#: the next is computed: only the last one's write is not overlapped.
SUB_TILES = 8
#: Sub-tile edges are multiples of this (the planner's alignment) where the tile is that large.
SUB_ALIGN = 256


@dataclass(frozen=True)
class _TileJob:
    """What every tile task of one job needs (small: paths and numbers, no data)."""

    a: str
    b: str
    old_c: str | None  # the original C dataset when beta != 0
    k: int
    dtype: str
    trans_a: bool
    trans_b: bool
    tile: tuple[int, int, int]
    alpha: float
    beta: float
    backend: str
    kernel: str | None
    device_budget: int
    host_budget: int
    io_threads: int | None
    verify: str | None = None  # "checksum": each task checks its tile (bigmm.checksum)
    out_dtype: str | None = None  # C's dtype (None: the operands')
    precision: str | None = None  # of float32 products (None: the default)
    spans: int = 0  # of each tile's sample for the journal (tilesums; 0: none taken)
    seen: tuple = ()  # A, B and C's file as the caller sees them (_seen.Seen): checked first


class _Region(io.Source):
    """Rows [r0, r1) and columns [c0, c1) of a Source, as a Source."""

    def __init__(self, src: io.Source, r0: int, r1: int, c0: int, c1: int):
        self.src, self.r0, self.c0 = src, r0, c0
        self.shape, self.dtype = (r1 - r0, c1 - c0), src.dtype
        self.label = f"{src.label} rows {r0}:{r1}, columns {c0}:{c1}"
        self.layout = src.layout
        def aligned(ch):  # the source's chunks, where the region starts on their edges
            return ch if ch and r0 % ch[0] == 0 and c0 % ch[1] == 0 else None

        self.chunks, self._panel_chunks = aligned(src.chunks), aligned(src.panel_chunks)

    @property
    def panel_chunks(self) -> tuple[int, int] | None:
        return self._panel_chunks

    @property
    def decode_bytes(self) -> int:
        return self.src.decode_bytes

    @property
    def decode_threads(self) -> int | None:
        return self.src.decode_threads

    def limit_decoders(self, n: int) -> None:
        self.src.limit_decoders(n)

    def decode_chunk(self, ci, cj, stored, data) -> bool:  # (chunks: only where aligned)
        cr, cc = self.chunks
        return self.src.decode_chunk(ci + self.r0 // cr, cj + self.c0 // cc, stored, data)

    def stored_files(self) -> tuple:  # the whole source's: a fair sample of the region's
        return self.src.stored_files()

    def read(self, r0, r1, c0, c1, out) -> None:
        self.src.read(self.r0 + r0, self.r0 + r1, self.c0 + c0, self.c0 + c1, out)


def _split(dim: int, parts: int, unit: int) -> int:
    """The sub-tile edge that splits ``dim`` into about ``parts``: the planner's even edge in
    whole ``unit``s, or in dim // parts where ``dim`` is shorter than parts units."""
    return even_edge(dim, parts, max(1, min(unit, dim // parts)))


def _edge(chunks, axis: int, trans: bool) -> int:
    """op(X)'s chunk edge along ``axis`` (0: rows, 1: columns), else SUB_ALIGN."""
    if not chunks:
        return SUB_ALIGN
    return chunks[1 - axis] if trans else chunks[axis]


def _sub_plan(job: _TileJob, shape: tuple[int, int], staging: bool, a_chunks=None,
              b_chunks=None, decoded=None) -> Plan:
    """The plan one tile task runs: its C tile of ``shape`` in about SUB_TILES sub-tiles, so
    that the executor's writer writes each into C's file while the next is computed.

    The sub-tiles share one operand panel, read once and kept on the device: whole rows of the
    tile ('resident-b': the tile's B column panel stays; each sub-tile is one byte range per
    stored block of C) where that fits the task's budgets, else whole columns ('resident-a':
    A's row panel stays), else the tile as one sub-tile (stream, nothing overlapped). Sub-tile
    edges are multiples of the operand's chunk edge or SUB_ALIGN (``a_chunks``, ``b_chunks``:
    the stored chunks of the task's A and B regions). K is whole where that fits the budgets
    (one gemm per sub-tile; a sub-tile's operand panel spans whole rows of its matrix, one
    contiguous byte range where it is stored row-major and K is its width), else in the job's
    K panels. ``decoded``: the decode buffers of compressed inputs (:func:`bigmm.job.decoding`).
    """
    m, n = shape
    args = dict(trans_a=job.trans_a, trans_b=job.trans_b, reads_c=job.beta != 0,
                device_budget=job.device_budget,
                host_budget=job.host_budget if staging else job.device_budget, staging=staging,
                decoding=decoded)
    rows = _split(m, SUB_TILES, _edge(a_chunks, 0, job.trans_a))
    cols = _split(n, SUB_TILES, _edge(b_chunks, 1, job.trans_b))
    for bk in dict.fromkeys((job.k, job.tile[2])):
        for tile, order in (((rows, n, bk), "resident-b"), ((m, cols, bk), "resident-a")):
            if tile[:2] == (m, n):
                continue
            try:
                return make_plan(m, n, job.k, job.dtype, **args, tile=tile, order=order)
            except BudgetError:
                continue
    return make_plan(m, n, job.k, job.dtype, **args, tile=(m, n, job.tile[2]), order="stream")


def _tile_task(job: _TileJob, t: Tile, where: RawRegion | ZarrRegion | None = None,
               old=None):
    """On a worker: C[t] from A's row panel and B's column panel, read from the files here.

    With ``where`` (C[t]'s place in C's file), the executor writes C[t]'s sub-tiles there as
    they finish (a RegionSink), and this returns (t, None, stats, sample) once they are all
    durable, ``sample`` C[t]'s as written (:class:`.tilesums.Sampler`; None where
    ``job.spans`` is 0). Without, it computes C[t] into an array and returns
    (t, C[t], stats, None) for the caller to write and sample. Old C (beta != 0) is read per
    sub-tile from ``job.old_c`` here, or from ``old`` where the caller holds C's file open in
    h5py and sends it.
    """
    check_seen(job.seen)  # before anything is read or written
    be = resolve_backend(job.backend, job.kernel, job.precision)  # buffers live until close()
    k, dt = job.k, numpy_dtype(job.out_dtype or job.dtype)
    opened: list = []
    c = sampler = None
    try:
        A, B = open_inputs(job.a, job.b, opened, be)
        a = _Region(A, 0, k, t.r0, t.r1) if job.trans_a else _Region(A, t.r0, t.r1, 0, k)
        b = _Region(B, t.c0, t.c1, 0, k) if job.trans_b else _Region(B, 0, k, t.c0, t.c1)
        sub = _sub_plan(job, t.shape, bool(be.staging), a.panel_chunks, b.panel_chunks,
                        decoding(a, b, False, parse_io_threads(job.io_threads)))
        prior = None  # old C[t] as a Source, for beta != 0
        if old is not None:
            prior = io.open_input(old, name="old C")
        elif job.old_c is not None:
            C = io.open_input(job.old_c, name="C")
            opened.append(C)
            prior = _Region(C, t.r0, t.r1, t.c0, t.c1)
        if where is not None:
            if job.spans:
                sampler = tilesums.Sampler((t.r0, t.r1, t.c0, t.c1), dt, job.spans)
            sink = (ZarrRegionSink if isinstance(where, ZarrRegion) else RegionSink)(
                where, prior, sampler)
            opened.append(sink)
        else:
            c = np.empty(t.shape, dt)
            if prior is not None:
                prior.read(0, t.shape[0], 0, t.shape[1], c)
            sink = io.open_output(c, shape=t.shape, dtype=dt, inputs=[], job={})
        stats = execute(sub, a, b, sink, be, alpha=job.alpha, beta=job.beta,
                        io_threads=parse_io_threads(job.io_threads), verify=job.verify)
    finally:
        for x in reversed(opened):
            x.close()
        be.close()
    return t, c, stats, sampler.sample() if sampler is not None else None


@dataclass(frozen=True)
class _Budgets:
    device: int
    host: int
    staging: bool
    backend: str  # name the workers resolved ("numpy", "cupy"); "mixed" if they differ


def _worker_budget(backend: str, memory, host_memory, dask_worker=None) -> tuple:
    """On a worker: (backend name, staging, device budget, host budget) for one bigmm task.

    Without explicit sizes: the shares ``bigmm.matmul`` uses, of what the backend reports and
    of this worker's dask memory limit (several workers may share a host's RAM).
    """
    be = get_backend(backend)
    try:
        limit = getattr(getattr(dask_worker, "memory_manager", None), "memory_limit", None)
        device, host = resolve_budgets(be, memory, host_memory, limit=limit)
        return be.name, bool(be.staging), device, host
    finally:
        be.close()


def _cluster_budgets(client, backend, memory, host_memory) -> _Budgets:
    """The smallest budgets over the cluster's workers, resolved on the workers themselves."""
    got = client.run(_worker_budget, backend, memory, host_memory)
    if not got:
        raise OptionError("Expected a dask cluster with at least one worker. Got none.")
    names = {v[0] for v in got.values()}
    return _Budgets(device=min(v[2] for v in got.values()), host=min(v[3] for v in got.values()),
                    staging=any(v[1] for v in got.values()),
                    backend=names.pop() if len(names) == 1 else "mixed")


def _slots(client) -> tuple[int, bool]:
    """(bigmm tasks the cluster runs at once, whether every worker has the RESOURCE)."""
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    tagged = bool(workers) and all(RESOURCE in (w.get("resources") or {}) for w in workers)
    if tagged:
        return max(1, int(sum(w["resources"][RESOURCE] for w in workers))), True
    return max(1, sum(int(w.get("nthreads", 1)) for w in workers)), False


def _grid(plan: Plan, slots: int) -> Plan:
    """The plan for a fresh job, with at least TILES_PER_SLOT tiles per slot where possible.

    Tiles are independent tasks here, so the grid always uses the stream order; a grid too
    coarse for the cluster is re-planned under a smaller budget (the planner keeps choosing
    the tile shapes and their alignment).
    """
    target = TILES_PER_SLOT * slots
    p = plan
    budget, host = plan.device_budget, plan.host_budget
    while p.n_tiles < target:
        budget, host = budget // 2, host // 2
        try:
            q = _replan(plan, device_budget=budget, host_budget=host)
        except BudgetError:
            break
        if (q.bm, q.bn) == (p.bm, p.bn) and q.n_tiles == p.n_tiles and q.bk == p.bk:
            continue
        p = q
    return p


def _replan(p: Plan, **changes) -> Plan:
    args = dict(trans_a=p.trans_a, trans_b=p.trans_b, reads_c=p.reads_c,
                device_budget=p.device_budget, host_budget=p.host_budget, staging=p.staging,
                a_chunks=p.a_chunks, b_chunks=p.b_chunks, order="stream", a_dtype=p.a_dtype,
                b_dtype=p.b_dtype, decoding=p.decoding)
    args.update(changes)
    return make_plan(p.m, p.n, p.k, p.dtype, **args)


def _spec_path(x, name: str) -> str:
    """The operand as an absolute spec ('path:/dataset', 'store.zarr[:/array]') that any
    worker can reopen."""
    import h5py

    from ..io import zarrsource

    if isinstance(x, h5py.Dataset):
        return f"{os.path.abspath(x.file.filename)}:{x.name}"
    if zarrsource.is_zarr_array(x) and zarrsource.spec_of(x) is not None:
        return str(zarrsource.spec_of(x))
    if isinstance(x, os.PathLike):
        x = os.fspath(x)
    if not isinstance(x, (str, io.Spec)):
        raise OptionError(f"Expected 'file.h5:/dataset', 'store.zarr[:/array]', an h5py.Dataset "
                          f"or a zarr.Array in a local store for {name} (tasks reopen files by "
                          f"path; use bigmm.dask.matmul for arrays). Got {type(x).__name__}.")
    return str(_absolute(io.parse_spec(x)))


def _absolute(s: io.Spec) -> io.Spec:
    return replace(s, path=os.path.abspath(s.path))


def _get_client(client):
    distributed = _distributed()
    if client is not None:
        if not isinstance(client, distributed.Client):
            raise OptionError(f"Expected a dask.distributed Client as client (or None: the "
                              f"default client). Got {type(client).__name__}.")
        return client
    try:
        return distributed.get_client()
    except ValueError:
        raise OptionError("Expected a dask.distributed Client (client=...) or a default client. "
                          "Got none; start one, or use bigmm.dask.local_cluster().") from None


def matmul_files(a, b, out, *, client=None, alpha: float = 1.0, beta: float = 0.0,
                 trans_a: bool = False, trans_b: bool = False, memory=None, host_memory=None,
                 backend: str = "auto", progress: Callable[[Progress], None] | None = None,
                 resume: bool = False, overwrite: bool = False, io_threads: int | None = None,
                 stats: bool = False, kernel: str | None = None, verify: str | None = None,
                 out_dtype=None, precision: str | None = None):
    """C = alpha * op(A) @ op(B) + beta * C on HDF5 files or Zarr stores, as C-tile tasks on a
    dask cluster.

    ``a``, ``b``, ``out``: "file.h5:/dataset" or "store.zarr[:/array]" specs (or h5py
    Datasets and zarr Arrays in local stores for a and b) on a filesystem this process and
    every worker see; a Zarr C is written chunk file by chunk file by the workers. ``client``: a ``distributed.Client``
    (default: the current one). Other arguments as in :func:`bigmm.matmul`; ``memory`` and
    ``host_memory`` are per task (default: the shares ``bigmm.matmul`` uses, of the smallest
    worker's backend memory and dask memory limit).

    The C tiles come from bigmm's planner (stream order; a grid too coarse for the cluster is
    split). Each tile is one task: on its worker it reopens A and B by path, reads its own
    panels once and runs bigmm's executor on the tile in about SUB_TILES sub-tiles under the
    budget (memory per task: the sub-plan's device and host bytes). This process creates C;
    each worker's executor writes the sub-tiles into C's file at their byte offsets as they
    finish, overlapping the next one's compute, and syncs them before the task returns (so
    ``out`` must be writable by every worker at the same path), and this process journals the
    tile once the task reports it, so ``resume=True`` skips every tile an earlier run (on any
    cluster, or ``bigmm.matmul``) finished. Only this process touches HDF5 metadata. An
    existing C that must be written through h5py (filtered) gets its tiles back here instead.
    A lost worker's tiles are recomputed by dask. At most WINDOW_PER_SLOT tasks per task slot
    are in flight.

    ``kernel`` and ``precision``: the GPU kernel and the arithmetic of float32 products, as
    in :func:`bigmm.matmul`. Returns the output spec, or
    (spec, RunStats) with ``stats=True`` (busy times summed over the tasks; ``write_busy``
    adds this process's writing and journaling).
    """
    result, _, run, _ = run_files(a, b, out, client=client, alpha=alpha, beta=beta,
                                   trans_a=trans_a, trans_b=trans_b, memory=memory,
                                   host_memory=host_memory, backend=backend, kernel=kernel,
                                   progress=progress, resume=resume, overwrite=overwrite,
                                   io_threads=io_threads, verify=verify, out_dtype=out_dtype,
                                   precision=precision)
    return (result, run) if stats else result


def run_files(a, b, out, *, client, alpha, beta, trans_a, trans_b, memory, host_memory,
               backend, progress, resume, overwrite, io_threads, kernel=None, verify=None,
               out_dtype=None, precision=None):
    """:func:`matmul_files`, returning (output spec, Plan, RunStats, the workers' backend
    name): what ``bigmm multiply --workers/--scheduler`` reports."""
    from ..api import check_callbacks

    check_callbacks(progress, None, out)  # a progress that cannot be called: before any task
    client = _get_client(client)
    if io_threads is not None:
        parse_io_threads(io_threads)
    for budget in (memory, host_memory):  # a bad size is one error here, not the workers'
        if budget is not None:
            parse_size(budget)
    if out is None:
        raise OptionError("Expected an output spec 'file.h5:/C' or 'store.zarr[:/C]' for a job "
                          "on a cluster. Got out=None.")
    a_path, b_path = _spec_path(a, "A"), _spec_path(b, "B")
    out_spec = io.parse_spec(os.fspath(out) if isinstance(out, os.PathLike) else out)
    budgets = _cluster_budgets(client, backend, memory, host_memory)
    slots, tagged = _slots(client)
    closing: list = []
    try:
        A = io.open_input(a, name="A")
        closing.append(A)
        B = io.open_input(b, name="B")
        closing.append(B)
        m, k, n, dtype = check_operands(A, B, trans_a, trans_b)
        chosen = job_precision(kernel, precision, dtype)
        alpha, beta = parse_scalar(alpha, "alpha"), parse_scalar(beta, "beta")
        args = dict(trans_a=bool(trans_a), trans_b=bool(trans_b), reads_c=beta != 0,
                    device_budget=budgets.device, host_budget=budgets.host,
                    staging=budgets.staging,
                    **operand_args(A, B, False, parse_io_threads(io_threads)))
        fixed = (resumed_schedule(out, m, n, k, dtype, alpha, beta, args, chosen) if resume
                 else {})
        if fixed:
            plan = make_plan(m, n, k, dtype, **args, **fixed)
        else:
            plan = _grid(make_plan(m, n, k, dtype, **args, order="stream"), slots)
        sink = open_output(out, plan, job_record(plan, alpha, beta, chosen), A, B,
                           overwrite=overwrite, resume=resume, out_dtype=out_dtype)
        closing.append(sink)
        if dtype_name(sink.dtype) != plan.c_dtype:  # C kept in another dtype: its bytes
            plan = replace(plan, out_dtype=dtype_name(sink.dtype))
        if sink.complete:  # resumed after it had finished: nothing to do
            return sink.result, plan, complete_stats(plan), budgets.backend
        old_c = str(_absolute(out_spec)) if plan.reads_c else None
        tj = _TileJob(a_path, b_path, old_c, k, dtype, plan.trans_a, plan.trans_b,
                      (plan.bm, plan.bn, plan.bk), alpha, beta, backend, kernel,
                      budgets.device, budgets.host, io_threads, parse_verify(verify),
                      sink.dtype.name, parse_precision(precision),
                      tilesums.per_tile(plan.n_tiles) if sink.takes_samples else 0,
                      _inputs_seen(a_path, b_path, out_spec))
        run = _Tiles(client, tj, plan, sink, progress, slots, tagged).run()
        sink.finish()
        result = sink.result
        closing.remove(sink)
        sink.close()
    finally:
        for x in reversed(closing):
            with contextlib.suppress(Exception):
                x.close()
    return result, plan, run, budgets.backend


def _inputs_seen(a_path: str, b_path: str, out_spec) -> tuple:
    out_file = None if out_spec.zarr else out_spec.path
    return tuple(x for x in (input_seen("A", a_path, out_file), input_seen("B", b_path, out_file))
                 if x is not None)


class _Tiles:
    """Submits the tile tasks in a bounded window and journals the tiles as they finish."""

    def __init__(self, client, job: _TileJob, plan: Plan, sink, progress, slots: int,
                 tagged: bool):
        self.client, self.job, self.plan, self.sink = client, job, plan, sink
        self.progress = progress
        self.window = WINDOW_PER_SLOT * slots
        self.resources = {RESOURCE: 1} if tagged else None
        done = frozenset(sink.done)
        self.todo = [t for t in plan.tiles() if t.index not in done]
        self.skipped = plan.n_tiles - len(self.todo)
        self.written: list[tuple[int, int]] = []
        self.pending: list[tuple[int, int]] = []
        self.samples: list = []  # beside pending: each tile's sample as written, or None
        self.totals = dict.fromkeys(("flops", "bytes_read", "bytes_written", *_CHECKS), 0)
        self.busy = dict.fromkeys(STAGES, 0.0)
        self.tag = uuid.uuid4().hex[:12]

    def _submit(self, ac, it) -> None:
        t = next(it, None)
        if t is not None:
            where = self.sink.raw_region(t.r0, t.r1, t.c0, t.c1)
            if where is not None and not any(s.what == "C" for s in self.job.seen):
                # the file (Zarr folder) every task writes into: each checks it sees this one
                place = where.folder if isinstance(where, ZarrRegion) else where.path
                self.job = replace(self.job, seen=self.job.seen + (output_seen(place),))
            old = None
            if where is None and self.job.old_c is not None:
                # C's file is open in h5py for writing here, so no worker may open it: old C
                # travels with the task.
                old = np.empty(t.shape, self.sink.dtype)
                self.sink.read(t.r0, t.r1, t.c0, t.c1, old)
            ac.add(self.client.submit(_tile_task, self.job, t, where, old, pure=False,
                                      key=f"bigmm-tile-{t.i}-{t.j}-{self.tag}",
                                      resources=self.resources))

    def run(self) -> RunStats:
        from distributed import as_completed

        self.t0 = time.perf_counter()
        ac = as_completed()
        it = iter(self.todo)
        for _ in range(self.window):
            self._submit(ac, it)
        last = time.perf_counter()
        try:
            for fut in ac:
                t, c, st, sample = fut.result()
                fut.release()
                self._landed(t, c, st, sample)
                if time.perf_counter() - last >= COMMIT_INTERVAL:
                    self._commit()
                    last = time.perf_counter()
                self._report()
                self._submit(ac, it)
            self._commit()
        except BaseException as e:
            self._drain(list(ac.futures))
            if isinstance(e, KeyboardInterrupt) and not isinstance(e, Interrupted):
                raise Interrupted(
                    f"Interrupted after {len(self.written)} of {len(self.todo)} tiles; the "
                    f"output {self.sink.label} is resumable (resume=True).") from None
            raise
        return self._stats()

    def _drain(self, futures: list) -> None:
        """After an error or an interrupt: wait for the tasks in flight, journal the tiles that
        landed, cancel the rest. A running task cannot be stopped, and returning while one is
        still writing into C's file would leave a writer behind (into a new output a later run
        creates there, say); a second interrupt stops the wait."""
        from distributed import wait

        with contextlib.suppress(BaseException):
            wait(futures, timeout=DRAIN_SECONDS)
        for f in futures:
            if f.status == "finished":
                with contextlib.suppress(Exception):
                    self._landed(*f.result())
            f.cancel()
        with contextlib.suppress(Exception):
            self._commit()

    def _landed(self, t: Tile, c, st: RunStats, sample=None) -> None:
        """A finished task: its tile is in C's file (``sample`` its sample as the worker wrote
        it), or it is ``c`` for this process to write (and sample)."""
        if c is not None:
            t0 = time.perf_counter()
            self.sink.write(t.r0, t.r1, t.c0, t.c1, c)
            self.busy["write"] += time.perf_counter() - t0
            if self.job.spans:
                sample = tilesums.take((t.r0, t.r1, t.c0, t.c1), c, self.sink.dtype,
                                       self.job.spans)
        self.written.append(t.index)
        self.pending.append(t.index)
        self.samples.append(sample)
        self.totals["flops"] += st.flops
        for key in _CHECKS:
            self.totals[key] += getattr(st, key)
        self.totals["bytes_read"] += st.bytes_read
        self.totals["bytes_written"] += t.shape[0] * t.shape[1] * self.sink.dtype.itemsize
        for s in STAGES:
            self.busy[s] += getattr(st, f"{s}_busy")

    def _commit(self) -> None:
        if self.pending:
            t0 = time.perf_counter()
            self.sink.commit(list(self.pending), list(self.samples))
            self.busy["write"] += time.perf_counter() - t0
            self.pending.clear()
            self.samples.clear()

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(Progress(self.skipped + len(self.written), self.plan.n_tiles,
                                   self.skipped, self.totals["bytes_read"],
                                   self.totals["bytes_written"], self.totals["flops"],
                                   time.perf_counter() - self.t0))

    def _stats(self) -> RunStats:
        return RunStats(time.perf_counter() - self.t0, self.totals["flops"],
                        self.totals["bytes_read"], self.totals["bytes_written"],
                        len(self.written), self.skipped, self.plan.n_tiles,
                        **{f"{s}_busy": v for s, v in self.busy.items()},
                        **{key: self.totals[key] for key in _CHECKS},
                        notes=self.sink.redone_note(), tiles_redone=len(self.sink.redone))
