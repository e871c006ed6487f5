"""Hand-made hostile HDF5 inputs: each gives the correct product or exactly one clear error
("Expected X. Got Y." naming the file or dataset), through the API and through the CLI (one
line on stderr, exit status 2, no traceback). Never a wrong answer."""

from __future__ import annotations

import os

import h5py
import hdf5plugin
import numpy as np
import pytest

import bigmm
from bigmm.cli import main
from bigmm.errors import (BigmmError, DiskFullError, DtypeError, OperandNotFound, ReadError,
                          ShapeError)
from bigmm.testing import random_matrix, reference_gemm, relative_error, sha256, tolerance

M, K, N = 40, 30, 20
HUGE = 10**7  # a declared 10^7 x 10^7 matrix: 364 TiB of float32, none of it written


def build(folder) -> dict:
    """Write the hostile files into ``folder``; returns the arrays the good cases hold."""
    a = random_matrix((M, K), np.float32, seed=1)
    b = random_matrix((K, N), np.float32, seed=2)
    path = os.path.join(folder, "h.h5")
    a.tofile(os.path.join(folder, "raw.bin"))
    with h5py.File(os.path.join(folder, "vsrc.h5"), "w") as f:
        f["S"] = a
    with h5py.File(os.path.join(folder, "other.h5"), "w") as f:
        f["A"] = a
    with h5py.File(os.path.join(folder, "ub.h5"), "w", userblock_size=512) as f:
        f["A"] = a
    with h5py.File(path, "w") as f:
        f["B"] = b
        f["B64"] = b.astype(np.float64)
        f["B_empty_cols"] = np.zeros((K, 0), np.float32)
        f["vec"] = a[0]
        f["cube"] = a.reshape(2, M // 2, K)
        f["scalar"] = np.float32(1.0)
        f.create_dataset("null", data=h5py.Empty("f4"))
        f["rows0"] = np.zeros((0, K), np.float32)
        f["cols0"] = np.zeros((M, 0), np.float32)
        f.create_dataset("tall_unwritten", shape=(20000, K), dtype="f4", chunks=(1000, K),
                         fillvalue=1.5)
        f.create_dataset("huge", shape=(HUGE, HUGE), dtype="f4", chunks=(1000, 1000),
                         fillvalue=1.0)
        f.create_dataset("unallocated", shape=(M, K), dtype="f4", fillvalue=2.5)
        part = f.create_dataset("partly", shape=(M, K), dtype="f4", chunks=(16, 16),
                                fillvalue=-3.0)
        part[:16, :16] = a[:16, :16]
        f.create_dataset("scaleoffset", data=a, chunks=(16, 16), scaleoffset=4)
        f.create_dataset("shuffle_fletcher", data=a, chunks=(16, 16), shuffle=True,
                         fletcher32=True)
        f.create_dataset("lzf", data=a, chunks=(16, 16), compression="lzf")
        f.create_dataset("blosc", data=a, chunks=(16, 16), **hdf5plugin.Blosc())
        f.create_dataset("zstd", data=a, chunks=(16, 16), **hdf5plugin.Zstd())
        f.create_dataset("gzip_be", data=a.astype(">f4"), chunks=(16, 16), compression="gzip",
                         shuffle=True)
        f["int"] = (a * 100).astype(np.int32)
        f["complex"] = a.astype(np.complex64)
        f["half"] = a.astype(np.float16)
        f["bool"] = a > 0
        f["be"] = a.astype(">f4")
        f.create_dataset("be64_chunked", data=a.astype(">f8"), chunks=(7, 9))
        f.create_group("grp")
        f.create_dataset("external", shape=(M, K), dtype="f4",
                         external=[(os.path.join(folder, "raw.bin"), 0, a.nbytes)])
        f.create_dataset("external_gone", shape=(M, K), dtype="f4",
                         external=[(os.path.join(folder, "gone.bin"), 0, a.nbytes)])
        for name, source in (("virtual", "vsrc.h5"), ("virtual_gone", "gone.h5")):
            layout = h5py.VirtualLayout(shape=(M, K), dtype="f4")
            layout[:, :] = h5py.VirtualSource(os.path.join(folder, source), "S", shape=(M, K))
            f.create_virtual_dataset(name, layout, fillvalue=0)
        f["soft"] = h5py.SoftLink("/be")
        f["dangling"] = h5py.SoftLink("/nothing")
        f["extlink"] = h5py.ExternalLink(os.path.join(folder, "other.h5"), "/A")
        f["extlink_gone"] = h5py.ExternalLink(os.path.join(folder, "gone.h5"), "/A")
    _unknown_filter_file(os.path.join(folder, "unknown_filter.h5"), a)
    with open(os.path.join(folder, "text.h5"), "w") as fh:
        fh.write("not an HDF5 file\n")
    open(os.path.join(folder, "empty.h5"), "wb").close()
    with open(os.path.join(folder, "corrupt.h5"), "wb") as fh:
        fh.write(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 8)
    return {"a": a, "b": b}


def _unknown_filter_file(path: str, a: np.ndarray) -> None:
    """A zstd-compressed dataset /A whose filter id (32015) is rewritten as 32767, an id no
    installed filter has (the file otherwise stays valid: its object headers carry no
    checksum)."""
    with h5py.File(path, "w") as f:
        f.create_dataset("A", data=a, chunks=(16, 16), **hdf5plugin.Zstd())
    data = bytearray(open(path, "rb").read())
    i = data.index(b"HDF5 zstd filter") - 8  # id, name length, flags, values, then the name
    assert data[i:i + 2] == (32015).to_bytes(2, "little")
    data[i:i + 2] = (32767).to_bytes(2, "little")
    open(path, "wb").write(bytes(data))


# case: A spec, B spec ("{h}" is h.h5, "{d}" the folder), then the expected outcome: a
# callable (a, b) -> the exact stored A the product must use, or (error, words in the message)
CASES = [
    # wrong rank
    ("rank-1", "{h}:/vec", "{h}:/B", (ShapeError, ["2-D", "(30,)", "/vec"])),
    ("rank-3", "{h}:/cube", "{h}:/B", (ShapeError, ["2-D", "3-D", "/cube"])),
    ("rank-0", "{h}:/scalar", "{h}:/B", (ShapeError, ["0-D", "/scalar"])),
    ("null-dataspace", "{h}:/null", "{h}:/B", (ShapeError, ["empty dataset", "/null"])),
    # zero-size dimensions: an error, not an empty result (the planner needs M, N, K >= 1)
    ("zero-rows", "{h}:/rows0", "{h}:/B", (ShapeError, ["at least one row", "(0, 30)"])),
    ("zero-inner", "{h}:/cols0", "{h}:/B", (ShapeError, ["at least one row", "(40, 0)"])),
    ("zero-cols-of-B", "{h}:/be", "{h}:/B_empty_cols", (ShapeError, ["(30, 0)", "B ("])),
    # declared shapes with no data written: fill values without reading or allocating it all
    ("tall-unwritten", "{h}:/tall_unwritten", "{h}:/B",
     lambda a, b: np.full((20000, K), 1.5, np.float32)),
    ("huge-unwritten", "{h}:/huge", "{h}:/huge", (DiskFullError, ["TiB", "free", "c.h5"])),
    ("unallocated", "{h}:/unallocated", "{h}:/B", lambda a, b: np.full((M, K), 2.5, np.float32)),
    ("partly-written", "{h}:/partly", "{h}:/B",
     lambda a, b: np.pad(a[:16, :16], ((0, M - 16), (0, K - 16)), constant_values=-3.0)),
    # filters
    ("unknown-filter", "{d}/unknown_filter.h5:/A", "{h}:/B",
     (ReadError, ["filter 32767", "not available", "unknown_filter.h5"])),
    ("scale-offset", "{h}:/scaleoffset", "{h}:/B", None),  # lossy: the values h5py reads
    ("shuffle-fletcher32", "{h}:/shuffle_fletcher", "{h}:/B", lambda a, b: a),
    ("lzf", "{h}:/lzf", "{h}:/B", lambda a, b: a),
    ("blosc", "{h}:/blosc", "{h}:/B", lambda a, b: a),
    ("zstd", "{h}:/zstd", "{h}:/B", lambda a, b: a),
    ("gzip-shuffle-big-endian", "{h}:/gzip_be", "{h}:/B", lambda a, b: a),
    # dtypes
    ("int32", "{h}:/int", "{h}:/B", (DtypeError, ["bfloat16, float32, float64", "int32"])),
    ("complex64", "{h}:/complex", "{h}:/B",
     (DtypeError, ["bfloat16, float32, float64", "complex64"])),
    ("float16", "{h}:/half", "{h}:/B", lambda a, b: a.astype(np.float16)),  # with float32 B
    ("bool", "{h}:/bool", "{h}:/B", (DtypeError, ["bfloat16, float32, float64", "bool"])),
    ("big-endian", "{h}:/be", "{h}:/B", lambda a, b: a),
    ("big-endian-f8-chunked", "{h}:/be64_chunked", "{h}:/B64", lambda a, b: a),
    ("mixed-dtypes", "{h}:/be64_chunked", "{h}:/B", lambda a, b: a),  # float64 @ float32
    # not a dataset, missing things, links
    ("group", "{h}:/grp", "{h}:/B", (OperandNotFound, ["/grp", "group"])),
    ("missing-dataset", "{h}:/nope", "{h}:/B", (OperandNotFound, ["/nope", "h.h5"])),
    ("missing-file", "{d}/nofile.h5:/A", "{h}:/B", (OperandNotFound, ["nofile.h5", "no such"])),
    ("soft-link", "{h}:/soft", "{h}:/B", lambda a, b: a),
    ("dangling-soft-link", "{h}:/dangling", "{h}:/B", (OperandNotFound, ["soft link", "/nothing"])),
    ("external-link", "{h}:/extlink", "{h}:/B", lambda a, b: a),
    ("broken-external-link", "{h}:/extlink_gone", "{h}:/B",
     (OperandNotFound, ["external link", "gone.h5"])),
    # storage outside the dataset's own bytes
    ("external-storage", "{h}:/external", "{h}:/B", lambda a, b: a),
    ("external-storage-gone", "{h}:/external_gone", "{h}:/B",
     (ReadError, ["readable", "/external_gone"])),
    ("virtual", "{h}:/virtual", "{h}:/B", lambda a, b: a),
    ("virtual-source-gone", "{h}:/virtual_gone", "{h}:/B",
     (OperandNotFound, ["virtual", "gone.h5"])),
    ("user-block", "{d}/ub.h5:/A", "{h}:/B", lambda a, b: a),
    # not HDF5 at all
    ("text-file", "{d}/text.h5:/A", "{h}:/B", (OperandNotFound, ["not HDF5", "text.h5"])),
    ("empty-file", "{d}/empty.h5:/A", "{h}:/B", (OperandNotFound, ["not HDF5", "empty.h5"])),
    ("corrupt-file", "{d}/corrupt.h5:/A", "{h}:/B",  # an HDF5 signature, then garbage
     (ReadError, ["readable HDF5 file", "corrupt.h5"])),
]
IDS = [c[0] for c in CASES]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("hostile"))
    arrays = build(folder)
    hashes = {p: sha256(os.path.join(folder, p)) for p in sorted(os.listdir(folder))}
    yield folder, arrays
    assert {p: sha256(os.path.join(folder, p)) for p in hashes} == hashes  # never modified


def specs(folder, a, b):
    h = os.path.join(folder, "h.h5")
    return a.format(h=h, d=folder), b.format(h=h, d=folder)


def expected_product(spec_a, spec_b, stored_a, arrays):
    """The float64 product of the A the case stores (h5py's reading when ``stored_a`` is
    None) and B."""
    if stored_a is None:
        path, name = spec_a.split(":/")
        with h5py.File(path, "r") as f:
            a = f[name][...]
    else:
        a = stored_a(arrays["a"], arrays["b"])
    path, name = spec_b.split(":/")
    with h5py.File(path, "r") as f:
        b = f[name][...]
    return reference_gemm(a, b), a.dtype, a.shape[1]


def check_message(message: str, words) -> None:
    assert message.startswith("Expected") and ". Got " in message, message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("case, a, b, outcome", CASES, ids=IDS)
def test_api(tmp_path, files, case, a, b, outcome):
    folder, arrays = files
    spec_a, spec_b = specs(folder, a, b)
    out = f"{tmp_path / 'c.h5'}:/C"
    if isinstance(outcome, tuple):
        error, words = outcome
        with pytest.raises(BigmmError) as err:
            bigmm.matmul(spec_a, spec_b, out=out, memory="1MiB", backend="numpy")
        assert type(err.value) is error, repr(err.value)
        check_message(str(err.value), words)
        return
    ref, dtype, k = expected_product(spec_a, spec_b, outcome, arrays)
    got = bigmm.matmul(spec_a, spec_b, memory="1MiB", backend="numpy")
    assert relative_error(got, ref) <= tolerance(dtype, k)


@pytest.mark.parametrize("case, a, b, outcome", CASES, ids=IDS)
def test_cli(tmp_path, files, capsys, case, a, b, outcome):
    folder, arrays = files
    spec_a, spec_b = specs(folder, a, b)
    out = f"{tmp_path / 'c.h5'}:/C"
    rc = main(["multiply", spec_a, spec_b, "-o", out, "--memory", "1MiB", "--backend", "numpy",
               "--quiet"])
    err = capsys.readouterr().err
    if isinstance(outcome, tuple):
        assert rc == 2 and "Traceback" not in err, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("bigmm: error: "), err
        check_message(lines[0][len("bigmm: error: "):], outcome[1])
        return
    assert rc == 0, err
    ref, dtype, k = expected_product(spec_a, spec_b, outcome, arrays)
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert relative_error(f["C"][...], ref) <= tolerance(dtype, k)


def test_huge_declared_input_into_an_array_is_a_clear_error(files):
    """out=None would need the 364 TiB C in memory: refused before anything is allocated."""
    folder, _ = files
    h = os.path.join(folder, "h.h5")
    with pytest.raises(bigmm.errors.OutputTooLarge) as err:
        bigmm.matmul(f"{h}:/huge", f"{h}:/huge", memory="64MiB", backend="numpy")
    check_message(str(err.value), ["TiB", "out="])
