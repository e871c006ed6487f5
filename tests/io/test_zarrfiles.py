"""The file mechanics of Zarr outputs (:mod:`bigmm.io.zarrfiles`): chunk files written direct
or through the page cache, by writers meeting at new files, made ahead in the writers' order,
or refused; a full disk under direct chunk writes; the swap of the partial array finished from
any point a crash leaves it.

Real stores on disk, fresh random data.
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

import bigmm  # noqa: E402
from bigmm import errors  # noqa: E402
from bigmm.io import direct, open_output, read_journal, zarrfiles  # noqa: E402
from bigmm.io.zarrfiles import SET_ASIDE  # noqa: E402
from bigmm.io.zarrsink import OLD_SUFFIX, PARTIAL_SUFFIX, swap  # noqa: E402
from bigmm.testing import fail_after, random_matrix, relative_error, tolerance  # noqa: E402
from zarr_cases import KW, _leftovers, _read  # noqa: E402


# ----- chunk files ------------------------------------------------------------------------------

WRITES = [
    # (bigmm.io.direct.MODE, how the chunk files are written)
    ("direct", "direct"),   # O_DIRECT wherever it opens (skipped where it does not)
    ("mapped", "cached"),   # through the page cache
    ("auto", "cached"),     # bigmm's choice: the page cache, on a disk too
]


@pytest.mark.parametrize("mode,writes", WRITES)
def test_chunk_files_written_direct_or_cached(tmp_path, monkeypatch, mode, writes):
    if mode == "direct" and not direct.supports_direct(str(tmp_path)):
        pytest.skip("no O_DIRECT on this file system")
    monkeypatch.setattr(direct, "MODE", mode)
    m, n, t = 700, 600, 512  # 512 x 512 float32 tiles (1 MiB), edge tiles cut short
    data = random_matrix((m, n), np.float32, seed=7)
    spec = f"{tmp_path / 'c.zarr'}:/C"
    sink = open_output(spec, shape=(m, n), dtype=np.float32, inputs=[], job={"plan": "x"},
                       tile=(t, t))
    buf = np.frombuffer(mmap.mmap(-1, t * t * 4), np.float32).reshape(t, t)  # page-aligned,
    # as the GPU's pinned tile buffers are
    for r0 in range(0, m, t):
        for c0 in range(0, n, t):
            r1, c1 = min(m, r0 + t), min(n, c0 + t)
            tile = buf[:r1 - r0, :c1 - c0] if c1 - c0 == t else data[r0:r1, c0:c1].copy()
            tile[...] = data[r0:r1, c0:c1]
            sink.write(r0, r1, c0, c1, tile)
    sink.commit([(0, 0), (0, 1), (1, 0), (1, 1)])
    assert sink.writes == writes
    counts = dict(sink._files.bytes)
    sink.finish()
    sink.close()
    assert np.array_equal(_read(spec)[0], data)
    assert not _leftovers(tmp_path / "c.zarr")
    full = t * t * 4  # the whole-width tiles: each one sequential run of its chunk file
    if writes == "direct":
        assert counts["direct"] == full + (m - t) * t * 4 // 4096 * 4096 and \
            counts["bounced"] == 0, counts
    else:
        assert counts["direct"] == counts["bounced"] == 0 and counts["cached"] == m * n * 4


def test_temporaries_a_killed_zarr_write_left_are_dropped_on_resume(tmp_path):
    # zarr-python writes each file through "<stem>.<32 hex>.partial" beside it: a run killed
    # mid-write leaves it (the store's and a group's metadata, the array's, a chunk's)
    spec = f"{tmp_path / 'c.zarr'}:/G/C"
    sink = open_output(spec, shape=(64, 64), dtype=np.float32, inputs=[], job={"plan": "x"},
                       tile=(32, 32))
    sink.close()  # interrupted: its journal kept
    store = tmp_path / "c.zarr"
    hexes = iter(f"{i:032x}" for i in range(1, 10))
    left = [store / f"zarr.{next(hexes)}.partial", store / "G" / f"zarr.{next(hexes)}.partial",
            store / "G" / "C" / f"zarr.{next(hexes)}.partial",
            store / "G" / "C" / f"0.{next(hexes)}.partial"]
    kept = [store / "notes.partial",  # not of zarr-python's form
            store / f"other.{next(hexes)}.partial",  # above the array: not metadata's
            tmp_path / f"zarr.{next(hexes)}.partial"]  # outside the store
    for path in left + kept:
        path.write_bytes(b"x")
    sink = open_output(spec, shape=(64, 64), dtype=np.float32, inputs=[], job={"plan": "x"},
                       tile=(32, 32), resume=True)
    sink.close()
    assert [p for p in left if p.exists()] == [] and all(p.exists() for p in kept)


# How many threads write pieces of each tile at once (each piece a band of rows).
THREADS = [
    2,  # two writers meeting at each chunk
    8,  # more writers than pieces of some chunks
]


@pytest.mark.parametrize("threads", THREADS)
def test_writers_meeting_at_new_chunk_files(tmp_path, threads):
    import random
    from concurrent.futures import ThreadPoolExecutor

    m, n, t = 700, 600, 256
    data = random_matrix((m, n), np.float32, seed=8)
    spec = f"{tmp_path / 'c.zarr'}:/C"
    sink = open_output(spec, shape=(m, n), dtype=np.float32, inputs=[], job={"plan": "x"},
                       tile=(t, t))
    made = []
    chunk = sink._files._chunk

    def counted(ci, cj):  # every piece asks for its chunks
        made.append((ci, cj))
        return chunk(ci, cj)

    sink._files._chunk = counted
    pieces = [(r0, min(r0 + 16, min(m, i + t)), c0, min(n, c0 + t))
              for i in range(0, m, t) for r0 in range(i, min(m, i + t), 16)
              for c0 in range(0, n, t)]
    random.Random(threads).shuffle(pieces)
    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(sink.write, r0, r1, c0, c1, data[r0:r1, c0:c1].copy())
                  for r0, r1, c0, c1 in pieces]:
            f.result()
    tiles = [(i, j) for i in range(-(-m // t)) for j in range(-(-n // t))]
    assert sorted(set(made)) == tiles
    sink.commit(tiles)
    sink.finish()
    sink.close()
    assert np.array_equal(_read(spec)[0], data)
    assert not _leftovers(tmp_path / "c.zarr")


def test_a_commit_makes_its_chunk_files_and_their_new_directories_durable(tmp_path,
                                                                         monkeypatch):
    m, n, t = 300, 500, 128
    data = random_matrix((m, n), np.float32, seed=9)
    spec = f"{tmp_path / 'c.zarr'}:/C"
    sink = open_output(spec, shape=(m, n), dtype=np.float32, inputs=[], job={"plan": "x"},
                       tile=(t, t))
    synced, fsync = set(), os.fsync

    def recorded(fd):
        synced.add(os.fstat(fd).st_ino)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recorded)
    tiles = [(i, j) for i in range(-(-m // t)) for j in range(-(-n // t))]
    for i, j in tiles:
        r0, c0 = i * t, j * t
        sink.write(r0, min(m, r0 + t), c0, min(n, c0 + t), data[r0:r0 + t, c0:c0 + t].copy())
    sink.commit(tiles)
    array = tmp_path / "c.zarr" / "C"
    files = [array / "c" / str(i) / str(j) for i, j in tiles]
    folders = {array / "c"} | {f.parent for f in files}
    assert all(f.exists() for f in files)
    assert {os.stat(p).st_ino for p in files} <= synced  # each chunk file's bytes
    assert {os.stat(p).st_ino for p in folders} <= synced  # each new name in its folder
    sink.finish()
    sink.close()
    assert np.array_equal(_read(spec)[0], data)


def _tmp(folder, i, j):
    return folder / "c" / str(i) / f"{j}.bigmm-tmp"


def _eventually(cond, seconds=5.0):
    import time

    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


# The order the writers go through the tiles, and the chunk files made ahead after two tiles
# (zarrfiles.AHEAD = 2; after the first tile the guess is row-major).
ORDERS = [
    ("rows", [(0, 0), (0, 1)], [(0, 2), (1, 0)]),  # row-major: the rest of the row, then on
    ("columns", [(0, 0), (1, 0)], [(0, 1), (0, 2), (2, 0)]),  # one above the other: down
]


@pytest.mark.parametrize("name, first, ahead", ORDERS, ids=[o[0] for o in ORDERS])
def test_chunk_files_are_made_ahead_in_the_writers_order(tmp_path, name, first, ahead):
    from bigmm.io import zarrfiles

    assert zarrfiles.AHEAD == 2
    t = 64
    data = random_matrix((3 * t, 3 * t), np.float32, seed=9)
    spec = f"{tmp_path / 'c.zarr'}:/C"
    sink = open_output(spec, shape=data.shape, dtype=np.float32, inputs=[], job={"plan": "x"},
                       tile=(t, t))
    folder = tmp_path / "c.zarr" / "C"
    for i, j in first:
        sink.write(i * t, i * t + t, j * t, j * t + t, data[i * t:i * t + t, j * t:j * t + t])
    assert _eventually(lambda: all(_tmp(folder, i, j).exists() for i, j in ahead))
    others = [(i, j) for i in range(3) for j in range(3) if (i, j) not in first + ahead]
    assert not any(_tmp(folder, i, j).exists() for i, j in others)
    sink.commit(first)
    sink.close()  # the files made ahead and never written are dropped
    assert not _leftovers(folder)
    got = _read(spec)[0]
    for i, j in first:
        assert np.array_equal(got[i * t:i * t + t, j * t:j * t + t],
                              data[i * t:i * t + t, j * t:j * t + t])


def test_a_chunk_finished_before_it_was_made_ahead_is_not_made_again(tmp_path, monkeypatch):
    import threading

    from bigmm.io import zarrfiles

    t = 64
    data = random_matrix((t, 3 * t), np.float32, seed=10)
    go = threading.Event()
    early = zarrfiles.ChunkFiles._make_early

    def held(self, key):  # the maker runs only once the writer has finished the chunks
        go.wait(5)
        return early(self, key)

    monkeypatch.setattr(zarrfiles.ChunkFiles, "_make_early", held)
    spec = f"{tmp_path / 'c.zarr'}:/C"
    sink = open_output(spec, shape=data.shape, dtype=np.float32, inputs=[], job={"plan": "x"},
                       tile=(t, t))
    for j in range(3):  # (0, 1) and (0, 2) are queued to be made ahead after (0, 0)
        sink.write(0, t, j * t, j * t + t, data[:, j * t:j * t + t])
    go.set()
    sink._files._maker.shutdown(wait=True)  # the maker's turns have run
    assert len(sink._files._ready) == 3  # finished, not yet durable: made again, they'd empty
    sink.commit([(0, 0), (0, 1), (0, 2)])
    sink.finish()
    sink.close()
    assert np.array_equal(_read(spec)[0], data)
    assert not _leftovers(tmp_path / "c.zarr")


def test_a_chunk_file_that_cannot_be_made_fails_every_writer_waiting_for_it(tmp_path,
                                                                            monkeypatch):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    m = n = t = 256
    sink = open_output(f"{tmp_path / 'c.zarr'}:/C", shape=(m, n), dtype=np.float32, inputs=[],
                       job={"plan": "x"}, tile=(t, t))
    started, release = threading.Event(), threading.Event()
    real_open = os.open

    def slow_refusal(path, *args, **kw):  # the first chunk file: refused once others wait
        if str(path).endswith(".bigmm-tmp"):
            started.set()
            release.wait(5)
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kw)

    monkeypatch.setattr(os, "open", slow_refusal)
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(sink.write, r, r + 64, 0, n, np.ones((64, n), np.float32))
                   for r in range(0, m, 64)]
        assert started.wait(5)
        release.set()
        errs = [f.exception(timeout=10) for f in futures]
    assert all(isinstance(e, (OSError, errors.WriteError)) for e in errs), errs
    monkeypatch.undo()
    sink.close()
    assert not _leftovers(tmp_path / "c.zarr")


FULL = [
    # (how chunk files are written, where the disk fills up)
    ("direct", "write"),    # the third O_DIRECT write
    ("direct", "reserve"),  # the fourth chunk file's reservation (posix_fallocate)
    ("cached", "write"),    # the third write of rows into a chunk file, through the cache
    ("cached", "publish"),  # the second commit's fsync of its finished chunk files
]


def _fill_up(mp, writes: str, where: str) -> None:
    if writes == "direct":
        mp.setattr(direct, "MODE", "direct")
        mp.setattr(direct, "DIRECT_MIN", 0)  # every whole page of a run written direct
    if where == "write" and writes == "direct":
        mp.setattr(direct, "_write_direct", fail_after(direct._write_direct, 2))
    elif where == "write":
        mp.setattr(zarrfiles, "write_block", fail_after(zarrfiles.write_block, 2))
    elif where == "reserve":
        # a reservation asks for one byte, then the chunk: the fourth file's chunk fails
        mp.setattr(os, "posix_fallocate", fail_after(os.posix_fallocate, 7))
    else:
        mp.setattr(zarrfiles, "_fsync_all", fail_after(zarrfiles._fsync_all, 1))


@pytest.mark.parametrize("writes,where", FULL)
def test_disk_full_under_chunk_writes_is_one_error_and_resumes(tmp_path, ab, monkeypatch,
                                                               writes, where):
    if writes == "direct" and not direct.supports_direct(str(tmp_path)):
        pytest.skip("no O_DIRECT on this file system")
    sa, sb, a, b = ab
    ref = f"{tmp_path / 'ref.zarr'}:/C"
    bigmm.matmul(sa, sb, ref, **KW)
    sc = f"{tmp_path / 'c.zarr'}:/C"
    with monkeypatch.context() as mp:
        _fill_up(mp, writes, where)
        with pytest.raises(errors.DiskFullError, match="c.zarr") as err:
            bigmm.matmul(sa, sb, sc, **KW)
    assert "resume" in str(err.value)
    assert _read(sc)[1]["bigmm_complete"] is False and read_journal(sc) is not None
    bigmm.matmul(sa, sb, sc, resume=True, **KW)
    assert _read(sc)[0].tobytes() == _read(ref)[0].tobytes()
    assert read_journal(sc) is None and not _leftovers(tmp_path / "c.zarr")


# ----- the swap, at every point a crash may leave it ---------------------------------------------

@pytest.mark.parametrize("state", ["before", "marked", "moved aside", "moved in", "old removed"])
def test_swap_finishes_from_any_point(tmp_path, state):
    name, partial = tmp_path / "C", tmp_path / ("C" + PARTIAL_SUFFIX)
    name.mkdir()
    (name / "v").write_text("old")
    partial.mkdir()
    (partial / "v").write_text("new")
    old = tmp_path / ("C" + OLD_SUFFIX)
    if state != "before":
        (name / SET_ASIDE).touch()
    if state in ("moved aside", "moved in", "old removed"):
        os.rename(name, old)
    if state in ("moved in", "old removed"):
        os.rename(partial, name)
    if state == "old removed":
        import shutil

        shutil.rmtree(old)
    swap(str(name), str(partial))
    swap(str(name), str(partial))  # and again
    assert (name / "v").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["C"]


@pytest.mark.parametrize("exists,beta", [
    (False, 0.0),  # a new C
    (True, 0.0),   # C there before, overwritten
    (True, 1.0),   # old C read, then set aside
])
def test_an_array_of_the_users_at_the_set_aside_name_is_kept(tmp_path, exists, beta):
    store = tmp_path / "o.zarr"
    a, b = random_matrix((6, 4), np.float64), random_matrix((4, 5), np.float64, 1)
    if exists:
        bigmm.matmul(a, b, f"{store}:/C", backend="numpy")
    kept = random_matrix((3, 3), np.float64, 2)
    zarr.open_array(store, path="C" + OLD_SUFFIX, mode="w", shape=kept.shape,
                    dtype=kept.dtype)[...] = kept
    with pytest.raises(errors.OutputNotWritable, match=r"Expected nothing at .*bigmm-old.*Got"):
        bigmm.matmul(a, b, f"{store}:/C", beta=beta, overwrite=exists and not beta,
                     backend="numpy")
    np.testing.assert_array_equal(zarr.open_array(store, path="C" + OLD_SUFFIX)[...], kept)
    # and once it is moved away, the run goes on (old C kept until then)
    os.rename(store / ("C" + OLD_SUFFIX), tmp_path / "elsewhere")
    c0 = zarr.open_array(store, path="C")[...] if exists else 0
    bigmm.matmul(a, b, f"{store}:/C", beta=beta, overwrite=exists and not beta, backend="numpy")
    want = a @ b + beta * c0
    assert relative_error(zarr.open_array(store, path="C")[...], want) <= tolerance(np.float64, 4)
    assert sorted(os.listdir(store)) == ["C", "zarr.json"]
