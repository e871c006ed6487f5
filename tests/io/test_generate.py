"""generate(): seeded operands, the same for every write block size, in each layout."""

from __future__ import annotations

import h5py
import hdf5plugin  # noqa: F401  (reads zstd and lz4 datasets)
import numpy as np
import pytest

from bigmm.errors import (DiskFullError, DtypeError, OptionError, OutputExistsError,
                          OutputNotWritable, ShapeError, SpecError)
from bigmm.io.generate import UNIT, block, generate


def _read(path, name):
    with h5py.File(path, "r") as f:
        return f[name][...], f[name]


@pytest.mark.parametrize("shape, block_elements", [
    ((37, 53), 1),            # one row per block
    ((37, 53), 53 * 5 + 1),   # blocks that are not a multiple of anything
    ((1, 1), 1 << 20),        # a single element
    ((301, 1), 7),            # a column vector
    ((3, UNIT + 11), 100),    # rows straddle a random unit
])
def test_same_matrix_for_every_block_size(tmp_path, shape, block_elements):
    path = tmp_path / "g.h5"
    generate(f"{path}:/ref", shape, dtype="float64", seed=7)
    generate(f"{path}:/blk", shape, dtype="float64", seed=7, block_elements=block_elements)
    with h5py.File(path, "r") as f:
        ref, got = f["ref"][...], f["blk"][...]
    assert np.array_equal(ref, got)
    assert np.array_equal(ref, block(shape, 7, 0, shape[0]))
    assert ref.shape == shape and np.all(ref != 0)


@pytest.mark.parametrize("spec", ["g.h5:/A", "g.zarr"])  # HDF5, Zarr
def test_a_matrix_larger_than_the_disk_is_refused_before_writing(tmp_path, spec):
    # 10^8 x 10^8 float32 (40 PB): refused up front, nothing created
    with pytest.raises(DiskFullError, match="free on the file system"):
        generate(f"{tmp_path}/{spec}", (10**8, 10**8))
    assert not list(tmp_path.iterdir())


def test_seed_and_dtype(tmp_path):
    path = tmp_path / "s.h5"
    generate(f"{path}:/a64", (41, 29), dtype="float64", seed=1)
    generate(f"{path}:/a32", (41, 29), dtype="float32", seed=1)
    generate(f"{path}:/b", (41, 29), dtype="float64", seed=2)
    with h5py.File(path, "r") as f:
        a64, a32, b = f["a64"][...], f["a32"][...], f["b"][...]
    assert a32.dtype == np.float32 and a64.dtype == np.float64
    assert np.array_equal(a32, a64.astype(np.float32))  # float32 is the rounded float64 matrix
    assert not np.any(a64 == b)
    assert 0.8 < a64.std() < 1.2 and abs(a64.mean()) < 0.2


@pytest.mark.parametrize("layout, chunks, compression, want_chunks, filter_id", [
    ("contiguous", None, None, None, None),             # no chunks, no filter
    (None, None, None, None, None),                     # contiguous by default
    ("chunked", None, None, (97, 61), None),            # default chunks clipped to the shape
    ("chunked", (13, 7), None, (13, 7), None),          # explicit chunks
    (None, (13, 7), None, (13, 7), None),               # chunked by giving chunks
    ("compressed", (17, 19), "gzip", (17, 19), 1),      # deflate
    ("compressed", (17, 19), None, (17, 19), 1),        # deflate by default
    (None, None, "zstd", (97, 61), 32015),              # compressed by naming a codec
    ("compressed", None, "zstd", (97, 61), 32015),      # hdf5plugin Zstd
    ("compressed", (5, 61), "lz4", (5, 61), 32004),     # hdf5plugin LZ4
])
def test_layouts(tmp_path, layout, chunks, compression, want_chunks, filter_id):
    path = tmp_path / "l.h5"
    spec = generate(f"{path}:/grp/x", (97, 61), layout=layout, chunks=chunks,
                    compression=compression, seed=3, block_elements=1000)
    assert spec == f"{path}:/grp/x"
    with h5py.File(path, "r") as f:
        d = f["grp/x"]
        assert d.chunks == want_chunks
        plist = d.id.get_create_plist()
        ids = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
        assert ids == ([] if filter_id is None else [filter_id])
        assert np.array_equal(d[...], block((97, 61), 3, 0, 97, "float32"))
        assert d.attrs["bigmm_complete"]


@pytest.mark.parametrize("kwargs, error", [
    (dict(shape=(0, 5)), ShapeError),                    # empty dimension
    (dict(shape=(5,)), ShapeError),                      # 1-D
    (dict(shape=(2, 3, 4)), ShapeError),                 # 3-D
    (dict(shape=("7", 3)), ShapeError),                  # not integers
    (dict(shape=(3, 4), dtype="int32"), DtypeError),     # integer dtype
    (dict(shape=(3, 4), dtype="complex64"), DtypeError), # complex dtype
    (dict(shape=(3, 4), dtype="longdouble"), DtypeError),  # extended precision
    (dict(shape=(3, 4), layout="banana"), OptionError),  # unknown layout
    (dict(shape=(3, 4), layout="compressed", compression="snappy"), OptionError),  # codec
    (dict(shape=(3, 4), layout="contiguous", chunks=(2, 2)), OptionError),  # chunks, contiguous
    (dict(shape=(3, 4), layout="contiguous", compression="gzip"), OptionError),  # codec unused
    (dict(shape=(3, 4), layout="chunked", compression="gzip"), OptionError),  # codec unused
    (dict(shape=(3, 4), layout="chunked", chunks=(4, 2)), OptionError),  # chunk > shape
    (dict(shape=(3, 4), layout="chunked", chunks=(0, 2)), OptionError),  # empty chunk
    (dict(shape=(3, 4), seed=-1), OptionError),          # negative seed
    (dict(shape=(3, 4), block_elements=0), OptionError),  # empty write blocks
    (dict(shape=(3, 4), block_elements=2.5), OptionError),  # not an integer
])
def test_bad_arguments(tmp_path, kwargs, error):
    path = tmp_path / "e.h5"
    with pytest.raises(error, match="Expected"):
        generate(f"{path}:/x", **kwargs)
    if path.exists():
        with h5py.File(path, "r") as f:
            assert "x" not in f


def test_existing_output_is_kept_unless_overwrite(tmp_path):
    spec = f"{tmp_path / 'o.h5'}:/x"
    generate(spec, (11, 13), seed=1)
    before, _ = _read(tmp_path / "o.h5", "x")
    with pytest.raises(OutputExistsError, match="overwrite"):
        generate(spec, (11, 13), seed=2)
    assert np.array_equal(_read(tmp_path / "o.h5", "x")[0], before)
    generate(spec, (5, 3), seed=2, overwrite=True)
    after, _ = _read(tmp_path / "o.h5", "x")
    assert after.shape == (5, 3) and np.array_equal(after, block((5, 3), 2, 0, 5, "float32"))


@pytest.mark.parametrize("spec, error", [
    ("{tmp}/missing/dir/o.h5:/x", OutputNotWritable),   # directory does not exist
    ("{tmp}/o.h5", SpecError),                          # no dataset part
    ("{tmp}/not_hdf5.h5:/x", OutputNotWritable),        # existing file that is not HDF5
    ("{tmp}/d.h5:/D/x", OutputNotWritable),             # below a dataset, not a group
])
def test_bad_outputs(tmp_path, spec, error):
    (tmp_path / "not_hdf5.h5").write_text("plain text, not HDF5")
    generate(f"{tmp_path / 'd.h5'}:/D", (2, 2))
    with pytest.raises(error, match="Expected"):
        generate(spec.format(tmp=tmp_path), (3, 4))
    assert (tmp_path / "not_hdf5.h5").read_text() == "plain text, not HDF5"


@pytest.mark.parametrize("make, kind, words", [
    (lambda f: f.create_group("G"), h5py.Group, "a group"),  # a group: deleted before
    (lambda f: f.__setitem__("G", np.dtype("f4")), h5py.Datatype,
     "a committed datatype"),  # a named type
])
def test_overwrite_replaces_datasets_only(tmp_path, make, kind, words):
    path = tmp_path / "o.h5"
    with h5py.File(path, "w") as f:
        make(f)
        f["keep"] = [1.0]
    with pytest.raises(OutputNotWritable, match=f"Expected a dataset path.*Got {words}"):
        generate(f"{path}:/G", (3, 4), overwrite=True)
    with h5py.File(path, "r") as f:
        assert isinstance(f["G"], kind) and f["keep"][0] == 1.0  # left as it was


@pytest.mark.parametrize("name, words", [
    ("d.h5", "a directory"),         # a directory where the file goes
    ("not_hdf5.h5", "not HDF5"),     # a file of another format
])
def test_an_output_file_that_is_not_hdf5_is_named_as_such(tmp_path, name, words):
    (tmp_path / "d.h5").mkdir()
    (tmp_path / "not_hdf5.h5").write_text("plain text")
    with pytest.raises(OutputNotWritable, match=f"Expected .*HDF5 file.*Got '.*{name}'.*{words}"):
        generate(f"{tmp_path / name}:/x", (3, 4))


@pytest.mark.parametrize("link", [
    h5py.SoftLink("/nowhere"),              # a soft link to nothing
    h5py.ExternalLink("nofile.h5", "/X"),   # an external link to a missing file
], ids=["soft", "external"])
def test_a_link_to_nothing_is_replaced_only_with_overwrite(tmp_path, link):
    path = tmp_path / "o.h5"
    with h5py.File(path, "w") as f:
        f["L"] = link
    with pytest.raises(OutputExistsError, match="overwrite"):
        generate(f"{path}:/L", (3, 4))
    generate(f"{path}:/L", (3, 4), overwrite=True)
    assert _read(path, "L")[0].shape == (3, 4)


@pytest.mark.parametrize("args, error", [
    (((3, 4), -1, 0, 1), OptionError),   # negative seed
    (((3, 4), "x", 0, 1), OptionError),  # seed not an integer
    (((3, 4), 0, 0, 1.5), ShapeError),   # rows not integers
    (((3, 4), 0, 2, 1), ShapeError),     # r0 > r1
])
def test_block_refuses_bad_arguments(args, error):
    with pytest.raises(error, match="Expected .*Got"):
        block(*args)
