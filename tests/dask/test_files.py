"""bigmm.dask.matmul_files: HDF5 and Zarr jobs on a real local cluster (``client``, from
conftest.py), the tasks' sub-plans, faults, resume, precision.

HDF5 jobs check where C's tiles were written: by the workers, into C's file (the task results
carry no data), or, for an output only h5py can write, by this process. The fault test starts
a cluster of its own and kills one of its workers mid-job.
"""

from __future__ import annotations

import os
import signal

import h5py
import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import bigmm  # noqa: E402
import bigmm.dask as bd  # noqa: E402
from bigmm.dask import files as dask_files  # noqa: E402
from bigmm.errors import (BudgetError, Interrupted, OptionError, OutputExistsError,  # noqa: E402
                          ShapeError, SizeParseError)
from bigmm.io import filesink as sink_mod  # noqa: E402
from bigmm.io.journal import journal_path, parse_journal  # noqa: E402
from bigmm.io.spec import parse_spec  # noqa: E402
from bigmm.planner import make_plan  # noqa: E402
from bigmm.testing import random_matrix, reference_gemm, relative_error, tolerance  # noqa: E402
from dask_cases import WORKER_MEMORY, _h5, _read, _stored  # noqa: E402


# ----- HDF5 jobs on the cluster ---------------------------------------------------------------

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


@pytest.mark.parametrize("progress", [5, lambda: None], ids=["int", "no-argument"])
def test_files_refuse_a_progress_that_cannot_take_one(tmp_path, progress):
    with pytest.raises(OptionError, match="Expected progress as a callable taking a Progress"):
        bd.matmul_files("a.h5:/A", "b.h5:/B", f"{tmp_path / 'c.h5'}:/C", progress=progress)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("client", [5, "tcp://127.0.0.1:8786"], ids=["int", "address"])
def test_files_refuse_a_client_that_is_not_one(tmp_path, client):
    # an address is for bigmm.dask.connect: the client it returns goes here
    with pytest.raises(OptionError, match="Expected a dask.distributed Client.*Got"):
        bd.matmul_files("a.h5:/A", "b.h5:/B", f"{tmp_path / 'c.h5'}:/C", client=client)
    assert not list(tmp_path.iterdir())


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


# ----- Zarr -----------------------------------------------------------------------------------

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


# ----- precision= -----------------------------------------------------------------------------

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


# ----- workers that see other files -----------------------------------------------------------

SEEN_CASES = [
    # (the file replaced at its path once the first tile landed)
    # A: the later tasks would read the new A (a C of two different A's)
    "a",
    # C's file: the later tasks would write into the new file, never into the C journaled
    "c",
]


@pytest.mark.parametrize("which", SEEN_CASES)
def test_files_a_worker_that_sees_another_file_is_one_error(client, tmp_path, which):
    """A worker that sees another file at A's or C's path (a node-local copy, or here a file
    put in its place during the run) is refused, not used: the job ends in one error naming
    the file, and C is not marked complete."""
    import shutil

    a, b = random_matrix((96, 70), np.float64, seed=91), random_matrix((70, 88), np.float64, 92)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    sc = f"{tmp_path / 'c.h5'}:/C"
    path = tmp_path / f"{which}.h5"

    def replace_once(p):
        if p.tiles_done == 1:
            shutil.copyfile(path, tmp_path / "copy.h5")
            if which == "a":  # another A of the same shape
                with h5py.File(tmp_path / "copy.h5", "r+") as f:
                    f["A"][...] = a + 1.0
            os.replace(tmp_path / "copy.h5", path)

    with pytest.raises(bigmm.errors.OperandNotFound,
                       match=rf"Expected {path} \({which.upper()}\) on dask worker .* Got "
                             r"another file there"):
        bd.matmul_files(sa, sb, sc, client=client, memory="40KiB", backend="numpy",
                        progress=replace_once)
    assert not _read(sc)[1].get("bigmm_complete")
