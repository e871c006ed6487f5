"""precision= (float32, tf32x3, tf32) on every front door, on the CPU: parsing and errors, the
plan's arithmetic line, products within float32's tolerance, the journal refusing a resume in
another precision, and the checksum and verify bounds of each precision (numpy level)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bigmm
from bigmm import job
from bigmm.backends.numpy import NumpyBackend
from bigmm.checksum import rounding_bounds
from bigmm.cli import main
from bigmm.errors import OptionError, ResumeError
from bigmm.io.generate import generate
from bigmm.precision import (PRECISIONS, ROUNDING, Rounding, check_dtype, describe,
                             kernel_precision, parse_precision)
from bigmm.testing import flip_exponent, random_matrix, reference_gemm, relative_error, tolerance
from bigmm.verify import SAFETY as VERIFY_SAFETY
from bigmm.verify import tolerance as verify_tolerance
from bigmm.verify import verify

F32, F64 = np.float32, np.float64
M, K, N = 157, 211, 103  # multiples of nothing
BUDGET = "120KB"  # many tiles and K panels


class _StopAfter:
    """A progress callback that interrupts the run after ``n`` tiles."""

    def __init__(self, n):
        self.n = n

    def __call__(self, p):
        if p.tiles_done >= self.n:
            raise KeyboardInterrupt


@pytest.fixture
def files(tmp_path):
    a = generate(f"{tmp_path / 'a.h5'}:/A", (M, K), seed=1)
    b = generate(f"{tmp_path / 'b.h5'}:/B", (K, N), seed=2)
    with h5py.File(tmp_path / "a.h5", "r") as f, h5py.File(tmp_path / "b.h5", "r") as g:
        return tmp_path, a, b, f["A"][...], g["B"][...]


# ----- parsing -----------------------------------------------------------------------------

PARSE = [
    # (given, parsed)
    (None, None),  # not given: the default, or the kernel's
    ("float32", "float32"),  # the default named
    ("TF32x3", "tf32x3"),  # any case
    ("Tf32", "tf32"),  # any case
]


@pytest.mark.parametrize("given, parsed", PARSE)
def test_parse_precision(given, parsed):
    assert parse_precision(given) == parsed


@pytest.mark.parametrize("bad", ["tf16", "", "float64", 32, True])
def test_parse_precision_refuses_other_names(bad):
    with pytest.raises(OptionError, match=r"Expected precision to be one of float32, tf32x3, "
                                          r"tf32\. Got"):
        parse_precision(bad)


KERNELS = [
    # (kernel, precision, the precision run, or the error's words)
    (None, None, "float32"),  # the default everywhere
    ("bigmm", "tf32x3", "tf32x3"),  # bigmm's 3xTF32 kernels
    ("bigmm", "TF32", "tf32"),  # bigmm's TF32 kernels
    ("cublas", "tf32", "tf32"),  # cuBLAS's TF32 math mode
    ("cublas", "float32", "float32"),  # cuBLAS SGEMM
    ("cublas", "tf32x3", "no float32-accurate tensor-core mode"),  # cuBLAS has none
    ("cublas-tf32", None, "tf32"),  # as today
    ("cublas-tf32", "tf32", "tf32"),  # the same said twice
    ("cublas-tf32", "float32", "cuBLAS with TF32"),  # contradicts the kernel
    ("cublas-tf32", "tf32x3", "cuBLAS with TF32"),  # contradicts the kernel
]


@pytest.mark.parametrize("kernel, precision, want", KERNELS)
def test_kernel_precision(kernel, precision, want):
    if want in PRECISIONS:
        assert kernel_precision(kernel, precision) == want
    else:
        with pytest.raises(OptionError, match=want):
            kernel_precision(kernel, precision)


DTYPES = [
    # (precision, dtype, allowed)
    ("tf32x3", "float32", True),  # what it is for
    ("tf32", "float32", True),  # what it is for
    ("float32", "float64", True),  # the default with any dtype
    ("float32", "bfloat16", True),  # the default with any dtype
    ("tf32", "float64", False),  # float64 runs in float64
    ("tf32x3", "float64", False),  # float64 runs in float64
    ("tf32", "float16", False),  # half precision is on tensor cores already
    ("tf32x3", "bfloat16", False),  # half precision is on tensor cores already
]


@pytest.mark.parametrize("precision, dtype, allowed", DTYPES)
def test_precision_against_the_dtype(precision, dtype, allowed):
    if allowed:
        assert check_dtype(precision, dtype) == precision
    else:
        with pytest.raises(OptionError, match=f"precision='float32' .* for {dtype}"):
            check_dtype(precision, dtype)


def test_describe_says_what_runs_where():
    assert describe("tf32x3", "float32", True) == "3xTF32 (float32 accuracy on tensor cores)"
    assert describe("float32", "float32", True) == "IEEE float32 (CUDA cores)"
    assert "TF32" in describe("tf32", "float32", True)
    cpu = describe("tf32", "float32", False)
    assert cpu.startswith("IEEE float32 (CPU)") and "at least as accurate" in cpu
    assert describe("float32", "float32", False) == "IEEE float32 (CPU)"
    assert "float64" in describe("float32", "float64", True)


# ----- the API -----------------------------------------------------------------------------

@pytest.mark.parametrize("call", ["matmul", "plan", "budget_note"])
def test_api_refuses_a_bad_precision(files, call):
    _, a, b, _, _ = files
    with pytest.raises(OptionError, match="Expected precision to be one of"):
        getattr(bigmm.api, call)(a, b, memory=BUDGET, backend="numpy", precision="half")


@pytest.mark.parametrize("call", ["matmul", "plan", "budget_note"])
def test_api_refuses_tf32_with_float64(call):
    a, b = random_matrix((40, 30), F64, 1), random_matrix((30, 20), F64, 2)
    with pytest.raises(OptionError, match="float64 operands"):
        getattr(bigmm.api, call)(a, b, backend="numpy", precision="tf32")


def test_api_refuses_tf32_with_mixed_operands_multiplied_in_float64():
    a, b = random_matrix((40, 30), F32, 1), random_matrix((30, 20), F64, 2)
    with pytest.raises(OptionError, match="float64 operands"):
        bigmm.matmul(a, b, backend="numpy", precision="tf32x3")


def test_api_refuses_cublas_with_tf32x3_on_any_backend():
    a, b = random_matrix((40, 30), F32, 1), random_matrix((30, 20), F32, 2)
    with pytest.raises(OptionError, match="cuBLAS has no float32-accurate"):
        bigmm.matmul(a, b, backend="numpy", kernel="cublas", precision="tf32x3")


@pytest.mark.parametrize("precision", [None, "float32", "tf32x3", "tf32", "TF32"])
def test_cpu_products_are_float32_whatever_the_precision(files, precision):
    tmp, a, b, xa, xb = files
    out = f"{tmp / 'c.h5'}:/C"
    _, stats = bigmm.matmul(a, b, out, memory=BUDGET, backend="numpy", precision=precision,
                            stats=True)
    assert stats.tiles_total >= 4
    with h5py.File(tmp / "c.h5", "r") as f:
        got = f["C"][...]
    assert got.dtype == F32
    assert relative_error(got, reference_gemm(xa, xb)) <= tolerance(F32, K)
    c = np.full((M, N), np.nan, F32)
    bigmm.matmul(xa, xb, c, memory=BUDGET, backend="numpy", precision=precision)
    assert relative_error(c, reference_gemm(xa, xb)) <= tolerance(F32, K)


def test_plan_states_the_arithmetic(files):
    _, a, b, _, _ = files
    p = bigmm.plan(a, b, memory=BUDGET, backend="numpy", precision="tf32x3")
    assert p.arithmetic.startswith("IEEE float32 (CPU); tf32x3 asked")
    assert "arithmetic" in str(p) and p.to_dict()["arithmetic"] == p.arithmetic
    default = bigmm.plan(a, b, memory=BUDGET, backend="numpy")
    assert default.arithmetic == "IEEE float32 (CPU)"
    assert default == p  # the same schedule: precision changes the arithmetic only


def test_budget_note_takes_a_precision(files):
    _, a, b, _, _ = files
    assert bigmm.api.budget_note(a, b, memory=BUDGET, backend="numpy",
                                 precision="tf32") is None  # the CPU plans by bytes


def test_job_record_holds_a_precision_other_than_the_default(files):
    _, a, b, _, _ = files
    p = bigmm.plan(a, b, memory=BUDGET, backend="numpy")
    assert "precision" not in job.job_record(p, 1.0, 0.0)  # as outputs written before it
    assert job.job_record(p, 1.0, 0.0, "tf32")["precision"] == "tf32"


# ----- resume --------------------------------------------------------------------------------

RESUMES = [
    # (first run's precision, the resume's, refused)
    (None, "tf32", True),  # the default recorded implicitly
    ("tf32x3", None, True),  # back to the default
    ("tf32x3", "tf32", True),  # another tensor-core precision
    ("tf32", "TF32", False),  # the same, in another case
    (None, "float32", False),  # the default, named
]


@pytest.mark.parametrize("first, then, refused", RESUMES)
def test_resume_in_another_precision_is_refused(files, first, then, refused):
    tmp, a, b, xa, xb = files
    out = f"{tmp / 'c.h5'}:/C"
    with pytest.raises(bigmm.errors.Interrupted):
        bigmm.matmul(a, b, out, memory=BUDGET, backend="numpy", precision=first,
                     progress=_StopAfter(1))
    if refused:
        with pytest.raises(ResumeError, match="precision: recorded"):
            bigmm.matmul(a, b, out, memory=BUDGET, backend="numpy", precision=then,
                         resume=True)
        return
    _, stats = bigmm.matmul(a, b, out, memory=BUDGET, backend="numpy", precision=then,
                            resume=True, stats=True)
    assert stats.tiles_skipped >= 1
    assert verify(a, b, out).passed


def test_a_finished_output_of_another_precision_is_another_job(files):
    tmp, a, b, _, _ = files
    out = f"{tmp / 'c.h5'}:/C"
    bigmm.matmul(a, b, out, memory=BUDGET, backend="numpy", precision="tf32")
    _, stats = bigmm.matmul(a, b, out, backend="numpy", precision="tf32", resume=True,
                            stats=True)
    assert stats.flops == 0  # the same job: complete
    for other in (None, "tf32x3"):  # the default (not recorded) and another
        with pytest.raises(ResumeError, match="precision"):
            bigmm.matmul(a, b, out, backend="numpy", resume=True, precision=other)


# ----- the command line ----------------------------------------------------------------------

def _run(capsys, *argv):
    rc = main([str(x) for x in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_plan_prints_the_arithmetic(files, capsys):
    _, a, b, _, _ = files
    rc, out, _ = _run(capsys, "plan", a, b, "--memory", BUDGET, "--backend", "numpy",
                      "--precision", "TF32X3")
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("arithmetic"))
    assert "IEEE float32 (CPU); tf32x3 asked" in line


def test_cli_multiply_and_verify_with_a_precision(files, capsys):
    tmp, a, b, xa, xb = files
    out = f"{tmp / 'c.h5'}:/C"
    rc, _, err = _run(capsys, "multiply", a, b, "-o", out, "--memory", BUDGET, "--backend",
                      "numpy", "--precision", "tf32", "-q")
    assert rc == 0, err
    assert _run(capsys, "verify", a, b, out, "--precision", "tf32")[0] == 0
    rc, _, err = _run(capsys, "multiply", a, b, "-o", out, "--memory", BUDGET, "--backend",
                      "numpy", "--resume", "-q")
    assert rc == 2 and "precision" in err


@pytest.mark.parametrize("command", ["multiply", "plan", "bench"])
def test_cli_refuses_an_unknown_precision(files, capsys, command):
    tmp, a, b, _, _ = files
    args = {"multiply": [a, b, "-o", f"{tmp / 'c.h5'}:/C"], "plan": [a, b],
            "bench": ["--size", 50]}[command]
    rc, _, err = _run(capsys, command, *args, "--precision", "fp8")
    assert rc == 2 and "argument --precision: invalid choice: 'fp8'" in err


def test_cli_names_the_flag_in_the_float64_error(tmp_path, capsys):
    a = generate(f"{tmp_path / 'a.h5'}:/A", (40, 30), dtype="float64", seed=1)
    b = generate(f"{tmp_path / 'b.h5'}:/B", (30, 20), dtype="float64", seed=2)
    rc, _, err = _run(capsys, "plan", a, b, "--backend", "numpy", "--precision", "tf32")
    assert rc == 2 and "--precision 'float32'" in err and "float64 operands" in err


def test_cli_bench_with_a_precision(capsys):
    rc, out, _ = _run(capsys, "bench", "--size", 120, "--backend", "numpy", "--precision",
                      "tf32x3", "--json")
    assert rc == 0
    import json

    result = json.loads(out)
    assert result["precision"] == "tf32x3" and result["verified"]


# ----- checksum and verify bounds ------------------------------------------------------------

def _tf32(x: np.ndarray) -> np.ndarray:
    """float32 values with their 13 low mantissa bits cleared: TF32 truncation (the harsher
    of the two roundings a tensor core's inputs may get)."""
    return (np.ascontiguousarray(x, F32).view(np.uint32) & np.uint32(0xFFFFE000)).view(F32)


def _column_check(c: np.ndarray, a: np.ndarray, b: np.ndarray, rounding: Rounding) -> float:
    """The largest column-sum mismatch of C against op(A) @ op(B), in units of the bound of
    ``rounding`` (the NumPy backend's comparison; above 1 is a fault)."""
    k = a.shape[1]
    a64, b64 = a.astype(F64), b.astype(F64)
    expected, magnitude = a64.sum(0) @ b64, np.abs(a64).sum(0) @ np.abs(b64)
    actual = c.astype(F64).sum(0)
    rel, floor = rounding_bounds(rounding, np.dtype(F32), k, 1, c.shape[0])
    result = np.zeros(2)
    NumpyBackend().compare_sums(expected, magnitude, actual, rel, floor, result)
    return float(result[0])


def _tf32_product(a, b):
    """op(A) @ op(B) as the TF32 tensor cores compute it: inputs truncated to TF32, exact
    products, accumulated in float64 here (more accurate than the hardware's float32)."""
    return (_tf32(a).astype(F64) @ _tf32(b).astype(F64)).astype(F32)


def _tf32_rna(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32, to nearest with ties away (``cvt.rna.tf32.f32``)."""
    bits = np.ascontiguousarray(x, F32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32).view(F32)


def _split_product(a, b, to_tf32):
    """3xTF32 as the kernels compute it, in float64 (x = big + small, small*small dropped)."""
    def split(x):
        big = to_tf32(x)
        return big.astype(F64), to_tf32((x.astype(F64) - big).astype(F32)).astype(F64)

    (ab, as_), (bb, bs) = split(a), split(b)
    return (ab @ bb + ab @ bs + as_ @ bb).astype(F32)


def _worst_check(c, a, b, rounding) -> float:
    """The larger of the column and the row check's mismatch, in units of their bounds."""
    return max(_column_check(c, a, b, rounding), _column_check(c.T, b.T, a.T, rounding))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 400), n=st.integers(1, 40),
       data=st.sampled_from(["normal", "positive", "wide"]),
       rounding=st.sampled_from(["truncate", "nearest"]), seed=st.integers(0, 2**32 - 1))
def test_correct_tensor_core_products_never_fail_their_checks(m, k, n, data, rounding, seed):
    rng = np.random.default_rng(seed)

    def draw(shape):
        if data == "positive":
            return rng.uniform(0.0, 1.0, shape).astype(F32)
        x = rng.standard_normal(shape)
        return (x * np.exp2(rng.integers(-20, 20, shape)) if data == "wide" else x).astype(F32)

    a, b = draw((m, k)), draw((k, n))
    to_tf32 = _tf32 if rounding == "truncate" else _tf32_rna
    tf32 = (to_tf32(a).astype(F64) @ to_tf32(b).astype(F64)).astype(F32)
    assert _worst_check(tf32, a, b, ROUNDING["tf32"]) <= 1.0
    assert _worst_check(_split_product(a, b, to_tf32), a, b, ROUNDING["tf32x3"]) <= 1.0


def test_tf32_products_pass_their_bound_where_float32s_would_cry_wolf():
    # positive operands: truncation biases every product the same way
    rng = np.random.default_rng(5)
    a = rng.uniform(0.5, 1.0, (300, 1000)).astype(F32)
    b = rng.uniform(0.5, 1.0, (1000, 200)).astype(F32)
    c = _tf32_product(a, b)
    assert _column_check(c, a, b, ROUNDING["tf32"]) <= 1.0
    assert _column_check(c, a, b, ROUNDING["float32"]) > 1.0


def test_tf32_bound_still_catches_faults():
    rng = np.random.default_rng(6)
    a = rng.standard_normal((300, 1000)).astype(F32)
    b = rng.standard_normal((1000, 200)).astype(F32)
    c = _tf32_product(a, b)
    assert _column_check(c, a, b, ROUNDING["tf32"]) <= 1.0
    # a flipped exponent bit
    hit = c.copy()
    flip_exponent(hit, (17, 33))
    assert _column_check(hit, a, b, ROUNDING["tf32"]) > 1.0
    # an element off by 2% of its column's magnitude (a lost panel's worth, say): caught,
    # where a bound scaling TF32's epsilon with K (2 * 2^-10 * (K + ...) > 1) would not
    hit = c.copy()
    magnitude = np.abs(a.astype(F64)).sum(0) @ np.abs(b.astype(F64))
    hit[5, 7] += np.float32(0.02 * magnitude[7])
    assert _column_check(hit, a, b, ROUNDING["tf32"]) > 1.0
    assert _column_check(hit, a, b, Rounding(2.0 ** -10)) <= 1.0


def test_tf32x3_rounding_is_float32s_with_three_terms():
    r = ROUNDING["tf32x3"]
    assert r.eps == float(np.finfo(F32).eps) and r.terms == 3 and r.product <= 2.0 ** -18
    rel3, _ = rounding_bounds(r, np.dtype(F32), 1000, 4, 256)
    rel1, _ = rounding_bounds(ROUNDING["float32"], np.dtype(F32), 1000, 4, 256)
    assert rel1 < rel3 < 4 * rel1  # float32's order: a fault is seen as with float32


def test_backends_state_their_rounding():
    be = NumpyBackend()
    assert be.rounding(np.dtype(F32)) == ROUNDING["float32"]  # the CPU: IEEE float32
    assert be.rounding(np.dtype(F64)) == Rounding(float(np.finfo(F64).eps))
    from bigmm.units import numpy_dtype

    assert be.rounding(numpy_dtype("bfloat16")) == ROUNDING["float32"]


def test_verify_tolerance_grows_by_the_product_rounding():
    base = verify_tolerance(F32, F32, F32, 1000)
    assert verify_tolerance(F32, F32, F32, 1000, "float32") == base
    assert verify_tolerance(F32, F32, F32, 1000, "tf32") == pytest.approx(
        base + VERIFY_SAFETY * ROUNDING["tf32"].product)
    assert verify_tolerance(F32, F32, F32, 1000, "tf32x3") == pytest.approx(
        base + VERIFY_SAFETY * 2.0 ** -18)  # of float32's order
    with pytest.raises(OptionError, match="float64 operands"):
        verify_tolerance(F64, F64, F64, 1000, "tf32")


def test_verify_passes_a_tf32_product_only_with_its_precision(tmp_path):
    a = random_matrix((200, 700), F32, 3)
    b = random_matrix((700, 150), F32, 4)
    c = _tf32_product(a, b)
    assert not verify(a, b, c).passed  # TF32's error is far beyond float32's
    assert verify(a, b, c, precision="tf32").passed
