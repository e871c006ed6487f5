"""The writer: its errors surface in the run, and large tiles go into an array in row pieces
on its own threads (the drain's pieces each written on its own)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from executor_cases import BACKENDS

from bigmm import io
from bigmm.errors import WriteError
from bigmm.executor import execute
from bigmm.executor.tuning import DRAIN, split_range
from bigmm.io.sink import ArraySink
from bigmm.planner import make_plan
from bigmm.testing import random_matrix


class _FailingSink:
    """A real sink whose third write fails with a disk error."""

    parallel_writes = False
    takes_samples = False

    def __init__(self, sink):
        self.sink, self.writes = sink, 0
        self.shape, self.dtype, self.label, self.done = sink.shape, sink.dtype, sink.label, sink.done

    def write(self, r0, r1, c0, c1, src):
        self.writes += 1
        if self.writes == 3:
            raise OSError(28, "No space left on device")
        self.sink.write(r0, r1, c0, c1, src)

    def commit(self, tiles, samples=None):
        self.sink.commit(tiles, samples)

    def finish(self):
        self.sink.finish()


@pytest.mark.parametrize("bname", list(BACKENDS))
def test_writer_error_surfaces(tmp_path, bname):
    m, n, k = 40, 40, 12
    a, b = random_matrix((m, k), np.float64), random_matrix((k, n), np.float64, seed=1)
    plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=bname == "async",
                     tile=(8, 8, 12))
    A, B = io.open_input(a), io.open_input(b)
    sink = io.open_output(None, shape=(m, n), dtype=np.float64, inputs=[A, B], job={})
    with pytest.raises(WriteError, match="rows"):
        execute(plan, A, B, _FailingSink(sink), BACKENDS[bname]())


@pytest.mark.parametrize("bname", list(BACKENDS))
def test_large_tiles_into_an_array_are_written_in_pieces(bname):
    """A tile of 8 MiB or more goes into a NumPy output in row pieces on several threads
    (one thread copies at a few GB/s); with staging, the run's last tile is copied out and
    written in the drain's row pieces, each as soon as its gemm is done. Every element lands
    once, in the right place."""
    class Recording(ArraySink):
        def __init__(self, array):
            super().__init__(array, "C")
            self.calls, self.threads = [], {}

        def write(self, r0, r1, c0, c1, src):
            self.calls.append((r0, r1, c0, c1))
            self.threads[r0] = threading.current_thread().name
            super().write(r0, r1, c0, c1, src)

    m, n, k = 2200, 1030, 40
    a, b = random_matrix((m, k), np.float64, seed=3), random_matrix((k, n), np.float64, seed=4)
    plan = make_plan(m, n, k, "float64", device_budget=64 << 20, staging=bname == "async",
                     tile=(1100, 1030, 40), order="stream")  # two 8.6 MiB tiles
    out = np.full((m, n), np.nan)
    sink = Recording(out)
    execute(plan, io.open_input(a), io.open_input(b), sink, BACKENDS[bname](), io_threads=4)
    assert np.allclose(out, a @ b, rtol=1e-12, atol=1e-12)
    rows = sorted((r0, r1) for r0, r1, _, _ in sink.calls)
    assert rows[0][0] == 0 and rows[-1][1] == m
    assert all(x[1] == y[0] for x, y in zip(rows, rows[1:]))  # every row once
    first = [r for r in rows if r[0] < 1100]
    assert len(first) == 2  # 8.6 MiB: two pieces of at least 4 MiB
    assert all(sink.threads[r0].startswith("bigmm-copy") for r0, _ in first)  # writer's pool
    last = [(r0 - 1100, r1 - 1100) for r0, r1 in rows if r0 >= 1100]
    if bname == "async":  # the drain's row pieces, each under 4 MiB: one write each
        assert last == split_range(1100, DRAIN) and len(last) == 4
    else:
        assert len(last) == 2


@pytest.mark.parametrize("mode", [
    "direct",  # O_DIRECT runs (through the bounce buffer: NumPy tile buffers are not aligned)
    "mapped",  # copies into a shared map of the output
])
def test_large_tiles_into_a_file_are_written_in_pieces(tmp_path, monkeypatch, mode):
    """A file output takes a large tile in row pieces on the writer's threads (several
    direct writes in flight keep the device's queue full); every element lands once."""
    from bigmm.io import direct

    if mode == "direct" and not direct.supports_direct(str(tmp_path)):
        pytest.skip("no O_DIRECT on this file system")
    monkeypatch.setattr(direct, "MODE", mode)
    seen = []
    cls = direct.DirectWrites if mode == "direct" else io.mapped.MappedWrites
    real = cls.write

    def write(self, pieces, src):
        seen.append((threading.current_thread().name, src.shape[0]))
        real(self, pieces, src)

    monkeypatch.setattr(cls, "write", write)
    m, n, k = 2200, 1030, 40
    a, b = random_matrix((m, k), np.float64, seed=3), random_matrix((k, n), np.float64, seed=4)
    plan = make_plan(m, n, k, "float64", device_budget=64 << 20, staging=False,
                     tile=(1100, 1030, 40), order="stream")  # two 8.6 MiB tiles
    A, B = io.open_input(a), io.open_input(b)
    spec = f"{tmp_path / 'c.h5'}:/C"
    sink = io.open_output(spec, shape=(m, n), dtype=np.float64, inputs=[A, B], job={},
                          tile=(1100, 1030))
    assert sink.writes == mode and sink.parallel_writes
    execute(plan, A, B, sink, BACKENDS["numpy"](), io_threads=4)
    sink.close()
    assert len(seen) == 4 and all(name.startswith("bigmm-copy") for name, _ in seen)
    assert sum(rows for _, rows in seen) == m
    with io.open_input(spec) as src:
        got = np.full((m, n), np.nan)
        src.read(0, m, 0, n, got)
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("out, pieces", [
    ("array", 2),  # copies into memory: half the I/O threads (the readers copy meanwhile)
    ("file", 4),   # writes to storage wait on the device: all of them
])
def test_writer_threads_by_where_the_tiles_go(tmp_path, monkeypatch, out, pieces):
    from bigmm.io import direct

    monkeypatch.setattr(direct, "MODE", "mapped")
    m, n, k = 2200, 1030, 40
    a, b = random_matrix((m, k), np.float64, seed=3), random_matrix((k, n), np.float64, seed=4)
    plan = make_plan(m, n, k, "float64", device_budget=64 << 20, staging=False,
                     tile=(2200, 1030, 40), order="stream")  # one 17.3 MiB tile
    A, B = io.open_input(a), io.open_input(b)
    spec = f"{tmp_path / 'c.h5'}:/C" if out == "file" else None
    sink = io.open_output(spec, shape=(m, n), dtype=np.float64, inputs=[A, B], job={},
                          tile=(2200, 1030))
    seen = []
    real = type(sink).write

    def write(self, r0, r1, c0, c1, src):
        seen.append((threading.current_thread().name, r1 - r0))
        real(self, r0, r1, c0, c1, src)

    monkeypatch.setattr(type(sink), "write", write)
    execute(plan, A, B, sink, BACKENDS["numpy"](), io_threads=4)
    result = sink.result if out == "array" else None
    sink.close()
    assert len(seen) == pieces and sum(rows for _, rows in seen) == m  # a piece a thread
    assert all(name.startswith("bigmm-copy") for name, _ in seen)  # on the writer's pool
    if result is not None:
        np.testing.assert_allclose(result, a @ b, rtol=1e-12, atol=1e-12)


class _SlowCommits(ArraySink):
    """An array sink whose commits are slow (a disk flush), recording what each commit held,
    which tiles had been written when it began, and on which thread it ran."""

    resumable = True

    def __init__(self, array, fail_at: int | None = None):
        super().__init__(array, "C")
        self.lock = threading.Lock()
        self.written, self.commits, self.threads = [], [], set()
        self.fail_at = fail_at

    def write(self, r0, r1, c0, c1, src):
        super().write(r0, r1, c0, c1, src)
        with self.lock:
            self.written.append((r0, c0))

    def commit(self, tiles, samples=None):
        import time as _time

        with self.lock:
            done = list(self.written)
        self.threads.add(threading.current_thread().name)
        if self.fail_at is not None and len(self.commits) == self.fail_at:
            raise OSError(28, "No space left on device")
        _time.sleep(0.02)  # the flush
        self.commits.append((list(tiles), done))


def _tile_job():
    m, n, k = 64, 60, 8
    a, b = random_matrix((m, k), np.float64, seed=5), random_matrix((k, n), np.float64, seed=6)
    plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=False,
                     tile=(16, 20, 8), order="stream")  # 12 tiles
    return a, b, plan


def test_commits_run_beside_the_writes(monkeypatch):
    """Commits run on their own thread, one at a time, while later tiles are written; each
    commits only tiles written before it began; every tile is committed exactly once."""
    from bigmm.executor import tuning

    monkeypatch.setattr(tuning, "COMMIT_INTERVAL", 0)
    a, b, plan = _tile_job()
    out = np.full((64, 60), np.nan)
    sink = _SlowCommits(out)
    execute(plan, io.open_input(a), io.open_input(b), sink, BACKENDS["numpy"]())
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)
    committed = [tuple(t) for tiles, _ in sink.commits for t in tiles]
    assert sorted(committed) == sorted(set(committed)) and len(committed) == 12
    origin = {(i, j): (16 * i, 20 * j) for i in range(4) for j in range(3)}
    for tiles, done in sink.commits:
        assert all(origin[tuple(t)] in done for t in tiles)  # written before the commit began
    assert any(name.startswith("bigmm-commit") for name in sink.threads)
    assert len(sink.commits) < 12  # tiles written during a commit wait for the next one


def test_a_failed_commit_is_the_run_error(monkeypatch):
    from bigmm.executor import tuning

    monkeypatch.setattr(tuning, "COMMIT_INTERVAL", 0)
    a, b, plan = _tile_job()
    sink = _SlowCommits(np.full((64, 60), np.nan), fail_at=1)
    with pytest.raises(OSError, match="No space"):
        execute(plan, io.open_input(a), io.open_input(b), sink, BACKENDS["numpy"]())
    assert len(sink.commits) == 1  # nothing was committed after the failure
