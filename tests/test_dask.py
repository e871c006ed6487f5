"""bigmm on dask: dask arrays in and out (from Zarr too), HDF5 and Zarr jobs on a real local
cluster, faults, resume, CLI.

Every test that computes runs on a LocalCluster of two worker processes (one thread each)
started here; the fault test starts its own and kills one of its workers mid-job. HDF5 jobs
check where C's tiles were written: by the workers, into C's file (the task results carry no
data), or, for an output only h5py can write, by this process.
"""

from __future__ import annotations

import json
import os
import signal
import time

import h5py
import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import bigmm  # noqa: E402
import bigmm.dask as bd  # noqa: E402
from bigmm import cli  # noqa: E402
from bigmm.dask import files as dask_files  # noqa: E402
from bigmm.dask.array import _k_pieces, _operand, _rechunk_to_budget  # noqa: E402
from bigmm.io import filesink as sink_mod  # noqa: E402
from bigmm.errors import (BackendUnavailable, BudgetError, DtypeError, Interrupted,  # noqa: E402
                          OptionError, OutputExistsError, OutputOverflowError, ShapeError,
                          SizeParseError)
from bigmm.io.journal import journal_path, parse_journal  # noqa: E402
from bigmm.io.spec import parse_spec  # noqa: E402
from bigmm.planner import make_plan  # noqa: E402
from bigmm.testing import (gpu_available, random_matrix, reference_gemm,  # noqa: E402
                           relative_error, tolerance)

WORKER_MEMORY = "1GiB"


@pytest.fixture(scope="module")
def client():
    with bd.local_cluster(2, backend="numpy", memory_limit=WORKER_MEMORY) as c:
        yield c


# ----- dask arrays ----------------------------------------------------------------------------

def _stored(shape, trans):
    return shape[::-1] if trans else shape


ARRAY_CASES = [
    # (m, k, n, A chunks, B chunks, trans_a, trans_b, dtype, alpha, memory)
    # uneven chunks on every axis; A's and B's K chunks disagree (refined, not concatenated)
    (37, 53, 29, ((10, 27), (5, 20, 28)), ((7, 46), (13, 16)), False, False, "float64", 1.0, None),
    # one block each: one task per output block, one K piece
    (31, 17, 23, ((31,), (17,)), ((17,), (23,)), False, False, "float64", 1.0, None),
    # regular chunks that divide nothing, alpha scales every K piece
    (41, 47, 33, (19, 17), (17, 13), False, False, "float64", -2.5, None),
    # one output row and one output column (1xN, Nx1 products)
    (1, 41, 19, (1, 16), (13, 8), False, False, "float64", 1.0, None),
    (23, 41, 1, (9, 14), (20, 1), False, False, "float64", 1.0, None),
    # depth 1, and K chunks of size 1 against one K chunk
    (13, 1, 11, (5, 1), (1, 4), False, False, "float64", 1.0, None),
    (13, 4, 11, (7, 1), (4, 5), False, False, "float64", 1.0, None),
    # transposed operands (stored K x M and N x K), uneven chunks
    (29, 37, 31, ((20, 17), (3, 26)), (12, 16), True, False, "float64", 1.0, None),
    (29, 37, 31, (10, 19), ((30, 1), (11, 26)), False, True, "float64", 1.0, None),
    (29, 37, 31, (15, 12), (17, 14), True, True, "float64", 0.5, None),
    # float32
    (45, 70, 38, (16, 23), (31, 20), False, False, "float32", 1.0, None),
    # a budget: the planner's tiles replace the chunks; each task fits in it
    (90, 120, 80, (25, 33), (30, 17), False, False, "float64", 1.0, 48 * 1024),
    (90, 120, 80, (33, 25), (17, 30), True, True, "float32", 1.0, "40KiB"),
]


@pytest.mark.parametrize("m,k,n,ach,bch,ta,tb,dtype,alpha,memory", ARRAY_CASES)
def test_matmul_matches_reference_and_dask(client, m, k, n, ach, bch, ta, tb, dtype, alpha,
                                            memory):
    a = random_matrix(_stored((m, k), ta), dtype, seed=m + k)
    b = random_matrix(_stored((k, n), tb), dtype, seed=k + n + 1)
    A, B = da.from_array(a, chunks=ach), da.from_array(b, chunks=bch)
    C = bd.matmul(A, B, alpha=alpha, trans_a=ta, trans_b=tb, memory=memory)
    assert C.shape == (m, n) and C.dtype == np.dtype(dtype)
    assert isinstance(C._meta, np.ndarray)
    got = client.compute(C).result()  # on the cluster
    ref = reference_gemm(a, b, alpha=alpha, trans_a=ta, trans_b=tb)
    assert got.shape == (m, n) and got.dtype == np.dtype(dtype)
    assert relative_error(got, ref) <= tolerance(dtype, k)
    theirs = alpha * ((A.T if ta else A) @ (B.T if tb else B))  # dask.array's own matmul
    assert relative_error(got, theirs.compute(scheduler="threads")) <= tolerance(dtype, k)
    if memory is None:  # the output blocks follow the inputs' chunks
        assert C.chunks == ((A.chunks[1] if ta else A.chunks[0]),
                            (B.chunks[0] if tb else B.chunks[1]))


def test_matmul_task_holds_one_block_of_each():
    """No task concatenates K blocks, also after dask's graph optimisation: each depends on at
    most the partial C, one A block and one B block; block (i, j) is a chain of one task per
    K piece."""
    from dask.core import get_dependencies

    A = da.from_array(random_matrix((40, 50), np.float64), chunks=((15, 25), (10, 30, 10)))
    B = da.from_array(random_matrix((50, 30), np.float64, seed=1), chunks=((20, 30), (30,)))
    C = bd.matmul(A, B)
    pieces = len(_k_pieces(A.chunks[1], B.chunks[0]))
    assert pieces == 4  # edges 0, 10, 20, 40, 50
    graph = dict(C.__dask_optimize__(C.__dask_graph__(), C.__dask_keys__()))
    ours = {k: get_dependencies(graph, k) for k in graph if "bigmm" in str(k[0])}
    assert len(ours) == C.numblocks[0] * C.numblocks[1] * pieces
    for deps in ours.values():
        assert len(deps) <= 3
        assert sum(d[0] == A.name for d in deps) == 1 and sum(d[0] == B.name for d in deps) == 1


BUDGETS = [
    # (memory, trans_a, trans_b)
    # small: many tiles and K pieces
    (24 * 1024, False, False),
    # middle, both operands stored transposed
    (100 * 1024, True, True),
    # large: fewer, larger blocks than the inputs' own chunks
    (1 << 20, False, True),
]


@pytest.mark.parametrize("memory,ta,tb", BUDGETS)
def test_matmul_budget_bounds_each_task(client, memory, ta, tb):
    m, k, n = 110, 150, 95
    a = random_matrix(_stored((m, k), ta), np.float64)
    b = random_matrix(_stored((k, n), tb), np.float64, seed=2)
    A, B = da.from_array(a, chunks=(17, 19)), da.from_array(b, chunks=(23, 11))
    A2, B2 = _rechunk_to_budget(A, B, m, n, k, np.dtype(np.float64), ta, tb, memory)
    bm, bk = max(A2.chunks[1 if ta else 0]), max(A2.chunks[0 if ta else 1])
    bk2, bn = max(B2.chunks[1 if tb else 0]), max(B2.chunks[0 if tb else 1])
    assert bk == bk2
    assert 8 * (2 * bm * bn + 2 * bm * bk + 2 * bk * bn) <= memory  # the docstring's bound
    C = bd.matmul(A, B, trans_a=ta, trans_b=tb, memory=memory)
    assert C.chunks == (A2.chunks[1 if ta else 0], B2.chunks[0 if tb else 1])
    got = client.compute(C).result()
    assert relative_error(got, reference_gemm(a, b, trans_a=ta, trans_b=tb)) <= \
        tolerance(np.float64, k)


def test_matmul_odd_blocks(client):
    """Fortran-ordered and strided blocks, mixed float32/float64, zero depth."""
    a = random_matrix((30, 44), np.float64)
    b = random_matrix((44, 25), np.float32, seed=3)
    A = da.from_array(np.asfortranarray(a), chunks=(30, 13))  # F-contiguous blocks
    B = da.from_array(b, chunks=(5, 6))[:, ::-1]  # strided (reversed) blocks
    C = bd.matmul(A, B)
    assert C.dtype == np.float64  # mixed inputs in float64
    assert relative_error(client.compute(C).result(), a @ b[:, ::-1].astype(np.float64)) <= \
        tolerance(np.float32, 44)
    Z = bd.matmul(da.zeros((6, 0), chunks=3), da.zeros((0, 4), chunks=2))
    assert np.array_equal(client.compute(Z).result(), np.zeros((6, 4)))


def test_operand_layouts():
    """Blocks reach the gemm C-contiguous: F-ordered ones as their transpose, others copied."""
    x = np.asfortranarray(random_matrix((6, 9), np.float64))
    y, t = _operand(x, None, 1, False)
    assert t is True and y.flags.c_contiguous and np.shares_memory(x, y)
    y, t = _operand(x, (2, 5), 1, False)
    assert t is True and np.array_equal(y.T, x[:, 2:5])
    z = random_matrix((6, 9), np.float64)[:, ::2]
    y, t = _operand(z, None, 0, False)
    assert t is False and y.flags.c_contiguous and np.array_equal(y, z)


ARRAY_ERRORS = [
    # (a, b, kwargs, error, message)
    # inner dimensions differ
    (np.ones((3, 4)), np.ones((5, 2)), {}, ShapeError, "4 != 5"),
    # 1-D operand
    (np.ones(4), np.ones((4, 2)), {}, ShapeError, "2-D"),
    # integer dtype
    (np.ones((3, 4), int), np.ones((4, 2)), {}, DtypeError, "bfloat16, float32, float64"),
    # out_dtype not among those of float64 operands
    (np.ones((3, 4)), np.ones((4, 2)), {"out_dtype": "float16"}, OptionError, "out_dtype"),
    # cupy backend for NumPy chunks
    (np.ones((3, 4)), np.ones((4, 2)), {"backend": "cupy"}, BackendUnavailable, "CuPy chunks"),
    # unknown backend name
    (np.ones((3, 4)), np.ones((4, 2)), {"backend": "tpu"}, BackendUnavailable, "one of"),
    # alpha that is not a number
    (np.ones((3, 4)), np.ones((4, 2)), {"alpha": "x"}, ValueError, "alpha"),
]


@pytest.mark.parametrize("a,b,kwargs,error,message", ARRAY_ERRORS)
def test_matmul_errors(a, b, kwargs, error, message):
    with pytest.raises(error, match=message):
        bd.matmul(da.from_array(a), da.from_array(b), **kwargs)


@pytest.mark.gpu
def test_matmul_cupy_chunks_keep_their_type():
    import cupy

    a, b = random_matrix((300, 500), np.float32), random_matrix((500, 200), np.float32, seed=1)
    A = da.from_array(cupy.asarray(a), chunks=(128, 96), asarray=False)
    B = da.from_array(cupy.asarray(b), chunks=(70, 128), asarray=False)
    C = bd.matmul(A, B)
    assert isinstance(C._meta, cupy.ndarray)
    got = C.compute(scheduler="sync")
    assert isinstance(got, cupy.ndarray)
    assert relative_error(cupy.asnumpy(got), reference_gemm(a, b)) <= tolerance(np.float32, 500)


def test_matmul_narrowed_past_the_output_dtype_raises():
    a, b = np.full((4, 4096), 200, np.float16), np.full((4096, 4), 200, np.float16)
    C = bd.matmul(da.from_array(a, chunks=(4, 1024)), da.from_array(b, chunks=(1024, 4)),
                  out_dtype="float16")
    with pytest.raises(OutputOverflowError, match="largest finite value 65504"):
        C.compute(scheduler="sync")


def test_matmul_alpha_zero_reads_neither_operand():
    a = random_matrix((40, 30), np.float32)
    a[3, 4] = np.nan
    C = bd.matmul(da.from_array(a, chunks=(16, 8)),
                  da.from_array(random_matrix((30, 20), np.float32, 1), chunks=(8, 16)),
                  alpha=0.0)
    assert np.array_equal(C.compute(scheduler="sync"), np.zeros((40, 20), np.float32))


# ----- HDF5 jobs on the cluster ---------------------------------------------------------------

def _h5(path, name, array, layout="contiguous"):
    kw = {"contiguous": {}, "chunked": {"chunks": (13, 17)},
          "compressed": {"chunks": (16, 16), "compression": "gzip"}}[layout]
    with h5py.File(path, "a") as f:
        f.create_dataset(name, data=array, **kw)
    return f"{path}:/{name}"


def _read(spec):
    s = parse_spec(spec)
    with h5py.File(s.path, "r") as f:
        d = f[s.dataset]
        return d[...], dict(d.attrs)


@pytest.fixture
def landed(monkeypatch):
    """What came back to this process per finished tile (None: the worker wrote it into C's
    file), the sub-tiles of each tile's task, and how many regions this process wrote into C
    itself."""
    seen = {"data": [], "sub_tiles": [], "caller_writes": 0, "samples": []}
    real_landed, real_write = dask_files._Tiles._landed, sink_mod.FileSink.write

    def spy_landed(self, t, c, st, sample=None):
        seen["data"].append(c)
        seen["samples"].append(sample)
        assert st.tiles_done == st.tiles_total  # the task wrote every sub-tile
        seen["sub_tiles"].append(st.tiles_total)
        real_landed(self, t, c, st, sample)

    def spy_write(self, *args):
        seen["caller_writes"] += 1
        real_write(self, *args)

    monkeypatch.setattr(dask_files._Tiles, "_landed", spy_landed)
    monkeypatch.setattr(sink_mod.FileSink, "write", spy_write)
    return seen


def _written_on_workers(seen, tiles):
    assert len(seen["data"]) == tiles and all(c is None for c in seen["data"])
    assert seen["caller_writes"] == 0
    assert min(seen["sub_tiles"]) > 1  # each task wrote its tile in sub-tiles as they finished


FILE_CASES = [
    # (m, k, n, dtype, trans_a, trans_b, alpha, beta, layout, memory)
    # contiguous inputs, a budget that forces many tiles and K panels
    (97, 131, 83, "float64", False, False, 1.0, 0.0, "contiguous", "96KiB"),
    # chunked inputs with chunks that divide nothing, transposed A
    (75, 140, 66, "float32", True, False, 1.0, 0.0, "chunked", "64KiB"),
    # gzip-compressed inputs (h5py path on the workers), transposed B
    (64, 90, 71, "float64", False, True, 1.0, 0.0, "compressed", "80KiB"),
    # full GEMM: both transposed, beta != 0 reads the old C on the workers
    (59, 77, 48, "float64", True, True, -1.5, 0.75, "contiguous", "48KiB"),
    # a budget that holds the whole product: the grid is split for the two workers
    (61, 53, 47, "float64", False, False, 1.0, 0.0, "contiguous", "64MiB"),
]


@pytest.mark.parametrize("m,k,n,dtype,ta,tb,alpha,beta,layout,memory", FILE_CASES)
def test_files_on_cluster(client, tmp_path, landed, m, k, n, dtype, ta, tb, alpha, beta, layout,
                          memory):
    a = random_matrix(_stored((m, k), ta), dtype, seed=m)
    b = random_matrix(_stored((k, n), tb), dtype, seed=n)
    sa = _h5(tmp_path / "a.h5", "A", a, layout)
    sb = _h5(tmp_path / "b.h5", "B", b, layout)
    sc = f"{tmp_path / 'c.h5'}:/C"
    c0 = None
    if beta:
        c0 = random_matrix((m, n), dtype, seed=5)
        _h5(tmp_path / "c.h5", "C", c0)
    seen = []
    out, stats = bd.matmul_files(sa, sb, sc, client=client, alpha=alpha, beta=beta,
                                 trans_a=ta, trans_b=tb, memory=memory, progress=seen.append,
                                 stats=True)
    assert out == sc
    got, attrs = _read(sc)
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(got, ref) <= tolerance(dtype, k)
    assert attrs["bigmm_complete"]
    assert not os.path.exists(journal_path(parse_spec(sc)))
    # at least TILES_PER_SLOT tiles per worker (two workers)
    assert stats.tiles_done == stats.tiles_total >= 2 * dask_files.TILES_PER_SLOT
    assert stats.flops == 2 * m * n * k and stats.bytes_written == got.nbytes
    assert [p.tiles_done for p in seen] == list(range(1, stats.tiles_total + 1))
    _written_on_workers(landed, stats.tiles_total)


OUTPUT_CASES = [
    # (C's layout, beta, old C's layout, trans_a, trans_b)
    # contiguous C: each tile is rows of strided byte ranges
    ("contiguous", 0.0, None, False, False),
    # C chunked by the tiles: each tile one byte range
    ("tile-chunked", 0.0, None, False, False),
    # both operands stored transposed, C chunked by the tiles
    ("tile-chunked", 0.0, None, True, True),
    # beta != 0: workers read old C from C and write the partial dataset beside it in one file
    ("tile-chunked", -0.5, "contiguous", False, False),
    ("contiguous", 0.25, "contiguous", True, False),
    # beta != 0 on a gzip-compressed C: old C read through h5py on the workers, the new C
    # (created unfiltered) written raw by them
    ("contiguous", 2.0, "compressed", False, True),
    ("tile-chunked", 1.0, "compressed", False, False),
]


HALF_FILE_CASES = [
    # (A dtype, B dtype, out_dtype, C's dtype): the rules of bigmm.matmul on a cluster
    ("bfloat16", "bfloat16", None, "float32"),        # float32 accumulation, float32 C
    ("bfloat16", "bfloat16", "bfloat16", "bfloat16"),  # C in the operands' dtype when asked
    ("float32", "float64", None, "float64"),          # NumPy's result type
]


@pytest.mark.parametrize("da_,db_,out_dtype,dc", HALF_FILE_CASES)
def test_files_half_and_mixed_dtypes(client, tmp_path, da_, db_, out_dtype, dc):
    from bigmm.io.generate import generate
    from bigmm.verify import verify

    sa = generate(f"{tmp_path / 'a.h5'}:/A", (70, 90), dtype=da_, seed=1)
    sb = generate(f"{tmp_path / 'b.h5'}:/B", (90, 60), dtype=db_, layout="chunked",
                  chunks=(32, 32), seed=2)
    sc = f"{tmp_path / 'c.h5'}:/C"
    out = bd.matmul_files(sa, sb, sc, client=client, memory="48KiB", backend="numpy",
                          out_dtype=out_dtype)
    assert verify(sa, sb, out).passed
    with bigmm.io.open_input(out) as C:
        assert C.dtype.name == dc


@pytest.mark.parametrize("out_layout,beta,old_layout,ta,tb", OUTPUT_CASES)
def test_files_written_by_the_workers(client, tmp_path, monkeypatch, landed, out_layout, beta,
                                      old_layout, ta, tb):
    """Each task's executor writes its tile's sub-tiles into C's file as they finish (old C,
    for beta != 0, read per sub-tile on the worker); nothing comes back to this process."""
    m, k, n = 83, 57, 95
    if out_layout == "tile-chunked":  # chunk the small test output by its tiles too
        monkeypatch.setattr(sink_mod, "MIN_CHUNK_BYTES", 0)
    a = random_matrix(_stored((m, k), ta), np.float64, seed=41)
    b = random_matrix(_stored((k, n), tb), np.float64, seed=42)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    sc = f"{tmp_path / 'c.h5'}:/C"
    c0 = None
    if beta:
        c0 = random_matrix((m, n), np.float64, seed=43)
        _h5(tmp_path / "c.h5", "C", c0, old_layout)
    out, stats = bd.matmul_files(sa, sb, sc, client=client, alpha=1.5, beta=beta,
                                 trans_a=ta, trans_b=tb, memory="48KiB", backend="numpy",
                                 stats=True)
    got, attrs = _read(sc)
    ref = reference_gemm(a, b, alpha=1.5, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(got, ref) <= tolerance(np.float64, k) and attrs["bigmm_complete"]
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert sorted(f) == ["C"]  # the partial dataset took C's place
        chunks, compression = f["C"].chunks, f["C"].compression
    assert compression is None and (chunks is None) == (out_layout == "contiguous")
    _written_on_workers(landed, stats.tiles_total)


def test_files_verified_sub_tiles(client, tmp_path, landed):
    """verify="checksum": each task checks every sub-tile before its executor writes it."""
    m, k, n = 90, 64, 70
    a, b = random_matrix((m, k), np.float64, seed=61), random_matrix((k, n), np.float64, seed=62)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    sc = f"{tmp_path / 'c.h5'}:/C"
    _, stats = bd.matmul_files(sa, sb, sc, client=client, memory="64KiB", backend="numpy",
                               verify="checksum", stats=True)
    assert stats.tiles_checked == sum(landed["sub_tiles"]) > stats.tiles_total
    assert stats.checksum_mismatches == 0
    assert relative_error(_read(sc)[0], a @ b) <= tolerance(np.float64, k)
    _written_on_workers(landed, stats.tiles_total)


def _job(shape, k, budget, *, host=None, beta=0.0, bk=64, dtype="float32"):
    return dask_files._TileJob("a", "b", None, k, dtype, False, False, (*shape, bk), 1.0, beta,
                               "numpy", None, budget, host or budget, None)


@pytest.mark.parametrize("slots", [1, 2, 3, 8])  # one GPU, two, an odd count, many
def test_grid_gives_every_slot_a_tile(slots):
    """A job the planner covers with one tile is split until every task slot has a tile."""
    p = make_plan(3000, 2000, 1000, "float32", device_budget=1 << 30, host_budget=1 << 30,
                  staging=True, order="stream", tile=(3000, 2000, 1000))
    assert p.n_tiles == 1
    g = dask_files._grid(p, slots)
    assert g.n_tiles >= dask_files.TILES_PER_SLOT * slots
    assert (g.m, g.n, g.k) == (p.m, p.n, p.k) and g.order == "stream"
    if slots == 1:
        assert g is p  # nothing to split


MiB = 1 << 20
SUB_PLAN_CASES = [
    # (tile, k, device budget, staging, A chunks, B chunks, order, sub-tile (bm, bn), depth bk)
    # a large GPU tile: eight row sub-tiles of 2048 over whole K, B's column panel resident
    ((16384, 32768), 32768, 80 << 30, True, None, None, "resident-b", (2048, 32768), 32768),
    # rows that do not split evenly by 256: sub-tiles rounded up to 256
    ((3000, 2048), 4096, 1 << 30, True, None, None, "resident-b", (512, 2048), 4096),
    # A chunked by 96 rows: sub-tile rows are multiples of them
    ((1000, 512), 1024, 64 * MiB, False, (96, 128), None, "resident-b", (192, 512), 1024),
    # a budget too small for B's column panel, large enough for A's row panel: column
    # sub-tiles of 256
    ((512, 2048), 4096, 30 * MiB, False, None, None, "resident-a", (512, 256), 4096),
    # a tile smaller than eight aligned rows: eight unaligned row sub-tiles
    ((40, 30), 64, 1 * MiB, False, None, None, "resident-b", (5, 30), 64),
    # B's column panel fits, but not beside A panels of whole K: the job's K panels of 64
    ((512, 512), 8192, 18 * MiB, False, None, None, "resident-b", (64, 512), 64),
    # a budget that holds neither resident panel: the tile as one sub-tile, streamed
    ((512, 512), 8192, 5 * MiB, False, None, None, "stream", (512, 512), 64),
]


@pytest.mark.parametrize("tile,k,budget,staging,ach,bch,order,sub,bk", SUB_PLAN_CASES)
def test_sub_plan(tile, k, budget, staging, ach, bch, order, sub, bk):
    p = dask_files._sub_plan(_job(tile, k, budget), tile, staging, ach, bch)
    assert (p.m, p.n, p.k) == (*tile, k) and p.order == order and (p.bm, p.bn) == sub
    assert p.bk == bk
    assert p.device_bytes <= budget and p.host_bytes <= budget
    assert p.a_reads == p.b_reads == 1  # every operand panel read once per task
    if order != "stream":
        assert p.n_tiles > 1


def test_sub_plan_holds_the_decode_buffers_of_compressed_inputs():
    # A in compressed chunks of 96 x 128 rows (one decoded with its stored bytes: 96 KiB):
    # the sub-tiles leave it room within the budget
    from bigmm.planner.decode import offered

    decoded = offered((96 * 1024, 0), (4, 0))
    tile, budget = (1000, 512), 64 * MiB
    p = dask_files._sub_plan(_job(tile, 1024, budget), tile, False, (96, 128), None, decoded)
    assert p.decoding is not None and 1 <= p.decoding.threads[0] <= 4
    assert p.host_bytes + p.decoding.bytes <= budget


def test_a_region_on_chunk_edges_decodes_the_sources_chunks(tmp_path):
    from bigmm.io import open_input
    from bigmm.io.generate import generate

    spec = f"{tmp_path / 'a.h5'}:/A"
    generate(spec, (100, 90), layout="compressed", compression="zstd", chunks=(20, 30), seed=4)
    with open_input(spec) as src:
        region = dask_files._Region(src, 40, 100, 30, 90)
        assert region.chunks == (20, 30) and region.decode_bytes == src.decode_bytes
        stored = np.empty(src.decode_bytes, np.uint8)
        got, want = np.empty(20 * 30 * 4, np.uint8), np.empty((20, 30), np.float32)
        assert region.decode_chunk(1, 1, stored, got)  # the source's chunk (3, 2)
        src.read(60, 80, 60, 90, want)
        np.testing.assert_array_equal(got.view(np.float32).reshape(20, 30), want)


@pytest.mark.parametrize("beta", [0.0, 0.5])  # C itself; the partial dataset beside old C
def test_files_h5py_output_tiles_come_back(client, tmp_path, landed, beta):
    """An output only h5py can write (a filtered dataset put in its place between an
    interrupted run and its resume): the tiles come back and this process writes them."""
    m, k, n = 72, 64, 90
    a, b = random_matrix((m, k), np.float64, seed=51), random_matrix((k, n), np.float64, seed=52)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    sc = f"{tmp_path / 'c.h5'}:/C"
    c0 = None
    if beta:
        c0 = random_matrix((m, n), np.float64, seed=53)
        _h5(tmp_path / "c.h5", "C", c0)
    kw = dict(client=client, beta=beta, memory="40KiB", backend="numpy", stats=True)
    with pytest.raises(Interrupted):
        bd.matmul_files(sa, sb, sc, progress=_stop_after(2), **kw)
    target = "C.bigmm-partial" if beta else "C"
    with h5py.File(tmp_path / "c.h5", "r+") as f:  # the same values, stored compressed
        data, token = f[target][...], f[target].attrs["bigmm_run"]
        del f[target]
        d = f.create_dataset(target, data=data, chunks=(8, 8), compression="gzip")
        d.attrs["bigmm_complete"], d.attrs["bigmm_run"] = False, token  # the run's own
    before = len(landed["data"])
    _, stats = bd.matmul_files(sa, sb, sc, resume=True, **kw)
    back = landed["data"][before:]
    assert len(back) == stats.tiles_done > 0 and all(isinstance(c, np.ndarray) for c in back)
    assert landed["caller_writes"] == stats.tiles_done
    got, attrs = _read(sc)
    ref = reference_gemm(a, b, beta=beta, c=c0)
    assert relative_error(got, ref) <= tolerance(np.float64, k) and attrs["bigmm_complete"]


def test_files_errors(client, tmp_path):
    a, b = random_matrix((20, 30), np.float64), random_matrix((30, 10), np.float64, seed=1)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    sc = f"{tmp_path / 'c.h5'}:/C"
    with pytest.raises(OptionError, match="file.h5:/dataset"):  # arrays are not reopenable
        bd.matmul_files(a, sb, sc, client=client)
    with pytest.raises(OptionError, match="out=None"):
        bd.matmul_files(sa, sb, None, client=client)
    with pytest.raises(ShapeError, match="30 != 20"):
        bd.matmul_files(sa, sa, sc, client=client)
    with pytest.raises(BudgetError, match="at least"):
        bd.matmul_files(sa, sb, sc, client=client, memory=100)
    with pytest.raises(SizeParseError, match="abc"):  # parsed here, before any worker runs
        bd.matmul_files(sa, sb, sc, client=client, host_memory="abc")
    bd.matmul_files(sa, sb, sc, client=client)
    with pytest.raises(OutputExistsError):
        bd.matmul_files(sa, sb, sc, client=client)
    got, _ = _read(sc)
    assert relative_error(got, a @ b) <= tolerance(np.float64, 30)


def _stop_after(n):
    def progress(p):
        if p.tiles_done - p.tiles_skipped >= n:
            raise KeyboardInterrupt
    return progress


RESUME_CASES = [
    # (first run, second run, C's layout)
    # interrupted on the cluster, resumed on the cluster after all its workers restarted
    ("cluster", "cluster", "contiguous"),
    ("cluster", "cluster", "tile-chunked"),
    # interrupted on the cluster, resumed in this process by bigmm.matmul (same journal)
    ("cluster", "local", "tile-chunked"),
    # interrupted in this process, resumed on the cluster
    ("local", "cluster", "contiguous"),
]


@pytest.mark.parametrize("first,second,out_layout", RESUME_CASES)
def test_resume_across_workers(client, tmp_path, monkeypatch, landed, first, second,
                               out_layout):
    if out_layout == "tile-chunked":
        monkeypatch.setattr(sink_mod, "MIN_CHUNK_BYTES", 0)
    m, k, n = 96, 70, 88
    a, b = random_matrix((m, k), np.float64, seed=11), random_matrix((k, n), np.float64, seed=12)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    sc = f"{tmp_path / 'c.h5'}:/C"
    kw = dict(memory="40KiB", backend="numpy")

    def run(where, **extra):
        if where == "cluster":
            return bd.matmul_files(sa, sb, sc, client=client, stats=True, **kw, **extra)
        return bigmm.matmul(sa, sb, sc, stats=True, **kw, **extra)

    with pytest.raises(Interrupted, match="resumable"):
        run(first, progress=_stop_after(3))
    journaled = parse_journal(journal_path(parse_spec(sc)))[1]
    assert len(journaled) >= 3
    if second == "cluster" and first == "cluster":
        client.restart()  # new worker processes
    out, stats = run(second, resume=True)
    assert stats.tiles_skipped == len(journaled)
    assert stats.tiles_done == stats.tiles_total - len(journaled) > 0
    got, attrs = _read(sc)
    assert attrs["bigmm_complete"]
    assert relative_error(got, a @ b) <= tolerance(np.float64, k)
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert (f["C"].chunks is None) == (out_layout == "contiguous")
    assert all(c is None for c in landed["data"])  # cluster tiles were written by the workers


SAMPLED_CASES = [
    # (C's kind)
    # an HDF5 C the workers write raw, contiguous
    "contiguous",
    # an HDF5 C chunked by the tiles
    "tile-chunked",
    # a Zarr C whose chunk files the workers write
    "zarr",
    # an HDF5 C only h5py can write (put in place after a first run): tiles come back here
    "h5py",
]


@pytest.mark.parametrize("kind", SAMPLED_CASES)
def test_cluster_tiles_are_journaled_with_samples_a_resume_checks(client, tmp_path,
                                                                 monkeypatch, landed, kind):
    """Each tile a cluster writes is journaled with its sample as written; a resume after one
    journaled tile was changed in C computes that tile again, and C is right."""
    import zarr

    if kind == "tile-chunked":
        monkeypatch.setattr(sink_mod, "MIN_CHUNK_BYTES", 0)
    m, k, n = 96, 70, 88
    a, b = random_matrix((m, k), np.float64, seed=81), random_matrix((k, n), np.float64, seed=82)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    sc = str(tmp_path / "c.zarr") if kind == "zarr" else f"{tmp_path / 'c.h5'}:/C"
    kw = dict(client=client, memory="40KiB", backend="numpy", stats=True)
    with pytest.raises(Interrupted, match="resumable"):
        bd.matmul_files(sa, sb, sc, progress=_stop_after(3), **kw)
    before = set()
    if kind == "h5py":  # the same values stored compressed; the next tiles come back here
        with h5py.File(tmp_path / "c.h5", "r+") as f:
            data, token = f["C"][...], f["C"].attrs["bigmm_run"]
            del f["C"]
            d = f.create_dataset("C", data=data, chunks=(8, 8), compression="gzip")
            d.attrs["bigmm_complete"], d.attrs["bigmm_run"] = False, token
        before = set(parse_journal(journal_path(parse_spec(sc)))[1])
        landed["samples"].clear()
        with pytest.raises(Interrupted, match="resumable"):
            bd.matmul_files(sa, sb, sc, resume=True, progress=_stop_after(2), **kw)
    _, tiles, _, _, samples = parse_journal(journal_path(parse_spec(sc)))
    assert len(tiles) >= 3 and set(samples) == set(tiles)
    assert len(landed["samples"]) == len(tiles) - len(before)
    assert all((s is None) == (kind == "h5py") for s in landed["samples"])  # worker's or ours
    tile = min(set(tiles) - before)  # one this last run journaled
    r, col, length = samples[tile][0][0]
    if kind == "zarr":
        zc = zarr.open_array(sc, mode="r+")
        zc[r, col:col + length] = zc[r, col:col + length] + 1.0
    else:
        with h5py.File(tmp_path / "c.h5", "r+") as f:
            f["C"][r, col:col + length] += 1.0
    _, stats = bd.matmul_files(sa, sb, sc, resume=True, **kw)
    assert stats.tiles_redone == 1 and "computed again" in stats.notes[0]
    assert stats.tiles_skipped == len(tiles) - 1
    got = zarr.open_array(sc)[...] if kind == "zarr" else _read(sc)[0]
    assert relative_error(got, a @ b) <= tolerance(np.float64, k)


def test_worker_killed_mid_job(tmp_path):
    """One of two worker processes dies with tasks in flight; its nanny restarts it, dask
    reruns the lost tiles, and C is right."""
    m, k, n = 480, 2400, 440
    a, b = random_matrix((m, k), np.float64, seed=21), random_matrix((k, n), np.float64, seed=22)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    sc = f"{tmp_path / 'c.h5'}:/C"
    killed = {}
    with bd.local_cluster(2, backend="numpy", memory_limit=WORKER_MEMORY) as c:
        pids = c.run(os.getpid)

        def kill_one(p):
            if killed or p.tiles_done < 1:
                return
            processing = c.processing()  # one snapshot: a second query may see the task done
            busy = [w for w, keys in processing.items() if keys]
            if busy:
                killed["worker"], killed["pid"] = busy[0], pids[busy[0]]
                killed["in_flight"] = len(processing[busy[0]])
                os.kill(killed["pid"], signal.SIGKILL)

        out, stats = bd.matmul_files(sa, sb, sc, client=c, memory="160KiB", backend="numpy",
                                     progress=kill_one, stats=True)
        c.wait_for_workers(2, timeout=60)
        after = set(c.run(os.getpid).values())
    assert killed and killed["in_flight"] >= 1
    assert killed["pid"] not in after  # the process really died
    assert stats.tiles_done == stats.tiles_total > 8
    got, attrs = _read(sc)
    assert attrs["bigmm_complete"]
    assert relative_error(got, a @ b) <= tolerance(np.float64, k)


# ----- the command line -----------------------------------------------------------------------

def test_cli_scheduler_and_workers(client, tmp_path, capsys):
    a = random_matrix((70, 90), np.float32, seed=31)
    b = random_matrix((90, 50), np.float32, seed=32)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b, "chunked")
    ref = a.astype(np.float64) @ b
    for i, where in enumerate((["--scheduler", client.scheduler.address], ["--workers", "1"])):
        sc = f"{tmp_path / f'c{i}.h5'}:/C"
        rc = cli.main(["multiply", sa, sb, "-o", sc, "--memory", "64KiB", "--backend", "numpy",
                       "--json", *where])
        assert rc == 0
        out, err = capsys.readouterr()
        summary = json.loads(out)
        assert summary["workers"] == (2 if i == 0 else 1)
        # a log without a terminal: the dashboard's address, then progress lines
        lines = err.strip().splitlines()
        assert lines[0].startswith("bigmm: dask dashboard at http"), err
        assert lines[-1].startswith("bigmm: 100% ("), err
        assert summary["backend"] == "numpy" and summary["tiles_done"] == summary["tiles_total"]
        assert relative_error(_read(sc)[0], ref) <= tolerance(np.float32, 90)


CLI_ERRORS = [
    # (extra arguments, message)
    # both ways of choosing a cluster
    (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], "either --scheduler or --workers"),
    # no workers
    (["--workers", "0"], "positive integer"),
    # an address dask cannot parse (no port)
    (["--scheduler", "garbage"], "Expected a scheduler address"),
]


@pytest.mark.parametrize("extra,message", CLI_ERRORS)
def test_cli_errors(tmp_path, capsys, extra, message):
    sa = _h5(tmp_path / "a.h5", "A", random_matrix((5, 5), np.float64))
    t0 = time.perf_counter()
    rc = cli.main(["multiply", sa, sa, "-o", f"{tmp_path / 'c.h5'}:/C", *extra])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_ERROR and message in err and len(err.strip().splitlines()) == 1
    assert time.perf_counter() - t0 < 20  # no cluster was started


def test_a_scheduler_that_does_not_answer_is_one_error():
    from bigmm.dask.cluster import connect

    t0 = time.perf_counter()
    with pytest.raises(bigmm.errors.BackendUnavailable,
                       match=r"Expected a dask scheduler answering at tcp://127\.0\.0\.1:1 "
                             r"within 1s\. Got none"):
        with connect("tcp://127.0.0.1:1", timeout="1s"):
            pass
    assert time.perf_counter() - t0 < 15


@pytest.mark.skipif(not gpu_available(), reason="needs a usable CUDA GPU and cupy")
@pytest.mark.gpu
def test_local_cluster_one_worker_per_gpu():
    pytest.importorskip("dask_cuda")
    with bd.local_cluster(1) as c:
        info = c.scheduler_info(n_workers=-1)["workers"]
        assert all(w["nthreads"] == 1 and w["resources"] == {bd.RESOURCE: 1}
                   for w in info.values())


# ----- Zarr ---------------------------------------------------------------------------------------

def test_matmul_on_from_zarr_arrays(client, tmp_path):
    """bigmm.dask.matmul on da.from_zarr arrays: their chunks are the stores' chunks."""
    from bigmm.testing import zarr_array

    a = random_matrix((83, 97), np.float64, seed=51)
    b = random_matrix((97, 61), np.float64, seed=52)
    za = zarr_array(tmp_path / "a.zarr", a, chunks=(30, 40), codec="zstd")
    zb = zarr_array(tmp_path / "s.zarr", b, path="B", chunks=(25, 33), endian="big")
    x, y = da.from_zarr(za), da.from_zarr(str(tmp_path / "s.zarr"), component="B")
    c = bd.matmul(x, y, alpha=2.0)
    assert c.chunks == (x.chunks[0], y.chunks[1])
    got = c.compute()
    assert relative_error(got, 2.0 * (a @ b)) <= tolerance(np.float64, 97)
    # and back into a Zarr store through dask
    c.to_zarr(str(tmp_path / "c.zarr"))
    assert np.array_equal(da.from_zarr(str(tmp_path / "c.zarr")).compute(), got)
    del zb


ZARR_FILE_CASES = [
    # (C, beta, trans_a, trans_b): C is a new root array / an array beside the inputs; beta !=
    # 0 reads old C (gzip, other chunks) on the workers and swaps the partial array in
    ("c.zarr", 0.0, False, False),
    ("in.zarr:/C", 0.0, True, False),
    ("in.zarr:/C", -0.5, False, True),
]


@pytest.mark.parametrize("out,beta,ta,tb", ZARR_FILE_CASES)
def test_zarr_files_on_cluster(client, tmp_path, monkeypatch, out, beta, ta, tb):
    """A Zarr job on the cluster: each task writes its tile's chunk file itself (nothing comes
    back to this process), and the result is C, complete, with nothing left behind."""
    import zarr

    from bigmm.io import zarrsink
    from bigmm.testing import zarr_array

    m, k, n = 91, 77, 85
    a = random_matrix(_stored((m, k), ta), np.float64, seed=61)
    b = random_matrix(_stored((k, n), tb), np.float64, seed=62)
    zarr_array(tmp_path / "in.zarr", a, path="A", chunks=(30, 30), codec="blosc")
    zarr_array(tmp_path / "in.zarr", b, path="B", chunks=(40, 20))
    sa, sb, sc = (f"{tmp_path / 'in.zarr'}:/A", f"{tmp_path / 'in.zarr'}:/B",
                  str(tmp_path / out))
    c0 = None
    if beta:
        c0 = random_matrix((m, n), np.float64, seed=63)
        zarr_array(tmp_path / "in.zarr", c0, path="C", chunks=(50, 50), codec="gzip")
    back = []
    real = dask_files._Tiles._landed

    def spy(self, t, c, st, sample=None):
        back.append(c)
        real(self, t, c, st, sample)

    monkeypatch.setattr(dask_files._Tiles, "_landed", spy)
    result, stats = bd.matmul_files(sa, sb, sc, client=client, alpha=1.5, beta=beta,
                                    trans_a=ta, trans_b=tb, memory="48KiB", backend="numpy",
                                    stats=True)
    assert result == sc
    s = parse_spec(sc)
    arr = zarr.open_array(s.path, path=s.dataset.strip("/"), mode="r")
    ref = reference_gemm(a, b, alpha=1.5, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(arr[...], ref) <= tolerance(np.float64, k)
    assert arr.attrs["bigmm_complete"] is True and arr.compressors == ()
    assert len(back) == stats.tiles_total >= 2 and all(c is None for c in back)
    assert not os.path.exists(journal_path(s))
    left = [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".bigmm-tmp")]
    assert not left
    assert not [p for p in os.listdir(tmp_path / "in.zarr")
                if zarrsink.PARTIAL_SUFFIX in p or zarrsink.OLD_SUFFIX in p]


def test_zarr_resume_across_cluster_and_process(client, tmp_path):
    """Interrupted on the cluster, resumed by bigmm.matmul in this process (one journal)."""
    import zarr

    from bigmm.testing import zarr_array

    m, k, n = 96, 70, 88
    a, b = random_matrix((m, k), np.float64, seed=71), random_matrix((k, n), np.float64, seed=72)
    za = zarr_array(tmp_path / "a.zarr", a, chunks=(32, 35), codec="zstd")
    sb = str(tmp_path / "b.zarr")
    zarr_array(sb, b, chunks=(35, 44))
    sc = str(tmp_path / "c.zarr")
    kw = dict(memory="40KiB", backend="numpy")
    with pytest.raises(Interrupted, match="resumable"):
        bd.matmul_files(za, sb, sc, client=client, progress=_stop_after(3), **kw)
    journaled = parse_journal(journal_path(parse_spec(sc)))[1]
    assert len(journaled) >= 3
    _, stats = bigmm.matmul(za, sb, sc, resume=True, stats=True, **kw)
    assert stats.tiles_skipped == len(journaled) and stats.tiles_done > 0
    assert relative_error(zarr.open_array(sc)[...], a @ b) <= tolerance(np.float64, k)


def test_cli_workers_on_zarr(client, tmp_path, capsys):
    a, b, c = (f"{tmp_path / 's.zarr'}:/{x}" for x in "ABC")
    assert cli.main(["generate", a, "--shape", "70", "90", "--seed", "1", "--compression",
                     "zstd", "--chunks", "35", "45"]) == 0
    assert cli.main(["generate", b, "--shape", "90", "50", "--seed", "2"]) == 0
    capsys.readouterr()
    rc = cli.main(["multiply", a, b, "-o", c, "--memory", "64KiB", "--backend", "numpy",
                   "--json", "--workers", "2"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["workers"] == 2 and summary["tiles_done"] == summary["tiles_total"]
    assert cli.main(["verify", a, b, c]) == 0


# ----- precision= -------------------------------------------------------------------------

PRECISION_ERRORS = [
    # (a dtype, b dtype, precision, message)
    # not a precision
    ("float32", "float32", "fp8", "Expected precision to be one of"),
    # float64 runs in float64
    ("float64", "float64", "tf32", "float64 operands"),
    # float32 @ float64 is multiplied in float64
    ("float32", "float64", "tf32x3", "float64 operands"),
]


@pytest.mark.parametrize("ta, tb, precision, message", PRECISION_ERRORS)
def test_matmul_precision_errors(ta, tb, precision, message):
    a, b = da.from_array(np.ones((3, 4), ta)), da.from_array(np.ones((4, 2), tb))
    with pytest.raises(OptionError, match=message):
        bd.matmul(a, b, precision=precision)


@pytest.mark.parametrize("precision", ["float32", "TF32x3", "tf32"])
def test_matmul_numpy_chunks_in_any_precision_are_float32(client, precision):
    a, b = random_matrix((61, 83), np.float32, 41), random_matrix((83, 47), np.float32, 42)
    C = bd.matmul(da.from_array(a, chunks=(20, 30)), da.from_array(b, chunks=(30, 25)),
                  precision=precision)
    got = C.compute()
    assert got.dtype == np.float32
    assert relative_error(got, reference_gemm(a, b)) <= tolerance(np.float32, 83)


def test_files_precision_errors_and_resume(client, tmp_path):
    a, b = random_matrix((96, 70), np.float32, 43), random_matrix((70, 88), np.float32, 44)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    sc = f"{tmp_path / 'c.h5'}:/C"
    kw = dict(client=client, memory="40KiB", backend="numpy")
    with pytest.raises(OptionError, match="Expected precision to be one of"):
        bd.matmul_files(sa, sb, sc, precision="half", **kw)
    with pytest.raises(OptionError, match="cuBLAS has no float32-accurate"):
        bd.matmul_files(sa, sb, sc, kernel="cublas", precision="tf32x3", **kw)
    with pytest.raises(Interrupted, match="resumable"):
        bd.matmul_files(sa, sb, sc, precision="tf32", progress=_stop_after(2), **kw)
    assert parse_journal(journal_path(parse_spec(sc)))[0]["job"]["precision"] == "tf32"
    with pytest.raises(bigmm.errors.ResumeError, match="precision: recorded 'tf32'"):
        bd.matmul_files(sa, sb, sc, resume=True, **kw)
    _, stats = bd.matmul_files(sa, sb, sc, resume=True, precision="TF32", stats=True, **kw)
    assert stats.tiles_skipped >= 2
    assert relative_error(_read(sc)[0], reference_gemm(a, b)) <= tolerance(np.float32, 70)


def test_cli_on_a_cluster_takes_a_precision(client, tmp_path, capsys):
    a, b = random_matrix((70, 90), np.float64, 45), random_matrix((90, 50), np.float64, 46)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    where = ["--scheduler", client.scheduler.address, "--backend", "numpy", "-q"]
    rc = cli.main(["multiply", sa, sb, "-o", f"{tmp_path / 'c.h5'}:/C", "--precision", "tf32",
                   *where])
    err = capsys.readouterr().err
    assert rc == 2 and "--precision 'float32'" in err and "float64 operands" in err
    a32, b32 = (x.astype(np.float32) for x in (a, b))
    sa, sb = _h5(tmp_path / "a.h5", "A32", a32), _h5(tmp_path / "b.h5", "B32", b32)
    sc = f"{tmp_path / 'c.h5'}:/C32"
    assert cli.main(["multiply", sa, sb, "-o", sc, "--precision", "tf32x3", *where]) == 0
    assert relative_error(_read(sc)[0], reference_gemm(a32, b32)) <= tolerance(np.float32, 90)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32x3", "tf32"])
def test_matmul_cupy_chunks_in_a_tensor_core_precision(precision):
    import cupy

    a, b = random_matrix((300, 500), np.float32, 47), random_matrix((500, 200), np.float32, 48)
    A = da.from_array(cupy.asarray(a), chunks=(128, 96), asarray=False)
    B = da.from_array(cupy.asarray(b), chunks=(70, 128), asarray=False)
    got = cupy.asnumpy(bd.matmul(A, B, precision=precision).compute(scheduler="sync"))
    bound = tolerance(np.float32, 500) if precision == "tf32x3" else 2e-3
    assert relative_error(got, reference_gemm(a, b)) <= bound
