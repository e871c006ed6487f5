"""bigmm.matmul and bigmm.plan end to end: real HDF5 files, every bad input, kill and resume."""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

import bigmm
from bigmm import api, errors, job
from bigmm.backends.numpy import NumpyBackend
from bigmm.executor import RunStats
from bigmm.planner import Plan, make_plan
from bigmm.testing import (random_matrix, reference_gemm, relative_error, tolerance,
                            wait_for_journaled_tiles)


def _h5(path, name, array, **kw) -> str:
    with h5py.File(path, "a") as f:
        f.create_dataset(name, data=array, **kw)
    return f"{path}:/{name}"


def _budget(dtype, tile=24) -> int:
    """Bytes for about four tile x tile x tile panels: forces many tiles and K panels."""
    return 10 * tile * tile * np.dtype(dtype).itemsize


LAYOUTS = {
    "numpy": None,
    "contiguous": {},
    "chunked": {"chunks": (13, 7)},
    "gzip": {"chunks": (16, 16), "compression": "gzip"},
}


def _operand(tmp_path, name, array, layout):
    if LAYOUTS[layout] is None:
        return array
    kw = dict(LAYOUTS[layout])
    if "chunks" in kw:  # chunks no larger than the dataset
        kw["chunks"] = tuple(min(c, d) for c, d in zip(kw["chunks"], array.shape))
    return _h5(tmp_path / f"{name.lower()}.h5", name, array, **kw)


CASES = [
    # (m, n, k, dtype, layout, trans_a, trans_b, alpha)
    (1, 1, 1, np.float64, "contiguous", False, False, 1.0),  # 1x1x1
    (1, 97, 1, np.float64, "numpy", False, False, 1.0),  # one row of C, depth 1
    (97, 1, 1, np.float32, "contiguous", True, False, 1.0),  # one column of C
    (1, 1, 211, np.float64, "chunked", False, True, 1.0),  # a dot product, K panels only
    (37, 41, 43, np.float64, "contiguous", False, False, -0.5),  # primes
    (37, 41, 43, np.float32, "gzip", True, True, 2.0),  # compressed, both transposed
    (211, 3, 5, np.float64, "chunked", False, True, 1.0),  # tall-skinny
    (7, 5, 401, np.float64, "gzip", True, False, 1.0),  # K much larger than M and N
    (67, 59, 73, np.float32, "numpy", True, True, 1.0),  # arrays, both transposed
    (89, 71, 53, np.float64, "chunked", True, False, 0.25),  # chunks dividing nothing
]


@pytest.mark.parametrize("m,n,k,dtype,layout,ta,tb,alpha", CASES)
def test_matmul_matches_reference(tmp_path, m, n, k, dtype, layout, ta, tb, alpha):
    a = random_matrix((k, m) if ta else (m, k), dtype, seed=m)
    b = random_matrix((n, k) if tb else (k, n), dtype, seed=n + 1)
    out, stats = bigmm.matmul(_operand(tmp_path, "A", a, layout),
                              _operand(tmp_path, "B", b, layout), alpha=alpha, trans_a=ta,
                              trans_b=tb, memory=_budget(dtype), backend="numpy", stats=True)
    assert isinstance(out, np.ndarray) and out.dtype == dtype and out.shape == (m, n)
    ref = reference_gemm(a, b, alpha=alpha, trans_a=ta, trans_b=tb)
    assert relative_error(out, ref) <= tolerance(dtype, k)
    assert isinstance(stats, RunStats) and stats.tiles_done == stats.tiles_total


BETA_CASES = [
    # (out kind, beta, trans_a, trans_b)
    ("h5", 0.0, False, False),  # old C full of NaN is overwritten, never read
    ("h5", 0.5, False, True),  # old C read and scaled
    ("h5", -1.0, True, True),  # negative beta, both transposed
    ("array", 0.0, True, False),  # NaN array written in place
    ("array", 2.0, False, False),  # array accumulated in place
    ("dataset", 0.0, True, False),  # an open h5py.Dataset, written in place
]


@pytest.mark.parametrize("kind,beta,ta,tb", BETA_CASES)
def test_alpha_beta_and_outputs(tmp_path, kind, beta, ta, tb):
    m, n, k = 45, 38, 61
    a = random_matrix((k, m) if ta else (m, k), np.float64, 1)
    b = random_matrix((n, k) if tb else (k, n), np.float64, 2)
    c0 = random_matrix((m, n), np.float64, 3) if beta else np.full((m, n), np.nan)
    spec_a, spec_b = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    kw = dict(alpha=1.5, beta=beta, trans_a=ta, trans_b=tb, memory=_budget(np.float64),
              backend="numpy")
    if kind == "h5":
        spec_c = _h5(tmp_path / "c.h5", "C", c0)
        assert bigmm.matmul(spec_a, spec_b, spec_c, overwrite=beta == 0, **kw) == spec_c
        with h5py.File(tmp_path / "c.h5", "r") as f:
            got = f["C"][...]
    elif kind == "array":
        got = c0.copy()
        assert bigmm.matmul(spec_a, spec_b, got, **kw) is got
    else:
        _h5(tmp_path / "c.h5", "C", c0)
        with h5py.File(tmp_path / "c.h5", "r+") as f:
            bigmm.matmul(spec_a, spec_b, f["C"], **kw)
            got = f["C"][...]
    ref = reference_gemm(a, b, alpha=1.5, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(got, ref) <= tolerance(np.float64, k)


def test_plan_is_the_plan_matmul_runs_and_writes_nothing(tmp_path):
    a, b = random_matrix((90, 70), np.float64), random_matrix((70, 50), np.float64, 1)
    spec_a, spec_b = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    spec_c = f"{tmp_path / 'c.h5'}:/C"
    p = bigmm.plan(spec_a, spec_b, spec_c, memory="40KiB", backend="numpy")
    assert isinstance(p, Plan) and (p.m, p.n, p.k) == (90, 50, 70) and p.n_tiles > 1
    assert p.predicted_seconds is not None and "C tiles" in str(p)
    assert not os.path.exists(tmp_path / "c.h5")
    _, stats = bigmm.matmul(spec_a, spec_b, spec_c, memory="40KiB", backend="numpy",
                            stats=True)
    assert stats.tiles_total == p.n_tiles and stats.flops == p.flops


def test_progress_and_size_strings(tmp_path):
    a, b = random_matrix((50, 40), np.float32), random_matrix((40, 30), np.float32, 1)
    seen = []
    out = bigmm.matmul(a, b, memory="24KB", progress=seen.append, backend="numpy")
    assert relative_error(out, reference_gemm(a, b)) <= tolerance(np.float32, 40)
    assert len(seen) > 1 and seen[-1].tiles_done == seen[-1].tiles_total


# ----- bad inputs -----------------------------------------------------------------------------

def _digest(paths) -> dict:
    return {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}


@pytest.fixture
def files(tmp_path):
    """A (30x20), B (20x10) and assorted bad datasets in HDF5 files."""
    a, b = random_matrix((30, 20), np.float64), random_matrix((20, 10), np.float64, 1)
    p = tmp_path / "in.h5"
    with h5py.File(p, "w") as f:
        f["A"], f["B"], f["B32"] = a, b, b.astype(np.float32)
        f["Bwide"] = random_matrix((21, 10), np.float64, 2)
        f["v1"] = random_matrix((20,), np.float64, 3)
        f["v3"] = random_matrix((20, 10, 2), np.float64, 4)
        f["i"] = np.arange(200, dtype=np.int64).reshape(20, 10)
        f["z"] = (random_matrix((20, 10), np.float64) + 1j).astype(np.complex128)
        f["s"] = np.array([[b"x"] * 10] * 20)
        f.create_group("grp")
    c = tmp_path / "c.h5"
    with h5py.File(c, "w") as f:
        f["C"] = random_matrix((30, 10), np.float64, 5)
    (tmp_path / "afile").write_text("not a directory")
    return tmp_path, f"{p}:/A", f"{p}:/B", f"{c}:/C"


BAD = [
    # (description, a, b, out, keywords, error, words the message must contain)
    ("inner dimensions differ", "{A}", "{in}:/Bwide", None, {},
     errors.ShapeError, ["30x20", "21x10", "20 != 21"]),
    ("1-D dataset", "{A}", "{in}:/v1", None, {}, errors.ShapeError, ["2-D", "v1"]),
    ("3-D dataset", "{in}:/v3", "{B}", None, {}, errors.ShapeError, ["2-D", "v3"]),
    ("integer dtype", "{A}", "{in}:/i", None, {}, errors.DtypeError, ["int64", "float32"]),
    ("complex dtype", "{A}", "{in}:/z", None, {}, errors.DtypeError, ["complex128"]),
    ("string dtype", "{in}:/s", "{B}", None, {}, errors.DtypeError, ["Expected", "/s"]),
    ("out_dtype narrower than float64 operands", "{A}", "{in}:/B32", None,
     {"out_dtype": "float32"}, errors.OptionError, ["out_dtype=float64", "float32"]),
    ("out_dtype against an existing array", "{A}", "{B}", "array", {"out_dtype": "float32"},
     errors.DtypeError, ["existing output", "float64"]),
    ("missing file", "{dir}/nope.h5:/A", "{B}", None, {},
     errors.OperandNotFound, ["nope.h5"]),
    ("missing dataset", "{in}:/nothing", "{B}", None, {},
     errors.OperandNotFound, ["/nothing"]),
    ("a group, not a dataset", "{in}:/grp", "{B}", None, {},
     errors.OperandNotFound, ["grp"]),
    ("output exists", "{A}", "{B}", "{C}", {}, errors.OutputExistsError, ["overwrite"]),
    ("output is an input", "{A}", "{B}", "{A}", {"overwrite": True},
     errors.OutputIsInputError, ["/A"]),
    ("budget below the minimum", "{A}", "{B}", "{dir}/new.h5:/C", {"memory": 100},
     errors.BudgetError, ["at least", "Got 100 bytes"]),
    ("unparseable size", "{A}", "{B}", None, {"memory": "8 gigglebytes"},
     errors.SizeParseError, ["8 gigglebytes", "8GiB"]),
    ("negative size", "{A}", "{B}", None, {"memory": -5}, errors.SizeParseError, ["-5"]),
    ("output directory missing", "{A}", "{B}", "{dir}/no/such/dir/c.h5:/C", {},
     errors.OutputNotWritable, ["no/such/dir"]),
    ("output directory is a file", "{A}", "{B}", "{dir}/afile/c.h5:/C", {},
     errors.OutputNotWritable, ["afile"]),
    ("beta without an existing C", "{A}", "{B}", None, {"beta": 1.0},
     errors.ShapeError, ["beta", "out=None"]),
    ("resume into an array", "{A}", "{B}", "array", {"resume": True},
     errors.ResumeError, ["NumPy array", "journal"]),
    ("unknown backend", "{A}", "{B}", None, {"backend": "tpu"},
     errors.BackendUnavailable, ["'tpu'", "numpy"]),
    ("malformed spec", "{dir}/in.h5", "{B}", None, {}, errors.SpecError, ["file.h5:/dataset"]),
    ("progress not callable", "{A}", "{B}", "{dir}/new.h5:/C", {"progress": 5},
     errors.OptionError, ["progress", "callable", "5"]),
    ("progress taking no Progress", "{A}", "{B}", "{dir}/new.h5:/C",
     {"progress": lambda: None}, errors.OptionError, ["progress", "taking a Progress"]),
    ("profile in a missing folder", "{A}", "{B}", "{dir}/new.h5:/C",
     {"profile": "{dir}/no/such/run"}, errors.OptionError, ["profile", "does not exist"]),
    ("profile of another type", "{A}", "{B}", "{dir}/new.h5:/C", {"profile": 5},
     errors.OptionError, ["profile", "Profile"]),
    ("big-endian output array", "{A}", "{B}", "big-endian", {},
     errors.DtypeError, ["float64 in this machine's byte order", "big-endian"]),
    ("output whose elements overlap", "{A}", "{B}", "self-overlapping", {},
     errors.OutputIsInputError, ["distinct", "strides"]),
]


@pytest.mark.parametrize("what,a,b,out,kw,err,words", BAD, ids=[c[0] for c in BAD])
def test_bad_input_gives_one_clear_error(files, what, a, b, out, kw, err, words):
    tmp, spec_a, spec_b, spec_c = files
    fill = dict(A=spec_a, B=spec_b, C=spec_c, dir=str(tmp), **{"in": str(tmp / "in.h5")})
    a, b = a.format(**fill), b.format(**fill)
    out = out.format(**fill) if out else None
    kw = {key: value.format(**fill) if isinstance(value, str) else value
          for key, value in kw.items()}
    if out == "array":
        out = np.zeros((30, 10))
    elif out == "big-endian":
        out = np.zeros((30, 10), ">f8")
    elif out == "self-overlapping":  # writeable, each row the same memory shifted by one
        out = np.lib.stride_tricks.as_strided(np.zeros(40), shape=(30, 10), strides=(8, 8))
    before = _digest([tmp / "in.h5", tmp / "c.h5"])
    with pytest.raises(err) as e:
        bigmm.matmul(a, b, out, **{"backend": "numpy", **kw})
    msg = str(e.value)
    assert "Expected" in msg and all(w in msg for w in words), msg
    assert _digest([tmp / "in.h5", tmp / "c.h5"]) == before  # inputs and old C untouched
    assert not glob.glob(str(tmp / "new.h5*"))  # nothing created


@pytest.mark.parametrize("profile", [
    "",      # no prefix at all: ".trace.json" in the current folder
    "{dir}/",  # a folder, no file name: hidden files in it
])
def test_profile_prefix_without_a_file_name_is_refused(files, monkeypatch, profile):
    tmp, spec_a, spec_b, _ = files
    monkeypatch.chdir(tmp)
    before = sorted(os.listdir(tmp))
    with pytest.raises(errors.OptionError, match=r"Expected profile as a path prefix.*Got"):
        bigmm.matmul(spec_a, spec_b, "new.h5:/C", backend="numpy",
                     profile=profile.format(dir=tmp))
    assert sorted(os.listdir(tmp)) == before  # no output, no trace


def test_plan_refuses_an_out_of_the_wrong_shape(files):
    # as matmul does, before it plans anything
    _, spec_a, spec_b, _ = files
    with pytest.raises(errors.ShapeError, match=r"Expected shape \(30, 10\).*Got \(5, 5\)"):
        bigmm.plan(spec_a, spec_b, np.zeros((5, 5)), backend="numpy")
    with pytest.raises(errors.ShapeError, match=r"Expected shape \(30, 10\)"):
        bigmm.matmul(spec_a, spec_b, np.zeros((5, 5)), backend="numpy")


@pytest.mark.parametrize("out, beta, err, words", [
    ("{dir}/new.h5:/C", 1.0, errors.OperandNotFound, ["beta != 0", "new.h5"]),  # no file
    ("{dir}/c.h5:/missing", 1.0, errors.OperandNotFound, ["/missing"]),  # no dataset
    ("{dir}/in.h5:/Bwide", 1.0, errors.ShapeError, ["(30, 10)", "(21, 10)"]),  # old C's shape
    ("{dir}/null.h5:/C", 1.0, errors.ShapeError, ["no dataspace"]),  # old C with no dataspace
    ("dataset", 0.0, errors.ShapeError, ["no dataspace"]),  # an h5py.Dataset, no dataspace
    ("{dir}/no/such/dir/c.h5:/C", 0.0, errors.OutputNotWritable, ["no/such/dir"]),  # no folder
    ("{dir}/afile/c.h5:/C", 0.0, errors.OutputNotWritable, ["afile"]),  # folder is a file
    ("{dir}/afile:/C", 0.0, errors.OutputNotWritable, ["not HDF5"]),  # a file not HDF5
])
def test_plan_refuses_an_output_matmul_refuses(files, out, beta, err, words):
    tmp, spec_a, spec_b, _ = files
    with h5py.File(tmp / "null.h5", "w") as f:
        f.create_dataset("C", data=h5py.Empty("f8"))
    before = _digest([tmp / "in.h5", tmp / "c.h5", tmp / "null.h5"])
    with h5py.File(tmp / "null.h5", "r+") as f:
        target = f["C"] if out == "dataset" else out.format(dir=tmp)
        for call in (bigmm.plan, bigmm.matmul):
            with pytest.raises(err) as e:
                call(spec_a, spec_b, target, beta=beta, backend="numpy")
            msg = str(e.value)
            assert msg.startswith("Expected") and all(w in msg for w in words), msg
    assert _digest([tmp / "in.h5", tmp / "c.h5", tmp / "null.h5"]) == before
    assert not glob.glob(str(tmp / "new.h5*"))


def _in_place(kind, tmp):
    """An output of (30, 10) float64 written in place, of one kind that cannot take C."""
    if kind == "masked array":
        return np.ma.masked_array(np.zeros((30, 10)), mask=False)
    if kind in ("read-only array", "array to resume", "array beside itself"):
        if kind == "array beside itself":  # each row the same memory shifted by one
            return np.lib.stride_tricks.as_strided(np.zeros(40), (30, 10), (8, 8))
        out = np.zeros((30, 10))
        out.flags.writeable = kind != "read-only array"
        return out
    if kind.startswith("dataset"):
        with h5py.File(tmp / "d.h5", "w") as f:
            f["C"] = np.zeros((30, 10))
        return h5py.File(tmp / "d.h5", "r" if kind == "dataset read-only" else "r+")["C"]
    zarr = pytest.importorskip("zarr")
    if kind == "zarr in memory":
        return zarr.zeros((30, 10), dtype="f8")
    zarr.open_array(tmp / "z.zarr", mode="w", shape=(30, 10), dtype="f8")
    return zarr.open_array(tmp / "z.zarr", mode="r" if kind == "zarr read-only" else "r+")


@pytest.mark.parametrize("kind, kw, err, words", [
    ("read-only array", {}, errors.OutputNotWritable, ["writeable"]),  # not writeable
    ("array beside itself", {}, errors.OutputIsInputError, ["distinct"]),  # overlapping rows
    ("array to resume", {"resume": True}, errors.ResumeError, ["journal"]),  # no journal
    ("masked array", {}, errors.SpecError, ["masked"]),  # its mask would hide part of C
    ("dataset read-only", {}, errors.OutputNotWritable, ["read-only"]),  # file opened "r"
    ("dataset with beta", {"beta": 1.0}, errors.OptionError, ["beta != 0"]),  # old C in place
    ("zarr read-only", {}, errors.OutputNotWritable, ["read-only"]),  # array opened "r"
    ("zarr in memory", {}, errors.OutputNotWritable, ["local directory store"]),  # no files
    ("zarr with beta", {"beta": 1.0}, errors.OptionError, ["beta != 0"]),  # old C in place
])
def test_plan_refuses_an_in_place_output_matmul_refuses(files, kind, kw, err, words):
    tmp, spec_a, spec_b, _ = files
    out = _in_place(kind, tmp)
    try:
        for call in (bigmm.plan, bigmm.matmul):
            with pytest.raises(err) as e:
                call(spec_a, spec_b, out, backend="numpy", **kw)
            msg = str(e.value)
            assert msg.startswith("Expected") and all(w in msg for w in words), msg
    finally:
        if kind.startswith("dataset"):
            out.file.close()


@pytest.mark.parametrize("out", [
    "spec",     # A's file and dataset, named again
    "dataset",  # A's dataset, open in h5py
    "array",    # A's array
])
def test_plan_refuses_an_out_that_is_an_input_as_matmul_does(files, out):
    tmp, spec_a, _, _ = files
    b = np.eye(20)  # C has A's shape
    with h5py.File(tmp / "in.h5", "r+") as f:
        a = {"spec": spec_a, "dataset": f["A"], "array": f["A"][...]}[out]
        with pytest.raises(errors.OutputIsInputError, match="other than the inputs") as planned:
            bigmm.plan(a, b, a, backend="numpy")
        with pytest.raises(errors.OutputIsInputError) as run:
            bigmm.matmul(a, b, a, backend="numpy", overwrite=True)
    assert str(planned.value) == str(run.value)


@pytest.mark.parametrize("place,words", [
    ("text", "which is not HDF5"),  # a text file where C's HDF5 file would be
    ("folder", "(a directory)"),    # a directory there
])
def test_plan_refuses_an_out_that_cannot_hold_c_as_matmul_does(files, place, words):
    tmp, spec_a, spec_b, _ = files
    path = tmp / "c-place.h5"
    if place == "text":
        path.write_text("not HDF5")
    else:
        path.mkdir()
    with pytest.raises(errors.OutputNotWritable, match=re.escape(words)) as planned:
        bigmm.plan(spec_a, spec_b, f"{path}:/C", backend="numpy")
    with pytest.raises(errors.OutputNotWritable) as run:
        bigmm.matmul(spec_a, spec_b, f"{path}:/C", backend="numpy")
    assert str(planned.value) == str(run.value)


def test_closed_datasets_are_one_clear_error(files):
    tmp, _, _, _ = files
    f = h5py.File(tmp / "in.h5", "r+")
    a, c = f["A"], f["B"]
    f.close()
    with pytest.raises(errors.SpecError, match="open h5py.Dataset for A"):
        bigmm.matmul(a, np.ones((20, 10)), backend="numpy")
    with pytest.raises(errors.OutputNotWritable, match="open h5py.Dataset for C"):
        bigmm.matmul(np.ones((20, 20)), np.ones((20, 10)), c, backend="numpy")


def test_bfloat16_and_resumed_datasets_given_as_out(tmp_path):
    # a dataset in bigmm's bfloat16 type takes the result (its dtype decides C's); resume=True
    # into a dataset holding another job's finished C is an error, as for a spec
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a, b = random_matrix((64, 48), np.float32, 1), random_matrix((48, 32), np.float32, 2)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        d = f.create_dataset("C", (64, 32), dtype=h5py.Datatype(bigmm.io.h5_type("bfloat16")))
        bigmm.matmul(a, b, d, backend="numpy")
    got = bigmm.matmul(f"{tmp_path}/c.h5:/C", np.eye(32, dtype=np.float32), backend="numpy")
    assert relative_error(got, a @ b) <= tolerance(np.float32, 48, ml_dtypes.bfloat16)
    with h5py.File(tmp_path / "r.h5", "w") as f:
        d = f.create_dataset("C", (64, 32), "f4")
        bigmm.matmul(a, b, d, backend="numpy")
        before = d[...]
        with pytest.raises(errors.ResumeError, match="alpha"):
            bigmm.matmul(a, b, d, alpha=2.0, resume=True, backend="numpy")
        _, st = bigmm.matmul(a, b, d, resume=True, backend="numpy", stats=True)
        assert st.tiles_done == 0 and np.array_equal(d[...], before)


@pytest.mark.parametrize("operands, out, written", [
    ("bfloat16", "bfloat16", 2),   # out_dtype: C in the operands' half precision
    ("float32", "float64", 8),     # an existing float64 array takes float32 products
])
def test_the_plan_counts_c_in_the_dtype_it_is_written_in(operands, out, written):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dt = ml_dtypes.bfloat16 if operands == "bfloat16" else np.float32
    a, b = random_matrix((300, 200), dt, 1), random_matrix((200, 100), dt, 2)
    kw = dict(out_dtype=out) if out == "bfloat16" else {}
    c = None if out == "bfloat16" else np.zeros((300, 100), out)
    p = bigmm.plan(a, b, c, backend="numpy", **kw)
    _, st = bigmm.matmul(a, b, c, backend="numpy", stats=True, **kw)
    assert p.bytes_written == st.bytes_written == written * 300 * 100
    assert ("(C in " not in str(p)) if out == operands else (f"(C in {out})" in str(p))


def test_mixed_dtypes_follow_numpy(files):
    """float64 A with float32 B: multiplied in float64 (numpy.result_type), B converted as its
    panels load, as NumPy's own matmul does."""
    tmp, spec_a, _, _ = files
    with h5py.File(tmp / "in.h5", "r") as f:
        a, b32 = f["A"][...], f["B32"][...]
    got = bigmm.matmul(spec_a, f"{tmp / 'in.h5'}:/B32", memory="8KiB", backend="numpy")
    assert got.dtype == (a @ b32).dtype == np.float64
    assert relative_error(got, reference_gemm(a, b32)) <= tolerance(np.float64, a.shape[1])


def test_budget_error_states_the_minimum(files):
    _, spec_a, spec_b, _ = files
    with pytest.raises(errors.BudgetError) as e:
        bigmm.matmul(spec_a, spec_b, memory=100, backend="numpy")
    assert e.value.minimum > 100 and str(e.value.minimum) in str(e.value)
    out = bigmm.matmul(spec_a, spec_b, memory=e.value.minimum, backend="numpy")
    assert out.shape == (30, 10)


def test_resume_of_a_finished_output(files):
    tmp, spec_a, spec_b, _ = files
    spec_c = f"{tmp / 'r.h5'}:/C"
    bigmm.matmul(spec_a, spec_b, spec_c, backend="numpy", memory="4KiB")
    with h5py.File(tmp / "r.h5", "r") as f:
        assert f["C"].attrs["bigmm_complete"]
        before = f["C"][...]
    # the same job (another budget plans other tiles): already complete, nothing computed
    out, stats = bigmm.matmul(spec_a, spec_b, spec_c, backend="numpy", resume=True, stats=True)
    assert out == spec_c and stats.tiles_skipped == stats.tiles_total and stats.flops == 0
    with h5py.File(tmp / "r.h5", "r") as f:
        np.testing.assert_array_equal(f["C"][...], before)
    # another job (alpha): an error naming the difference
    with pytest.raises(errors.ResumeError, match="alpha"):
        bigmm.matmul(spec_a, spec_b, spec_c, backend="numpy", resume=True, alpha=2.0)


def _stop_after_two(p):
    """A progress callback interrupting a run once two tiles are written."""
    if p.tiles_done >= 2:
        raise KeyboardInterrupt


@pytest.mark.parametrize("edit", ["A", "old C"])  # an input in C's file; the old C (beta)
def test_one_element_changed_in_the_outputs_file_refuses_the_resume(tmp_path, edit):
    # the run writes that file, so only the contents tell: they are hashed whole
    a, b = random_matrix((700, 600), np.float64, 1), random_matrix((600, 500), np.float64, 2)
    c0 = random_matrix((700, 500), np.float64, 3)
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f["A"], f["C"] = a, c0
    kw = dict(beta=0.5 if edit == "old C" else 0.0, memory="256KiB", backend="numpy")
    out = f"{path}:/C" if edit == "old C" else f"{path}:/D"

    with pytest.raises(errors.Interrupted):
        bigmm.matmul(f"{path}:/A", b, out, progress=_stop_after_two, **kw)
    name = "A" if edit == "A" else "C"
    with h5py.File(path, "r+") as f:
        was = f[name][351, 299]
        f[name][351, 299] = was + 1.0  # one element, far from the samples' rows
    with pytest.raises(errors.ResumeError, match="hash of all its data") as refused:
        bigmm.matmul(f"{path}:/A", b, out, resume=True, **kw)
    assert str(refused.value).startswith(f"Expected {edit} ({path}:/{name}) as")  # named once
    with h5py.File(path, "r+") as f:  # restored: the resume goes on
        f[name][351, 299] = was
    bigmm.matmul(f"{path}:/A", b, out, resume=True, **kw)
    with h5py.File(path, "r") as f:
        got = f[out.rsplit(":", 1)[1]][...]
    ref = reference_gemm(a, b, beta=kw["beta"], c=c0)
    assert relative_error(got, ref) <= tolerance(np.float64, 600)


@pytest.mark.parametrize("fmt", ["h5", "zarr"])  # an HDF5 file, a Zarr store
def test_an_output_replaced_after_the_interruption_refuses_the_resume(tmp_path, fmt):
    # the journal names what its tiles went into: another finished C moved in its place
    # (same name, another file or directory) is not completed with the journal's tiles
    if fmt == "zarr":
        pytest.importorskip("zarr")
    a, b = random_matrix((300, 200), np.float64, 1), random_matrix((200, 250), np.float64, 2)
    name = {"h5": "{}.h5:/C", "zarr": "{}.zarr"}[fmt]
    one, other = (name.format(tmp_path / x) for x in ("one", "other"))
    kw = dict(memory="64KiB", backend="numpy")

    with pytest.raises(errors.Interrupted):
        bigmm.matmul(a, b, one, progress=_stop_after_two, **kw)
    bigmm.matmul(a, b, other, alpha=2.0, **kw)
    path = one.split(":")[0]
    if fmt == "zarr":
        shutil.rmtree(path)
    os.replace(other.split(":")[0], path)
    with pytest.raises(errors.ResumeError, match="replaced"):
        bigmm.matmul(a, b, one, resume=True, **kw)
    bigmm.matmul(a, b, one, overwrite=True, **kw)


@pytest.mark.parametrize("link", [
    h5py.SoftLink("/nowhere"),                 # a soft link to nothing
    h5py.ExternalLink("missing.h5", "/X"),     # an external link to a missing file
])
def test_a_link_to_nothing_at_the_output_is_replaced_only_with_overwrite(tmp_path, link):
    a, b = random_matrix((30, 20), np.float64, 1), random_matrix((20, 25), np.float64, 2)
    with h5py.File(tmp_path / "o.h5", "w") as f:
        f["C"] = link
    with pytest.raises(errors.OutputExistsError, match="overwrite"):
        bigmm.matmul(a, b, f"{tmp_path / 'o.h5'}:/C", backend="numpy")
    with h5py.File(tmp_path / "o.h5", "r") as f:
        assert f.get("C", getlink=True) is not None  # the link kept
    bigmm.matmul(a, b, f"{tmp_path / 'o.h5'}:/C", backend="numpy", overwrite=True)
    with h5py.File(tmp_path / "o.h5", "r") as f:
        assert relative_error(f["C"][...], a @ b) <= tolerance(np.float64, 20)


def test_an_output_file_with_another_hard_link_is_refused(tmp_path):
    # its lock is named after its path: a second run through the other name would not wait
    a, b = random_matrix((30, 20), np.float64, 1), random_matrix((20, 25), np.float64, 2)
    with h5py.File(tmp_path / "o.h5", "w") as f:
        f["keep"] = np.arange(3.0)
    os.link(tmp_path / "o.h5", tmp_path / "hl.h5")
    for name in ("o.h5", "hl.h5"):
        with pytest.raises(errors.OutputNotWritable, match="2 hard links"):
            bigmm.matmul(a, b, f"{tmp_path / name}:/C", backend="numpy")
    with h5py.File(tmp_path / "o.h5", "r") as f:
        assert list(f) == ["keep"]  # nothing written
    os.unlink(tmp_path / "hl.h5")
    bigmm.matmul(a, b, f"{tmp_path / 'o.h5'}:/C", backend="numpy")


@pytest.mark.parametrize("fmt", ["h5", "zarr"])  # a dataset in the same file, an array directory
def test_an_output_made_anew_at_its_place_refuses_the_resume(tmp_path, fmt):
    # made anew where the interrupted run's was: the file, the directory's inode or the
    # dataset's address may come back the same; the token bigmm drew for its output does not
    zarr = pytest.importorskip("zarr") if fmt == "zarr" else None
    a, b = random_matrix((300, 200), np.float64, 1), random_matrix((200, 250), np.float64, 2)
    out = str(tmp_path / "c.zarr") if fmt == "zarr" else f"{tmp_path / 'c.h5'}:/C"
    kw = dict(memory="64KiB", backend="numpy")

    with pytest.raises(errors.Interrupted):
        bigmm.matmul(a, b, out, progress=_stop_after_two, **kw)
    if fmt == "zarr":
        old = zarr.open_array(out, mode="r")
        zarr.create_array(store=out, shape=old.shape, chunks=old.chunks, dtype=old.dtype,
                          fill_value=np.nan, attributes={"bigmm_complete": False},
                          overwrite=True)
    else:
        with h5py.File(tmp_path / "c.h5", "r+") as f:
            chunks = f["C"].chunks
            del f["C"]
            f.create_dataset("C", (300, 250), "f8", chunks=chunks).attrs["bigmm_complete"] = False
    with pytest.raises(errors.ResumeError, match="replaced"):
        bigmm.matmul(a, b, out, resume=True, **kw)


# ----- kill, interrupt, resume ----------------------------------------------------------------

M, N, K = 96, 80, 70
SCRIPT = textwrap.dedent("""
    import sys, time, bigmm
    d = sys.argv[1]
    bigmm.matmul(d + "/a.h5:/A", d + "/b.h5:/B", d + "/c.h5:/C", memory="{memory}",
                 backend="numpy", progress=lambda p: time.sleep(0.05))
""")
MEMORY = "24KiB"


def _job_files(tmp_path):
    a, b = random_matrix((M, K), np.float64, 11), random_matrix((K, N), np.float64, 12)
    spec_a, spec_b = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    reference = bigmm.matmul(spec_a, spec_b, f"{tmp_path / 'ref.h5'}:/C", memory=MEMORY,
                             backend="numpy")
    with h5py.File(tmp_path / "ref.h5", "r") as f:
        full = f["C"][...]
    assert reference.endswith("ref.h5:/C")
    assert relative_error(full, a @ b) <= tolerance(np.float64, K)
    return spec_a, spec_b, full


def _start(tmp_path):
    return subprocess.Popen([sys.executable, "-c", SCRIPT.format(memory=MEMORY), str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_journaled_tiles(tmp_path, proc):
    return wait_for_journaled_tiles(tmp_path, proc, timeout=60.0)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_or_interrupted_run_resumes_bit_identical(tmp_path, sig):
    spec_a, spec_b, full = _job_files(tmp_path)
    proc = _start(tmp_path)
    journal = _wait_for_journaled_tiles(tmp_path, proc)
    proc.send_signal(sig)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 5.0  # stops within seconds
    assert proc.returncode != 0
    if sig == signal.SIGINT:
        assert "Interrupted" in err and "resumable" in err, err
    assert os.path.exists(journal)
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert not f["C"].attrs["bigmm_complete"]
    out, stats = bigmm.matmul(spec_a, spec_b, f"{tmp_path / 'c.h5'}:/C", memory=MEMORY,
                              backend="numpy", resume=True, stats=True)
    assert stats.tiles_skipped > 0
    assert stats.tiles_done + stats.tiles_skipped == stats.tiles_total
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert f["C"].attrs["bigmm_complete"]
        assert np.array_equal(f["C"][...], full)  # bit for bit
    assert not os.path.exists(journal)


def test_resume_with_another_budget_keeps_the_recorded_schedule(tmp_path):
    spec_a, spec_b, full = _job_files(tmp_path)
    proc = _start(tmp_path)
    _wait_for_journaled_tiles(tmp_path, proc)
    proc.kill()
    proc.communicate()
    p = bigmm.plan(spec_a, spec_b, f"{tmp_path / 'c.h5'}:/C", memory="1MiB", backend="numpy",
                   resume=True)
    fresh = bigmm.plan(spec_a, spec_b, memory=MEMORY, backend="numpy")
    assert (p.bm, p.bn, p.bk, p.order) == (fresh.bm, fresh.bn, fresh.bk, fresh.order)
    bigmm.matmul(spec_a, spec_b, f"{tmp_path / 'c.h5'}:/C", memory="1MiB", backend="numpy",
                 resume=True)
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert np.array_equal(f["C"][...], full)


class _StopAfter:
    """A hook that sets ``stop`` once ``tiles`` tiles have had their last gemm issued: the
    run stops before its next step (a stop set from a progress report could come after the
    last step was issued, and the run would finish)."""

    def __init__(self, tiles: int, stop):
        self.tiles, self.stop, self.done = tiles, stop, 0

    def begin(self, be, plan, alpha, beta):
        pass

    def landed(self, st, a, b, stream):
        pass

    def finished(self, st, c, stream):
        self.done += 1
        if self.done == self.tiles:
            self.stop.set()


@pytest.mark.parametrize("order, tile, tail, stop_at", [
    ("whole-b", (8, 16, 12), None, 4),  # all of B kept on the device
    ("resident-c", (8, 44, 4), 3, 2),  # C's strips kept, the last three K panels strip by strip
])
def test_a_gpu_schedule_resumes_with_its_schedule(tmp_path, order, tile, tail, stop_at):
    # a GPU run may keep one operand or C on the device; its journal records the schedule
    # (resident-c's tail with it), and a resume on any backend finishes with it, bit for bit
    import threading

    from bigmm import io
    from bigmm.executor import execute

    m, n, k = 50, 44, 36
    a, b = random_matrix((m, k), np.float64, seed=7), random_matrix((k, n), np.float64, seed=8)
    spec_a, spec_b = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    spec_c = f"{tmp_path / 'c.h5'}:/C"
    plan = make_plan(m, n, k, "float64", device_budget=1 << 20, staging=False,
                     tile=tile, order=order, tail=tail)
    A, B = io.open_input(spec_a, name="A"), io.open_input(spec_b, name="B")
    full = io.open_output(None, shape=(m, n), dtype=np.float64, inputs=[A, B], job={})
    execute(plan, A, B, full, NumpyBackend())
    stop = threading.Event()
    sink = io.open_output(spec_c, shape=(m, n), dtype=np.float64, inputs=[A, B],
                          job=job.job_record(plan, 1.0, 0.0))
    with pytest.raises(errors.Interrupted):
        execute(plan, A, B, sink, NumpyBackend(), faults=_StopAfter(stop_at, stop), stop=stop)
    sink.close(), A.close(), B.close()
    p = bigmm.plan(spec_a, spec_b, spec_c, memory="1MiB", backend="numpy", resume=True)
    assert p.key() == plan.key()
    _, stats = bigmm.matmul(spec_a, spec_b, spec_c, memory="1MiB", backend="numpy",
                            resume=True, stats=True)
    assert stats.tiles_skipped >= stop_at and stats.tiles_done == p.n_tiles - stats.tiles_skipped
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert np.array_equal(f["C"][...], full.result)


def test_import_bigmm_reaches_what_the_readme_names():
    # in a fresh interpreter: the package is quick to import, and its parts are reachable
    code = textwrap.dedent("""
        import sys, time
        t0 = time.perf_counter()
        import bigmm
        quick = time.perf_counter() - t0
        assert "numpy" not in sys.modules and "h5py" not in sys.modules, sorted(sys.modules)
        assert callable(bigmm.matmul) and callable(bigmm.plan)
        import bigmm.planner  # the planner package does not hide the API's plan()
        assert callable(bigmm.plan) and bigmm.plan.__module__ == "bigmm.api"
        assert callable(bigmm.verify.verify) and callable(bigmm.io.generate.generate)
        assert callable(bigmm.dask.matmul) and issubclass(bigmm.errors.ShapeError, ValueError)
        print(quick)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 0.1


@pytest.mark.parametrize("mode", ["a", "r"])  # the user's file open to write; open to read
def test_c_into_the_file_the_user_holds_open_with_the_inputs(tmp_path, mode):
    path = tmp_path / "data.h5"
    a = random_matrix((64, 48), np.float64, seed=1)
    b = random_matrix((48, 33), np.float64, seed=2)
    with h5py.File(path, "w") as f:
        f["A"], f["B"] = a, b
    with h5py.File(path, mode) as f:
        t0 = time.monotonic()
        if mode == "r":  # HDF5 will not write a file open read-only: at once, one error
            with pytest.raises(errors.OutputNotWritable, match="Expected to create") as err:
                bigmm.matmul(f["A"], f["B"], out=f"{path}:/C", backend="numpy")
            assert "read-only" in str(err.value)
            assert time.monotonic() - t0 < 10  # not a wait for another process's lock
        else:  # written through the user's open file, which HDF5 shares
            bigmm.matmul(f["A"], f["B"], out=f"{path}:/C", backend="numpy")
            np.testing.assert_allclose(f["C"][...], a @ b, rtol=1e-12)
            assert bool(f["C"].attrs["bigmm_complete"])


class _Locking(NumpyBackend):
    """The NumPy backend with the Registers ability, recording its calls."""

    staging = True  # as a GPU backend's: host memory is not its compute memory

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def register(self, ptr, nbytes, read_only=False):
        self.calls.append(("register", ptr, read_only))

    def unregister(self, ptr):
        self.calls.append(("unregister", ptr))

    def close(self):
        self.calls.append(("close",))
        super().close()


def test_page_locked_holds_arrays_for_the_block_and_releases_them(monkeypatch):
    from bigmm.executor.register import page_extent
    from bigmm.testing import own_pages

    a = own_pages(random_matrix((300, 200), np.float32))
    b = own_pages(random_matrix((200, 100), np.float32, 1))
    c = np.full((300, 100), np.nan, np.float32)
    a.flags.writeable = False
    with bigmm.page_locked(a, b, c, backend="numpy") as locked:  # the CPU: nothing to lock
        bigmm.matmul(a, b, c, backend="numpy")
    assert locked.nbytes == 0 and relative_error(c, reference_gemm(a, b)) <= tolerance(
        np.float32, 200)
    be = _Locking()
    monkeypatch.setattr(api, "get_backend", lambda name: be)
    with pytest.raises(KeyError):
        with bigmm.page_locked(a, b, backend="cupy") as locked:
            assert [x[0] for x in be.calls] == ["register"] * 2 and locked.nbytes > 0
            raise KeyError("the block fails")
    assert [x[0] for x in be.calls] == ["register"] * 2 + ["unregister"] * 2 + ["close"]
    assert {x[1]: x[2] for x in be.calls[:2]} == {page_extent(a)[0]: True,  # read-only
                                                  page_extent(b)[0]: False}


def test_page_locked_takes_numpy_arrays_only():
    with pytest.raises(errors.OptionError, match="Expected NumPy arrays to page-lock. Got list"):
        with bigmm.page_locked(np.zeros(3), [1.0, 2.0], backend="numpy"):
            pass


def _declared(tmp_path) -> tuple[str, str, int]:
    """A and B declared twice as large as this machine's RAM each (never written: the run
    reads only samples of their fill value), and a budget of eight times the RAM."""
    from bigmm.backends.numpy import memory_total

    total = memory_total()
    n = -(-int((2 * total / 4) ** 0.5) // 4096) * 4096
    specs = []
    for name in "AB":
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            f.create_dataset(name, shape=(n, n), dtype=np.float32, chunks=(4096, 4096))
        specs.append(f"{tmp_path / f'{name}.h5'}:/{name}")
    return specs[0], specs[1], 8 * total


def test_budgets_beyond_the_machines_ram_are_refused_before_anything_is_written(tmp_path):
    from bigmm.backends.numpy import memory_total
    from bigmm.planner.decode import host_total

    a, b, budget = _declared(tmp_path)
    c = f"{tmp_path / 'c.h5'}:/C"
    with pytest.raises(errors.BudgetError, match=r"fits in this machine's RAM \("):
        bigmm.matmul(a, b, c, memory=budget, backend="numpy")
    assert not (tmp_path / "c.h5").exists()
    # a plan for another machine is still printed; the default budgets fit this one
    assert host_total(bigmm.plan(a, b, c, memory=budget, backend="numpy")) > memory_total()
    assert host_total(bigmm.plan(a, b, c, backend="numpy")) <= memory_total()


def test_the_cli_names_the_budget_flags_beyond_the_machines_ram(tmp_path, capsys):
    from bigmm.cli import main

    a, b, budget = _declared(tmp_path)
    rc = main(["multiply", a, b, "-o", f"{tmp_path / 'c.h5'}:/C", "--memory", str(budget),
               "--backend", "numpy"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "(--memory " in err and "--host-memory " in err
    assert not (tmp_path / "c.h5").exists()
