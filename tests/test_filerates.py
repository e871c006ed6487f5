"""The rates of a job's files in its predicted time: an input's cached share at the cached
rate, the rest at its disk's; C at its disk's write rate; the rates runs show kept for later
plans, only where a run's reads or writes were clearly of one kind. Real calibration stores
in a directory of the test's, real HDF5 files and runs."""

from __future__ import annotations

import h5py
import pytest

import bigmm
from bigmm import calibration, filerates
from bigmm.filerates import CACHED_KEY, READ_FIGURE, WRITE_FIGURE, Files, Input
from bigmm.planner import READ_RATE, WRITE_RATE
from bigmm.planner.search import CACHED_READ_RATE
from bigmm.runstats import RunStats
from bigmm.testing import random_matrix

GiB = 1 << 30


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(calibration.MODE_ENV, "")
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _run(read=2 * GiB, read_busy=1.0, written=GiB, write_busy=0.5) -> RunStats:
    return RunStats(seconds=2.0, flops=1, bytes_read=read, bytes_written=written,
                    tiles_done=1, tiles_skipped=0, tiles_total=1, read_busy=read_busy,
                    write_busy=write_busy)


def _kept() -> dict:
    """The store's figures by kind and key ("disk-read:8:1")."""
    return {name.replace('"', ''): value for name, (_at, value) in calibration.kept().items()}


def test_nominal_rates_until_a_run_showed_them(store):
    files = Files({"A": Input("8:1", 0.0, False), "B": Input("8:1", 1.0, False)}, "8:1")
    assert files.read_rate("A") == pytest.approx(READ_RATE)
    assert files.read_rate("B") == pytest.approx(CACHED_READ_RATE)
    assert files.read_rate("C") == READ_RATE  # not a file it knows of
    assert files.write_rate() == WRITE_RATE
    assert Files({}, None).write_rate() == WRITE_RATE


def test_kept_rates_mixed_by_the_share_cached(store):
    calibration.keep(READ_FIGURE, "8:1", 1e9)
    calibration.keep(READ_FIGURE, CACHED_KEY, 10e9)
    calibration.keep(WRITE_FIGURE, "8:2", 3e9)
    files = Files({"A": Input("8:1", 0.5, False), "B": Input("8:3", None, False)}, "8:2")
    assert files.read_rate("A") == pytest.approx(1 / (0.5 / 10e9 + 0.5 / 1e9))
    assert files.read_rate("B") == pytest.approx(READ_RATE)  # share unknown, disk not seen
    assert files.write_rate() == 3e9


def _files(a_dev, a_cached, b_dev, b_cached, out="8:1", decoded=False, b_layout="") -> Files:
    return Files({"A": Input(a_dev, a_cached, decoded),
                  "B": Input(b_dev, b_cached, decoded, b_layout)}, out)


@pytest.mark.parametrize("files, run, staged, expect", [
    # inputs cached: the cached rate, and C's disk's write rate (no reads beside the writes)
    (_files("8:1", 1.0, "8:1", 0.95), _run(), "AB",
     {f"{READ_FIGURE}:{CACHED_KEY}": 2 * GiB / 1.0, f"{WRITE_FIGURE}:8:1": GiB / 0.5}),
    # not cached, C on the same disk: its read rate only (the writes ran beside the reads)
    (_files("8:1", 0.0, "8:1", 0.05), _run(), "AB", {f"{READ_FIGURE}:8:1": 2 * GiB / 1.0}),
    # not cached, C on another disk: both
    (_files("8:1", 0.0, "8:1", 0.0, out="8:9"), _run(), "AB",
     {f"{READ_FIGURE}:8:1": 2 * GiB, f"{WRITE_FIGURE}:8:9": 2 * GiB}),
    # half cached: no read rate; C's disk was read too: no write rate
    (_files("8:1", 0.5, "8:1", 0.5), _run(), "AB", {}),
    # uncached inputs on two disks: no read rate
    (_files("8:1", 0.0, "8:2", 0.0, out=None), _run(), "AB", {}),
    # decoded chunks: the readers' time is decoding; C still written beside cached reads
    (_files("8:1", 1.0, "8:1", 1.0, decoded=True), _run(), "AB",
     {f"{WRITE_FIGURE}:8:1": 2 * GiB}),
    # too little read and written to show a rate
    (_files("8:1", 1.0, "8:1", 1.0), _run(read=GiB - 1, written=GiB - 1), "AB", {}),
    # B an array the host read too: the reads were not all of files
    (Files({"A": Input("8:1", 1.0, False)}, None), _run(), "AB", {}),
    # cached inputs of two layouts: no cached rate (each layout has its own)
    (_files("8:1", 1.0, "8:1", 1.0, out=None, b_layout="zarr"), _run(), "AB", {}),
    # only A staged (B in place): A's reads are the run's
    (Files({"A": Input("8:1", 1.0, False)}, None), _run(), "A",
     {f"{READ_FIGURE}:{CACHED_KEY}": 2 * GiB}),
])
def test_what_a_run_shows(store, files, run, staged, expect):
    names = filerates.learn(files, run, staged)
    assert sorted(names) == sorted(expect)
    assert _kept() == pytest.approx(expect)


def test_a_run_reading_the_old_c_shows_no_read_rate(store):
    names = filerates.learn(_files("8:1", 1.0, "8:1", 1.0), _run(), "AB", reads_c=True)
    assert names == [f"{WRITE_FIGURE}:8:1"]


def test_a_rate_shown_again_is_kept_as_the_mean(store):
    files = Files({"A": Input("8:1", 1.0, False, "chunked")}, None)
    filerates.learn(files, _run(read_busy=1.0), "A")
    filerates.learn(files, _run(read_busy=0.5), "A")
    assert _kept() == pytest.approx({f"{READ_FIGURE}:{CACHED_KEY} chunked": 3 * GiB})
    calibration.keep(READ_FIGURE, f"{CACHED_KEY} zarr", 20e9)  # another layout's: not A's
    assert files.read_rate("A") == pytest.approx(3 * GiB)


def test_nothing_kept_with_the_store_off(store, monkeypatch):
    monkeypatch.setenv(calibration.MODE_ENV, "off")
    assert filerates.learn(_files("8:1", 1.0, "8:1", 1.0), _run()) == []
    monkeypatch.setenv(calibration.MODE_ENV, "")
    assert _kept() == {}


def test_a_run_on_files_teaches_the_next_plan(store, tmp_path, monkeypatch):
    monkeypatch.setattr(filerates, "LEARN_BYTES", 1 << 16)  # a small job shows its rates
    for name, shape in (("a", (517, 389)), ("b", (389, 263))):
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:  # just written: cached
            f.create_dataset("X", data=random_matrix(shape, seed=len(name)))
    a, b = f"{tmp_path}/a.h5:/X", f"{tmp_path}/b.h5:/X"
    before = bigmm.plan(a, b, f"{tmp_path}/c0.h5:/C", memory="1MiB")
    assert before.rates.write_bytes == WRITE_RATE
    _, run = bigmm.matmul(a, b, f"{tmp_path}/c.h5:/C", memory="1MiB", stats=True)
    kept = _kept()
    assert kept[f"{READ_FIGURE}:{CACHED_KEY} contiguous"] == pytest.approx(
        run.bytes_read / run.read_busy)
    ((name, rate),) = [(k, v) for k, v in kept.items() if k.startswith(WRITE_FIGURE)]
    assert rate == pytest.approx(run.bytes_written / run.write_busy)
    after = bigmm.plan(a, b, f"{tmp_path}/c2.h5:/C", memory="1MiB")
    assert after.rates.write_bytes == pytest.approx(rate)
    assert after.rates.read_bytes == pytest.approx(run.bytes_read / run.read_busy, rel=0.02)
    assert (after.bm, after.bn, after.bk, after.order) == (before.bm, before.bn, before.bk,
                                                           before.order)  # the same tiles


def test_an_input_file_gone_before_the_look_is_passed_over(tmp_path):
    import hdf5plugin

    from bigmm import io

    with h5py.File(tmp_path / "a.h5", "w") as f:  # read through h5py (a plugin filter)
        f.create_dataset("A", data=random_matrix((64, 64)), chunks=(32, 32), **hdf5plugin.LZ4())
    with h5py.File(tmp_path / "b.h5", "w") as f:  # read raw
        f.create_dataset("B", data=random_matrix((64, 64)))
    A, B = io.open_input(f"{tmp_path}/a.h5:/A"), io.open_input(f"{tmp_path}/b.h5:/B")
    try:
        (tmp_path / "a.h5").unlink()
        (tmp_path / "b.h5").unlink()
        files = filerates.look(A, B, f"{tmp_path}/c.h5:/C")
        assert "A" not in files.inputs and files.inputs["B"].cached is None
        assert files.read_rate("B") == pytest.approx(READ_RATE) and files.output is not None
    finally:
        A.close()
        B.close()


@pytest.mark.parametrize("files, kept, expect", [
    # nothing shown yet: every rate nominal, said once
    (_files("8:1", 0.03, "8:1", 1.0), {},
     "A 3%, B 100% cached; disk reads 2.0 GB/s, cached reads 8.0 GB/s, C writes 1.0 GB/s "
     "(nominal: no run has shown them)"),
    # every rate shown by runs
    (_files("8:1", 0.0, "8:1", 0.0, out=None), {(READ_FIGURE, "8:1"): 1.2e9},
     "A 0%, B 0% cached; disk reads 1.2 GB/s (as earlier runs showed)"),
    # some shown, some nominal: each nominal one said so
    (_files("8:1", 1.0, "8:1", 1.0), {(WRITE_FIGURE, "8:1"): 1.9e9},
     "A 100%, B 100% cached; cached reads 8.0 GB/s (nominal), C writes 1.9 GB/s"),
    # inputs on two disks, one shown: a rate each
    (_files("8:1", 0.0, "8:2", 0.0, out=None), {(READ_FIGURE, "8:2"): 1.2e9},
     "A 0%, B 0% cached; disk reads 2.0 GB/s (nominal), disk reads 1.2 GB/s"),
    # no file at all
    (Files({}, None), {}, ""),
])
def test_the_files_as_the_plan_prints_them(store, files, kept, expect):
    for (kind, key), value in kept.items():
        calibration.keep(kind, key, value)
    assert files.describe() == expect


def test_a_plan_of_files_prints_them(tmp_path):
    with h5py.File(tmp_path / "ab.h5", "w") as f:
        f["A"], f["B"] = random_matrix((64, 48)), random_matrix((48, 40))
    a, b = f"{tmp_path}/ab.h5:/A", f"{tmp_path}/ab.h5:/B"
    text = str(bigmm.plan(a, b, f"{tmp_path}/c.h5:/C", memory="1MiB"))
    assert "\nfiles           A 100%, B 100% cached; cached reads " in text  # just written
    assert "C writes" in text
    assert "\nfiles " not in str(bigmm.plan(random_matrix((64, 48)), random_matrix((48, 40)),
                                            memory="1MiB"))  # arrays: none
