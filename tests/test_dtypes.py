"""float16 and bfloat16 operands, and NumPy's dtype rules, through every front door: the rules
themselves, bfloat16 in HDF5, products against a float64 reference (all transposes,
alpha/beta, arrays and files, NaN-poisoned outputs), the output's dtype, resume, the plan's
bytes, the command line and dask. The GPU half of the file (``-m gpu``) runs the tensor-core
paths through the whole pipeline."""

from __future__ import annotations

import warnings

import h5py
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bigmm
from bigmm import io
from bigmm.cli import main
from bigmm.backends.numpy import NumpyBackend
from bigmm.errors import (BudgetError, DtypeError, OptionError, OutputOverflowError,
                          ResumeError)
from bigmm.executor.loads import Slots
from bigmm.io._h5 import BF16_BE, BF16_LE
from bigmm.io.generate import block, generate
from bigmm.planner import make_plan
from bigmm.testing import random_matrix, reference_gemm, relative_error, tolerance
from bigmm.units import DTYPES, accumulate_dtype, common_dtype, numpy_dtype, parse_out_dtype
from bigmm.verify import verify

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
HALVES = ["float16", "bfloat16"]
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]


def operands(m, n, k, dtype, ta=False, tb=False, seed=0):
    """Fresh standard-normal A and B (stored shapes for the transposes) rounded to ``dtype``."""
    a = random_matrix((k, m) if ta else (m, k), numpy_dtype(dtype), seed)
    b = random_matrix((n, k) if tb else (k, n), numpy_dtype(dtype), seed + 1)
    return a, b


# ----- the rules ------------------------------------------------------------------------------

COMMON = [
    # (A, B, multiplied in)
    ("float32", "float64", "float64"),    # NumPy: float32 @ float64 -> float64
    ("float64", "float32", "float64"),    # either order
    ("float16", "float32", "float32"),    # half with single
    ("bfloat16", "float64", "float64"),   # bfloat16 with double (ml_dtypes' promotion)
    ("float16", "bfloat16", "float32"),   # no common 16-bit type: float32
    ("bfloat16", "bfloat16", "bfloat16"), # same dtype: as it is (tensor cores on a GPU)
]


@pytest.mark.parametrize("a, b, both", COMMON)
def test_common_dtype_follows_numpy(a, b, both):
    assert common_dtype(a, b) == both
    try:  # where NumPy has a result type, it is the same
        assert np.result_type(numpy_dtype(a), numpy_dtype(b)).name == both
    except TypeError:
        assert {a, b} == {"float16", "bfloat16"}


OUT_DTYPES = [
    # (operands, out_dtype asked, C's dtype or the error)
    ("bfloat16", None, "float32"),          # default: float32 for half precision
    ("bfloat16", "bfloat16", "bfloat16"),   # in the input dtype when asked
    ("float16", F16, "float16"),            # a NumPy dtype works as well as a name
    ("float16", "float32", "float32"),      # float32 asked explicitly
    ("float32", None, "float32"),           # float32 operands: float32
    ("float64", "float64", "float64"),      # same dtype asked
    ("float16", "bfloat16", OptionError),   # another half type
    ("float32", "float16", OptionError),    # narrowing a float32 product
    ("float32", "float64", OptionError),    # widening would claim precision never computed
    ("float32", "int8", OptionError),       # not a float
]


@pytest.mark.parametrize("operands_dtype, asked, result", OUT_DTYPES)
def test_out_dtype_rule(operands_dtype, asked, result):
    if isinstance(result, type):
        with pytest.raises(result, match=f"Expected out_dtype=.* for operands multiplied in "
                                         f"{operands_dtype}"):
            parse_out_dtype(asked, operands_dtype)
    else:
        assert parse_out_dtype(asked, operands_dtype) == result


# ----- bfloat16 in HDF5 -----------------------------------------------------------------------

@pytest.mark.parametrize("layout, chunks, path", [
    ("contiguous", None, "contiguous"),  # mapped raw reads
    ("chunked", (16, 24), "chunked"),    # chunk by chunk
    ("compressed", (16, 24), "deflate"), # inflated in the reader threads
])
@pytest.mark.parametrize("dtype", HALVES)
def test_generated_half_datasets_read_raw_and_equal_the_rounded_matrix(tmp_path, dtype, layout,
                                                                      chunks, path):
    spec = generate(f"{tmp_path / 'g.h5'}:/X", (37, 53), dtype=dtype, layout=layout,
                    chunks=chunks, seed=3)
    want = block((37, 53), 3, 0, 37, dtype)
    assert want.dtype == numpy_dtype(dtype)
    with io.open_input(spec) as src:
        assert src.dtype == numpy_dtype(dtype) and src.layout == path and src.fast
        got = np.full((37, 53), np.nan, numpy_dtype(dtype))
        src.read(0, 37, 0, 53, got)
    assert got.tobytes() == want.tobytes()
    with h5py.File(tmp_path / "g.h5", "r") as f:
        tid = f["X"].id.get_type()
        assert tid.get_size() == 2
        if dtype == "bfloat16":  # h5py: float32 values, exact; HDF5: 8 exponent, 7 mantissa
            assert f["X"].dtype == np.float32 and io.stored_dtype(f["X"]) == BF16
            assert (tid.get_fields(), tid.get_ebias()) == ((15, 7, 8, 0, 7), 127)
            assert np.array_equal(f["X"][...], want.astype(np.float32))


def test_bfloat16_big_endian_and_filtered_datasets_read_through_h5py(tmp_path):
    """Either byte order, and filters the raw readers do not take (fletcher32), read as
    bfloat16 through h5py with bigmm's memory type."""
    x = random_matrix((20, 30), BF16, 5)
    path = tmp_path / "b.h5"
    with h5py.File(path, "w") as f:
        for name, tid, kw in (("be", BF16_BE, {}), ("fl", BF16_LE, {"fletcher32": True,
                                                                   "chunks": (8, 8)})):
            d = f.create_dataset(name, (20, 30), dtype=h5py.Datatype(tid.copy()), **kw)
            d[...] = x.astype(np.float32)  # HDF5 rounds float32 -> bfloat16: exact here
    for name in ("be", "fl"):
        with io.open_input(f"{path}:/{name}") as src:
            assert src.dtype == BF16 and src.layout == "h5py"
            got = np.empty((7, 11), BF16)
            src.read(3, 10, 4, 15, got)
            assert got.tobytes() == x[3:10, 4:15].tobytes()


def test_hdf5_rounds_float32_into_bfloat16_to_nearest_even(tmp_path):
    """What the README says h5py users may do: assign float32 to a bfloat16 dataset."""
    y = np.random.default_rng(9).standard_normal((64, 64), dtype=np.float32) * 1e3
    with h5py.File(tmp_path / "r.h5", "w") as f:
        d = f.create_dataset("X", y.shape, dtype=h5py.Datatype(io.h5_type("bfloat16")))
        d[...] = y
    with io.open_input(f"{tmp_path / 'r.h5'}:/X") as src:
        got = np.empty(y.shape, BF16)
        src.read(0, 64, 0, 64, got)
    assert got.tobytes() == y.astype(BF16).tobytes()


def test_opaque_two_byte_dataset_is_refused_with_the_way_out(tmp_path):
    """h5py stores an ml_dtypes array as an opaque type: no layout, so not taken as bfloat16."""
    with h5py.File(tmp_path / "o.h5", "w") as f:
        f["X"] = random_matrix((4, 4), BF16)
    with pytest.raises(DtypeError, match="opaque 2-byte type.*README"):
        io.open_input(f"{tmp_path / 'o.h5'}:/X")


# ----- products against float64 --------------------------------------------------------------

PRODUCTS = [
    # (m, n, k, alpha, beta, memory): shapes multiples of nothing
    (61, 47, 83, 1.0, 0.0, "64KiB"),     # several tiles and K panels
    (129, 31, 257, -0.75, 1.5, "96KiB"),  # general alpha/beta, reads old C
    (1, 33, 700, 2.0, 0.0, "1MiB"),      # one row, deep
]


@pytest.mark.parametrize("ta, tb", TRANSPOSES)
@pytest.mark.parametrize("m, n, k, alpha, beta, memory", PRODUCTS)
@pytest.mark.parametrize("dtype", HALVES)
def test_half_arrays_all_transposes_alpha_beta(dtype, m, n, k, alpha, beta, memory, ta, tb):
    a, b = operands(m, n, k, dtype, ta, tb, seed=m + n + k)
    c0 = random_matrix((m, n), np.float32, 99)
    out = c0.copy() if beta else np.full((m, n), np.nan, np.float32)  # poisoned when unread
    got = bigmm.matmul(a, b, out, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb,
                       memory=memory, backend="numpy")
    assert got is out and got.dtype == np.float32
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(got, ref) <= tolerance(dtype, k)


@pytest.mark.parametrize("out_dtype", [None, "same"])
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
@pytest.mark.parametrize("dtype", HALVES)
def test_half_files_into_new_outputs(tmp_path, dtype, ta, tb, out_dtype):
    m, n, k = 77, 58, 131
    shape_a, shape_b = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))
    a = generate(f"{tmp_path / 'a.h5'}:/A", shape_a, dtype=dtype, layout="chunked",
                 chunks=(32, 40), seed=1)
    b = generate(f"{tmp_path / 'b.h5'}:/B", shape_b, dtype=dtype, seed=2)
    asked = dtype if out_dtype == "same" else None
    out = bigmm.matmul(a, b, f"{tmp_path / 'c.h5'}:/C", trans_a=ta, trans_b=tb,
                       memory="96KiB", backend="numpy", out_dtype=asked)
    with io.open_input(out) as C:
        assert C.dtype == numpy_dtype(asked or "float32")
        got = np.empty(C.shape, C.dtype)
        C.read(0, m, 0, n, got)
    ref = reference_gemm(block(shape_a, 1, 0, shape_a[0], dtype),
                         block(shape_b, 2, 0, shape_b[0], dtype), trans_a=ta, trans_b=tb)
    assert relative_error(got.astype(np.float64), ref) <= tolerance(dtype, k, asked)
    assert verify(a, b, out, trans_a=ta, trans_b=tb).passed


MIXED = [
    # (A dtype, B dtype, C dtype): NumPy's result type, the same on every route
    ("float32", "float64", "float64"),
    ("float16", "float32", "float32"),
    ("bfloat16", "float64", "float64"),
    ("float16", "bfloat16", "float32"),
]


@pytest.mark.parametrize("da, db, dc", MIXED)
def test_mixed_dtypes_api_arrays_and_files(tmp_path, da, db, dc):
    m, n, k = 45, 39, 70
    a, _ = operands(m, n, k, da, seed=4)
    _, b = operands(m, n, k, db, seed=6)
    ref = reference_gemm(a, b)
    got = bigmm.matmul(a, b, memory="64KiB", backend="numpy")
    assert got.dtype == np.dtype(dc)
    assert relative_error(got, ref) <= tolerance(dc, k)
    sa = generate(f"{tmp_path / 'a.h5'}:/A", (m, k), dtype=da, seed=4)
    sb = generate(f"{tmp_path / 'b.h5'}:/B", (k, n), dtype=db, seed=5)
    assert bigmm.plan(sa, sb, memory="64KiB", backend="numpy").dtype == common_dtype(da, db)
    out = bigmm.matmul(sa, sb, f"{tmp_path / 'c.h5'}:/C", memory="64KiB", backend="numpy")
    assert verify(sa, sb, out).passed
    with io.open_input(out) as C:
        assert C.dtype == np.dtype(dc)


def test_float32_with_float64_is_no_longer_refused_and_computes_in_float64():
    """The API used to refuse float32 @ float64; NumPy (and bigmm.dask) give float64."""
    a = random_matrix((50, 60), np.float32, 1)
    b = random_matrix((60, 40), np.float64, 2)
    got = bigmm.matmul(a, b, backend="numpy")
    want = a @ b
    assert got.dtype == want.dtype == np.float64
    assert relative_error(got, reference_gemm(a, b)) <= tolerance(np.float64, 60)


# ----- the output's dtype ---------------------------------------------------------------------

def test_existing_array_decides_its_dtype():
    a, b = operands(30, 20, 40, "bfloat16", seed=8)
    for dtype, bound in ((np.float64, tolerance("bfloat16", 40)),
                         (F16, tolerance("bfloat16", 40, "float16")),
                         (BF16, tolerance("bfloat16", 40, "bfloat16"))):
        out = np.full((30, 20), np.nan, dtype)
        assert bigmm.matmul(a, b, out, backend="numpy") is out
        assert relative_error(out.astype(np.float64), reference_gemm(a, b)) <= bound


OUTPUT_ERRORS = [
    # (out, out_dtype, error, words)
    (np.zeros((30, 20), np.int32), None, DtypeError, ["can be written to", "int32"]),  # integer
    (np.zeros((30, 20), np.float64), "bfloat16", DtypeError, ["existing output", "float64"]),
    (None, "float16", OptionError, ["out_dtype=float32 or out_dtype=bfloat16"]),  # half type
]


@pytest.mark.parametrize("out, out_dtype, error, words", OUTPUT_ERRORS)
def test_output_dtype_errors(out, out_dtype, error, words):
    a, b = operands(30, 20, 40, "bfloat16")
    with pytest.raises(error) as err:
        bigmm.matmul(a, b, out, out_dtype=out_dtype, backend="numpy")
    for word in words:
        assert word in str(err.value), str(err.value)
    with pytest.raises(error):  # bigmm.plan checks it the same way
        bigmm.plan(a, b, out, out_dtype=out_dtype, backend="numpy")


def test_existing_dataset_with_beta_keeps_its_dtype(tmp_path):
    """beta != 0 into a float64 C: the old C is read (converted), the result written float64."""
    a = generate(f"{tmp_path / 'a.h5'}:/A", (40, 50), dtype="bfloat16", seed=1)
    b = generate(f"{tmp_path / 'b.h5'}:/B", (50, 30), dtype="bfloat16", seed=2)
    c = generate(f"{tmp_path / 'c.h5'}:/C", (40, 30), dtype="float64", seed=3)
    bigmm.matmul(a, b, c, alpha=0.5, beta=-2.0, memory="32KiB", backend="numpy")
    with h5py.File(tmp_path / "c.h5", "r") as f:
        got = f["C"][...]
    assert got.dtype == np.float64
    ref = reference_gemm(block((40, 50), 1, 0, 40, "bfloat16"), block((50, 30), 2, 0, 50,
                         "bfloat16"), alpha=0.5, beta=-2.0, c=block((40, 30), 3, 0, 40))
    assert relative_error(got, ref) <= tolerance("bfloat16", 50)


def test_verify_checksum_is_refused_for_half_precision():
    a, b = operands(10, 10, 10, "float16")
    with pytest.raises(OptionError, match="verify=None for float16"):
        bigmm.matmul(a, b, backend="numpy", verify="checksum")


# ----- products beyond C's dtype ---------------------------------------------------------------

def test_a_float16_output_too_narrow_for_the_product_is_an_error_not_infinities(tmp_path):
    a = np.full((50, 900), 200, np.float16)  # every element of A @ B is 3.6e7
    b = np.full((900, 40), 200, np.float16)
    out = f"{tmp_path / 'c.h5'}:/C"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy overflow warning either
        with pytest.raises(OutputOverflowError, match=r"float16 \(largest finite value 65504\)"
                           r".*2000 values.*3\.6e\+07.*out_dtype=float32"):
            bigmm.matmul(a, b, out, backend="numpy", out_dtype="float16")
    with h5py.File(tmp_path / "c.h5", "r") as f:  # marked incomplete, not finished
        assert not f["C"].attrs["bigmm_complete"]
    # as float32 it fits and is right
    bigmm.matmul(a, b, out, backend="numpy", overwrite=True)
    assert verify(a, b, out).passed


def test_a_float64_product_beyond_a_float32_array_is_an_error(tmp_path):
    a, c = np.full((20, 30), 1e30), np.zeros((20, 10), np.float32)
    with pytest.raises(OutputOverflowError, match="float32.*200 values.*3e\\+61"):
        bigmm.matmul(a, np.full((30, 10), 1e30), out=c, backend="numpy")


def test_a_bfloat16_output_beyond_its_largest_value_is_an_error():
    one = np.ones((2, 3), ml_dtypes.bfloat16)
    c = bigmm.matmul(one, one.T, alpha=1.1e38, backend="numpy", out_dtype="bfloat16")
    assert np.isfinite(c).all()  # 3.3e38: within bfloat16
    with pytest.raises(OutputOverflowError, match=r"bfloat16 \(largest finite value "
                                                  r"3\.38953e\+38\).*4 values"):
        bigmm.matmul(one, one.T, alpha=1.134e38, backend="numpy", out_dtype="bfloat16")


def test_infinities_of_the_product_itself_are_written_as_they_are():
    a = random_matrix((40, 30), np.float16, 1)
    a[3, 4], a[7, 0] = np.inf, np.nan
    b = random_matrix((30, 20), np.float16, 2)
    c = bigmm.matmul(a, b, backend="numpy", out_dtype="float16")
    with np.errstate(invalid="ignore"):
        ref = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    assert np.array_equal(np.isfinite(c), np.isfinite(ref))
    assert not np.isfinite(c[3]).any() and not np.isfinite(c[7]).any()


def test_cli_refuses_a_float16_output_too_narrow(tmp_path, capsys):
    with h5py.File(tmp_path / "ab.h5", "w") as f:
        f["A"] = np.full((50, 900), 200, np.float16)
        f["B"] = np.full((900, 40), 200, np.float16)
    ab = str(tmp_path / "ab.h5")
    rc = main(["multiply", f"{ab}:/A", f"{ab}:/B", "-o", f"{tmp_path / 'c.h5'}:/C",
               "--out-dtype", "float16", "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "bigmm: error: Expected the product to fit C's dtype float16" in err
    assert "--out-dtype float32" in err and "Traceback" not in err


def test_cli_overflow_of_a_kept_float16_c_does_not_advise_an_out_dtype_it_refuses(tmp_path,
                                                                                   capsys):
    # beta != 0 keeps old C's float16: the error advised --out-dtype float32 alone, which the
    # next run refuses ("Expected --out-dtype float16 (or none) for the existing output")
    with h5py.File(tmp_path / "ab.h5", "w") as f:
        f["A"] = np.ones((5, 6), np.float16)
        f["B"] = np.ones((6, 4), np.float16)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["C"] = np.full((5, 4), 40000, np.float16)
    ab, out = str(tmp_path / "ab.h5"), f"{tmp_path / 'c.h5'}:/C"
    rc = main(["multiply", f"{ab}:/A", f"{ab}:/B", "-o", out, "--beta", "2", "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "bigmm: error: Expected the product to fit C's dtype float16" in err
    assert "keeps its dtype: convert it to float32 first" in err
    rc = main(["multiply", f"{ab}:/A", f"{ab}:/B", "-o", out, "--beta", "2", "--resume",
               "--out-dtype", "float32", "-q"])
    assert rc == 2 and "(or none) for the existing output" in capsys.readouterr().err


# ----- resume ---------------------------------------------------------------------------------

class _StopAfter:
    """A progress callback that interrupts the run after ``n`` tiles."""

    def __init__(self, n):
        self.n = n

    def __call__(self, p):
        if p.tiles_done >= self.n:
            raise KeyboardInterrupt


@pytest.mark.parametrize("out_dtype", [None, "bfloat16"])
def test_interrupted_bfloat16_run_resumes_to_the_same_product(tmp_path, out_dtype):
    a = generate(f"{tmp_path / 'a.h5'}:/A", (90, 70), dtype="bfloat16", seed=1)
    b = generate(f"{tmp_path / 'b.h5'}:/B", (70, 80), dtype="bfloat16", seed=2)
    out = f"{tmp_path / 'c.h5'}:/C"
    with pytest.raises(bigmm.errors.Interrupted):
        bigmm.matmul(a, b, out, memory="24KiB", backend="numpy", out_dtype=out_dtype,
                     progress=_StopAfter(2))
    # the output's recorded dtype decides: another one asked is refused, none asked is fine
    other = "float32" if out_dtype else "bfloat16"
    with pytest.raises(DtypeError, match="existing output"):
        bigmm.matmul(a, b, out, memory="24KiB", backend="numpy", resume=True, out_dtype=other)
    _, stats = bigmm.matmul(a, b, out, memory="24KiB", backend="numpy", resume=True,
                            stats=True)
    assert stats.tiles_skipped >= 2
    assert verify(a, b, out).passed
    with io.open_input(out) as C:
        assert C.dtype == numpy_dtype(out_dtype or "float32")


def test_resume_with_inputs_of_another_dtype_is_refused(tmp_path):
    a = generate(f"{tmp_path / 'a.h5'}:/A", (90, 70), dtype="bfloat16", seed=1)
    b = generate(f"{tmp_path / 'b.h5'}:/B", (70, 80), dtype="bfloat16", seed=2)
    out = f"{tmp_path / 'c.h5'}:/C"
    with pytest.raises(bigmm.errors.Interrupted):
        bigmm.matmul(a, b, out, memory="24KiB", backend="numpy", progress=_StopAfter(1))
    generate(a, (90, 70), dtype="float32", seed=1, overwrite=True)  # same values, wider
    with pytest.raises(ResumeError, match="dtype"):
        bigmm.matmul(a, b, out, memory="24KiB", backend="numpy", resume=True)


# ----- the plan's bytes -----------------------------------------------------------------------

def test_half_plan_moves_two_byte_panels_and_four_byte_tiles():
    kw = dict(device_budget=1 << 30, host_budget=1 << 30, tile=(512, 384, 256), order="stream")
    half = make_plan(2000, 1500, 1000, "bfloat16", **kw)
    single = make_plan(2000, 1500, 1000, "float32", **kw)
    assert (half.itemsize, half.c_itemsize, half.c_dtype) == (2, 4, "float32")
    panels = 2 * (512 * 256 + 256 * 384)  # two slots of each operand
    assert half.device_bytes == 2 * panels + 4 * 2 * 512 * 384
    assert single.device_bytes - half.device_bytes == 2 * panels
    assert half.bytes_written == single.bytes_written == 4 * 2000 * 1500
    inputs = half.a_reads * 2000 * 1000 + half.b_reads * 1000 * 1500
    assert half.bytes_read == 2 * inputs and single.bytes_read == 4 * inputs
    assert "bfloat16 (C in float32)" in str(half)


@settings(max_examples=80, deadline=None)
@given(m=st.integers(1, 3000), n=st.integers(1, 3000), k=st.integers(1, 3000),
       dtype=st.sampled_from(list(DTYPES)), budget=st.integers(1 << 12, 1 << 26),
       staging=st.booleans())
def test_plans_of_every_dtype_fit_and_the_buffers_are_what_they_count(m, n, k, dtype, budget,
                                                                      staging):
    """The budgets hold with each operand's element size and C's, and the buffers the executor
    allocates for a plan are exactly the bytes the plan counts (CPU: device == host)."""
    try:
        p = make_plan(m, n, k, dtype, device_budget=budget, host_budget=2 * budget,
                      staging=staging)
    except BudgetError:
        return
    assert p.device_bytes <= p.device_budget and p.host_bytes <= p.host_budget
    assert p.c_itemsize == DTYPES[accumulate_dtype(dtype)]
    if not staging:
        slots = Slots.allocate(NumpyBackend(), p, {"A": None, "B": None, "C": None})
        held = sum(buf.nbytes for bufs in slots.dev.values() for buf in bufs)
        assert held == p.device_bytes and not slots.host


# ----- command line and dask ------------------------------------------------------------------

def test_cli_generates_multiplies_and_verifies_bfloat16(tmp_path, capsys):
    h = tmp_path / "h.h5"
    for name, shape, seed in (("A", ("60", "45"), "1"), ("B", ("45", "50"), "2")):
        assert main(["generate", f"{h}:/{name}", "--shape", *shape, "--dtype", "bfloat16",
                     "--seed", seed]) == 0
    out = f"{tmp_path / 'c.h5'}:/C"
    assert main(["multiply", f"{h}:/A", f"{h}:/B", "-o", out, "--memory", "32KiB",
                 "--backend", "numpy", "--out-dtype", "bfloat16", "--quiet"]) == 0
    assert main(["verify", f"{h}:/A", f"{h}:/B", out]) == 0
    with io.open_input(out) as C:
        assert C.dtype == BF16
    capsys.readouterr()
    rc = main(["multiply", f"{h}:/A", f"{h}:/B", "-o", f"{tmp_path / 'd.h5'}:/C", "--backend",
               "numpy", "--out-dtype", "float16", "--quiet"])
    assert rc == 2
    assert "--out-dtype float32 or --out-dtype bfloat16" in capsys.readouterr().err


def test_dask_half_and_mixed_follow_the_same_rules():
    da = pytest.importorskip("dask.array")
    a, b = operands(70, 50, 90, "bfloat16", seed=3)
    x, y = da.from_array(a, chunks=(32, 40)), da.from_array(b, chunks=(25, 20))
    for asked, want in ((None, np.float32), ("bfloat16", BF16)):
        c = bigmm.dask.matmul(x, y, out_dtype=asked)
        got = c.compute()
        assert c.dtype == got.dtype == want
        assert relative_error(got.astype(np.float64), reference_gemm(a, b)) <= tolerance(
            "bfloat16", 90, asked)
    f32 = da.from_array(a.astype(np.float32), chunks=(32, 40))
    f64 = da.from_array(b.astype(np.float64), chunks=(25, 20))
    assert bigmm.dask.matmul(f32, f64).dtype == (f32 @ f64).dtype == np.float64


# ----- GPU: the tensor-core paths through the pipeline ----------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [None, "same"])
@pytest.mark.parametrize("ta, tb", TRANSPOSES)
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_half_files_through_the_pipeline(tmp_path, dtype, ta, tb, out_dtype):
    m, n, k = 1031, 777, 2049
    shape_a, shape_b = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))
    a = generate(f"{tmp_path / 'a.h5'}:/A", shape_a, dtype=dtype, seed=1)
    b = generate(f"{tmp_path / 'b.h5'}:/B", shape_b, dtype=dtype, layout="chunked",
                 chunks=(256, 256), seed=2)
    asked = dtype if out_dtype == "same" else None
    out, stats = bigmm.matmul(a, b, f"{tmp_path / 'c.h5'}:/C", trans_a=ta, trans_b=tb,
                              memory="16MiB", backend="cupy", out_dtype=asked, stats=True)
    assert stats.tiles_done > 1
    with io.open_input(out) as C:
        got = np.empty(C.shape, C.dtype)
        C.read(0, m, 0, n, got)
    assert got.dtype == numpy_dtype(asked or "float32")
    ref = reference_gemm(block(shape_a, 1, 0, shape_a[0], dtype),
                         block(shape_b, 2, 0, shape_b[0], dtype), trans_a=ta, trans_b=tb)
    assert relative_error(got.astype(np.float64), ref) <= tolerance(dtype, k, asked)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_half_arrays_alpha_beta_and_pinned_operands(dtype):
    from bigmm.testing import pinned_array

    m, n, k = 700, 900, 3001
    a, b = operands(m, n, k, dtype, seed=11)
    c0 = random_matrix((m, n), np.float32, 12)
    for pinned in (False, True):  # pinned: copied in from the arrays themselves
        x, y = (pinned_array(a.shape, a.dtype, a), pinned_array(b.shape, b.dtype, b)) \
            if pinned else (a, b)
        out = c0.copy()
        bigmm.matmul(x, y, out, alpha=-1.5, beta=0.5, memory="8MiB", backend="cupy")
        ref = reference_gemm(a, b, alpha=-1.5, beta=0.5, c=c0)
        assert relative_error(out, ref) <= tolerance(dtype, k)
