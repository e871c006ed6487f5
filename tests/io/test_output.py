"""open_output on HDF5 outputs: what it creates, overwrites, resumes or refuses (another job,
a broken or foreign file, places it cannot write, a null dataspace, an old C that does not
match) before any tile is written."""

import os

import h5py
import numpy as np
import pytest

from bigmm.errors import (DtypeError, OperandNotFound, OutputExistsError, OutputIsInputError,
                          OutputNotWritable, ResumeError, ShapeError)
from bigmm.io import open_input
from bigmm.testing import random_matrix
from sink_cases import JOB, SHAPE, finish_all, new_sink, read_back, sha, tiles, write_tiles


# (truncate C's file to this many bytes, resume recreates it): a run killed while HDF5 was
# creating the file it had just begun leaves a file HDF5 cannot open
BEGUN_FILE = [
    (96, True),    # cut inside the superblock, nothing journaled: created again, then resumed
    (0, True),     # an empty file
]


@pytest.mark.parametrize("size, recreated", BEGUN_FILE)
def test_resume_a_file_killed_while_being_created(tmp_path, inputs, size, recreated):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/C"
    new_sink(spec, srcs).close()  # journal written, file created, no tile finished
    os.truncate(f"{tmp_path}/out.h5", size)
    data = random_matrix(SHAPE, np.float32, seed=5)
    with new_sink(spec, srcs, resume=True) as sink:
        assert sink.done == frozenset()
        finish_all(sink, data)
    np.testing.assert_array_equal(read_back(spec), data)


def test_a_broken_file_the_run_did_not_create_is_not_recreated(tmp_path, inputs):
    _, srcs = inputs
    with h5py.File(tmp_path / "out.h5", "w") as f:
        f["other"] = np.arange(3)  # the user's file, C added to it
    spec = f"{tmp_path}/out.h5:/C"
    new_sink(spec, srcs).close()
    os.truncate(f"{tmp_path}/out.h5", 96)
    with pytest.raises(OSError):
        new_sink(spec, srcs, resume=True)
    assert os.path.getsize(f"{tmp_path}/out.h5") == 96


@pytest.mark.parametrize("resume, overwrite", [
    (True, False),   # --resume
    (False, True),   # --overwrite: the file is left alone all the same
])
@pytest.mark.parametrize("cut", [
    96,    # its superblock cut short
    None,  # its superblock whole, its second half gone
])
def test_a_broken_file_with_finished_tiles_is_one_error_and_kept(tmp_path, inputs, cut,
                                                                  resume, overwrite):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/C"
    sink = new_sink(spec, srcs)
    write_tiles(sink, random_matrix(SHAPE, np.float32), tiles()[:2])
    sink.commit(tiles()[:2])
    sink.close()
    size = cut or os.path.getsize(f"{tmp_path}/out.h5") // 2
    os.truncate(f"{tmp_path}/out.h5", size)
    # finished tiles were in it: never deleted behind the user
    with pytest.raises(OutputNotWritable, match="Expected an HDF5 file that opens"):
        new_sink(spec, srcs, resume=resume, overwrite=overwrite)
    assert os.path.getsize(f"{tmp_path}/out.h5") == size


@pytest.mark.parametrize("change, word", [
    ({"alpha": 2.0}, "alpha"),           # a different alpha
    ({"plan": "bm=8 bn=8"}, "plan"),     # a different plan
    ({"extra": 1}, "extra"),             # a key the recorded job lacks
])
def test_resume_with_another_job(tmp_path, inputs, change, word):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/C"
    new_sink(spec, srcs).close()
    with pytest.raises(ResumeError, match="Expected the job recorded") as err:
        new_sink(spec, srcs, resume=True, job={**JOB, **change})
    assert word in str(err.value)


def test_resume_without_journal(tmp_path, inputs):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/C"
    with new_sink(spec, srcs, resume=True) as sink:  # nothing to resume: the run starts
        assert not sink.complete and sink.done == frozenset()
        finish_all(sink, random_matrix(SHAPE, np.float32))
    with new_sink(spec, srcs, resume=True) as sink:  # finished by this job: complete
        assert sink.complete and sink.result == spec
    with pytest.raises(ResumeError, match="another job"):
        new_sink(spec, srcs, resume=True, job={**JOB, "alpha": 3.0})


def test_exists_and_overwrite_keeps_other_datasets(tmp_path, inputs):
    _, srcs = inputs
    path = str(tmp_path / "out.h5")
    keep = random_matrix((5, 7), np.float64, seed=5)
    with h5py.File(path, "w") as f:
        f["C"] = random_matrix((3, 3), np.float32)
        f["keep"] = keep
    with pytest.raises(OutputExistsError, match="overwrite") as err:
        new_sink(f"{path}:/C", srcs)
    assert f"{path}:/C" in str(err.value)
    data = random_matrix(SHAPE, np.float32, seed=6)
    with new_sink(f"{path}:/C", srcs, overwrite=True) as sink:
        finish_all(sink, data)
    np.testing.assert_array_equal(read_back(f"{path}:/C"), data)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["keep"][...], keep)


def test_output_is_input(tmp_path, inputs):
    path, srcs = inputs
    os.symlink(path, tmp_path / "link.h5")
    for spec in (f"{path}:/A", f"{tmp_path}/link.h5:B"):  # same file, or through a link
        with pytest.raises(OutputIsInputError, match="Expected an output other than the inputs"):
            new_sink(spec, srcs, overwrite=True)
    a = random_matrix(SHAPE, np.float32)
    with open_input(a) as src:
        with pytest.raises(OutputIsInputError, match="sharing memory"):
            new_sink(a[:, :], [src])


def test_unwritable_locations(tmp_path, inputs):
    _, srcs = inputs
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    cases = [
        (f"{tmp_path}/missing/c.h5:/C", "does not exist"),    # directory missing
        (f"{plain}/c.h5:/C", "is not a directory"),           # path under a regular file
        (f"{plain}:/C", "not HDF5"),                          # existing file that is not HDF5
        (f"{tmp_path}:/C", "a directory"),                    # a directory as the file
    ]
    for spec, word in cases:
        with pytest.raises(OutputNotWritable, match="Expected") as err:
            new_sink(spec, srcs)
        assert word in str(err.value), str(err.value)
    assert plain.read_text() == "x"


@pytest.mark.parametrize("dataset, word", [
    ("/A/C", "Expected a group at '/A'"),      # below a dataset
    ("/A/x/C", "Expected a group at '/A'"),    # below a dataset, through a missing group
    ("/T/C", "a committed datatype"),          # below a committed datatype
    ("/T", "which is a committed datatype"),   # a committed datatype itself
    ("/G", "which is a group"),                # a group itself
])
def test_output_path_through_a_non_group(tmp_path, inputs, dataset, word):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    with h5py.File(path, "w") as f:
        f["A"] = random_matrix((2, 2), np.float32)
        f["T"] = np.dtype("f4")
        f.create_group("G")
    before = sha(path)
    with pytest.raises(OutputNotWritable, match="Expected") as err:
        new_sink(f"{path}:{dataset}", srcs, overwrite=True)
    assert word in str(err.value) and ". Got " in str(err.value), str(err.value)
    assert sha(path) == before


@pytest.mark.parametrize("kw, error, word", [
    ({"overwrite": True}, None, None),                            # replaced as any other
    ({}, OutputExistsError, "overwrite"),                         # kept without overwrite
    ({"reads_c": True}, ShapeError, "empty dataset (no dataspace)"),  # old C for beta != 0
    ({"resume": True}, ResumeError, "not written by bigmm"),      # nothing to resume
    ({"dataset": True}, ShapeError, "empty dataset (no dataspace)"),  # an h5py.Dataset as out
])
def test_output_with_a_null_dataspace(tmp_path, inputs, kw, error, word):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("C", data=h5py.Empty("f4"))
    if kw.pop("dataset", False):
        with h5py.File(path, "a") as f, pytest.raises(error, match="Expected") as err:
            new_sink(f["C"], srcs)
        assert word in str(err.value)
        return
    if error is not None:
        with pytest.raises(error, match="Expected") as err:
            new_sink(f"{path}:/C", srcs, **kw)
        assert word in str(err.value)
        return
    data = random_matrix(SHAPE, np.float32, seed=19)
    with new_sink(f"{path}:/C", srcs, **kw) as sink:
        finish_all(sink, data)
    np.testing.assert_array_equal(read_back(f"{path}:/C"), data)


def test_an_empty_file_at_the_output_is_written_as_a_new_one(tmp_path, inputs):
    _, srcs = inputs  # what a kill leaves before HDF5 first writes a new file
    path = tmp_path / "c.h5"
    path.write_bytes(b"")
    data = random_matrix(SHAPE, np.float32, seed=17)
    with new_sink(f"{path}:/C", srcs) as sink:
        finish_all(sink, data)
    np.testing.assert_array_equal(read_back(f"{path}:/C"), data)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_directory(tmp_path, inputs):
    _, srcs = inputs
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(OutputNotWritable, match="permission denied"):
            new_sink(f"{locked}/c.h5:/C", srcs)
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("setup, error, word", [
    (None, OperandNotFound, "no such dataset"),            # C missing for beta != 0
    ((SHAPE[0] + 1, SHAPE[1]), ShapeError, "(98, 61)"),    # wrong shape
    ("float64", DtypeError, "float64"),                    # wrong dtype
])
def test_reads_c_needs_matching_c(tmp_path, inputs, setup, error, word):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    with h5py.File(path, "w") as f:
        f["other"] = random_matrix((2, 2), np.float32)
        if isinstance(setup, tuple):
            f["C"] = random_matrix(setup, np.float32)
        elif setup:
            f["C"] = random_matrix(SHAPE, setup)
    with pytest.raises(error, match="Expected") as err:
        new_sink(f"{path}:/C", srcs, reads_c=True)
    assert word in str(err.value)
    with pytest.raises(OperandNotFound, match="beta != 0"):
        new_sink(None, srcs, reads_c=True)


def _kept_beside(store, fmt, data):
    """A dataset (array) of the user's named as bigmm names a run's partial output of C."""
    if fmt == "h5":
        with h5py.File(store, "a") as f:
            f["C.bigmm-partial"] = data
        return lambda: h5py.File(store, "r")["C.bigmm-partial"][...]
    zarr = pytest.importorskip("zarr")
    zarr.open_array(store, path="C.bigmm-partial", mode="w", shape=data.shape,
                    dtype=data.dtype)[...] = data
    return lambda: zarr.open_array(store, path="C.bigmm-partial", mode="r")[...]


@pytest.mark.parametrize("fmt", ["h5", "zarr"])  # an HDF5 file, a Zarr store
@pytest.mark.parametrize("beta", [0.0, 1.0])  # C replaced, old C read
def test_a_dataset_at_the_partial_name_is_not_removed(tmp_path, fmt, beta):
    import bigmm

    a, b = random_matrix((6, 4), np.float64), random_matrix((4, 5), np.float64, 1)
    store = tmp_path / f"o.{fmt}"
    c = f"{store}:/C"
    bigmm.matmul(a, b, c, backend="numpy")
    kept = random_matrix((3, 3), np.float64, 2)
    read = _kept_beside(store, fmt, kept)
    with pytest.raises(OutputNotWritable, match=r"Expected nothing at .*bigmm-partial.*Got"):
        bigmm.matmul(a, b, c, beta=beta, overwrite=beta == 0, backend="numpy")
    np.testing.assert_array_equal(read(), kept)  # not removed (it was, with what it held)


@pytest.mark.parametrize("name", ["C.bigmm-partial", "C.bigmm-old"])  # bigmm's own names
@pytest.mark.parametrize("fmt", ["h5", "zarr"])
def test_an_output_named_as_bigmm_names_its_own_is_refused(tmp_path, fmt, name):
    import bigmm

    a, b = random_matrix((6, 4), np.float64), random_matrix((4, 5), np.float64, 1)
    with pytest.raises(OutputNotWritable, match="Expected an output name not ending in"):
        bigmm.matmul(a, b, f"{tmp_path / ('o.' + fmt)}:/{name}", backend="numpy")
    assert not list(tmp_path.iterdir())
