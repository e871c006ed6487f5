"""verify(): exact and sampled checks of C against alpha*op(A)@op(B) + beta*C0."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import bigmm
from bigmm.errors import IncompleteOutputError, OptionError, ShapeError
from bigmm.io.generate import block, generate
from bigmm.testing import reference_gemm
from bigmm.verify import verify


def _operands(tmp_path, m, k, n, dtype, trans_a=False, trans_b=False):
    """Seeded A, B on disk (stored transposed where asked) and their in-memory copies."""
    path = tmp_path / "ops.h5"
    sa = (k, m) if trans_a else (m, k)
    sb = (n, k) if trans_b else (k, n)
    a = generate(f"{path}:/A", sa, dtype=dtype, seed=11)
    b = generate(f"{path}:/B", sb, dtype=dtype, seed=12)
    return a, b, block(sa, 11, 0, sa[0], dtype), block(sb, 12, 0, sb[0], dtype)


def _write(tmp_path, name, array, complete=None):
    path = tmp_path / f"{name}.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset(name, data=array)
        if complete is not None:
            d.attrs["bigmm_complete"] = complete
    return f"{path}:/{name}"


def _product(a, b, dtype, **kw):
    return reference_gemm(a, b, **kw).astype(dtype)


@pytest.mark.parametrize("m, k, n, dtype, trans_a, trans_b, alpha, beta, exact_limit", [
    (23, 37, 19, "float32", False, False, 1.0, 0.0, None),   # plain product, exact
    (1, 101, 1, "float64", False, False, -0.5, 0.0, None),   # 1x1 result, negative alpha
    (31, 7, 29, "float32", True, False, 1.0, 2.5, None),     # A transposed, beta with C0
    (17, 53, 41, "float64", False, True, 0.3, -1.0, None),   # B transposed, beta < 0
    (43, 29, 13, "float32", True, True, 1.0, 0.0, 0),        # both transposed, sampled
    (61, 47, 59, "float32", False, False, 2.0, 0.5, 0),      # sampled with C0
])
def test_correct_product_passes(tmp_path, m, k, n, dtype, trans_a, trans_b, alpha, beta,
                                exact_limit):
    a, b, xa, xb = _operands(tmp_path, m, k, n, dtype, trans_a, trans_b)
    old = np.random.default_rng(5).standard_normal((m, n)).astype(dtype)
    c = _product(xa, xb, dtype, alpha=alpha, beta=beta, c=old, trans_a=trans_a, trans_b=trans_b)
    c0 = _write(tmp_path, "C0", old) if beta else None
    kw = {} if exact_limit is None else {"exact_limit": exact_limit}
    r = verify(a, b, _write(tmp_path, "C", c), alpha=alpha, beta=beta, c0=c0, trans_a=trans_a,
               trans_b=trans_b, block_elements=97, **kw)
    assert r.passed, r
    assert r.method.startswith("exact" if exact_limit is None else "sampled")
    assert 0 <= r.max_rel_error <= r.tolerance
    assert r.checked == (m * n if exact_limit is None else min(16, m) * n)


@pytest.mark.parametrize("damage, exact_limit", [
    ("one element +1", None),                 # a single wrong element, exact mode
    ("one element NaN", None),                # NaN must never pass
    ("wrong row", 0),                         # a garbage row, sampled (Freivalds sees it)
    ("missing K panel", 0),                   # one tile missed a K panel, sampled
    ("one element NaN", 0),                   # NaN, sampled
    ("sampled row element +1", 0),            # small error in a sampled row
])
def test_damaged_product_fails(tmp_path, damage, exact_limit):
    m, k, n = 67, 83, 71
    a, b, xa, xb = _operands(tmp_path, m, k, n, "float32")
    c = _product(xa, xb, "float32")
    if damage == "one element +1":
        c[40, 13] += 1.0
    elif damage == "one element NaN":
        c[66, 70] = np.nan
    elif damage == "wrong row":
        c[5] = np.random.default_rng(1).standard_normal(n) * np.abs(c[5]).mean()
    elif damage == "missing K panel":
        c[16:32, 32:48] -= xa[16:32, 64:83] @ xb[64:83, 32:48]
    else:  # the rows the sampled check picks with seed 0
        rows = np.sort(np.random.default_rng(0).choice(m, size=16, replace=False))
        c[rows[3], 9] += 1.0
    kw = {} if exact_limit is None else {"exact_limit": exact_limit}
    r = verify(a, b, _write(tmp_path, "C", c), block_elements=300, **kw)
    assert not r.passed, r
    assert r.max_rel_error > r.tolerance
    assert r.worst is not None


@pytest.mark.parametrize("scale", [1e-21, 1e-25])  # products subnormal; C rounds to zero
@pytest.mark.parametrize("exact_limit", [10**12, 0])  # element by element; sampled
def test_products_that_underflow_pass(scale, exact_limit):
    # float32 products below the smallest normal number are right to within underflow (NumPy's
    # own A @ B here); an error of 5% in one element of a normal product still fails
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((300, 400)) * scale).astype(np.float32)
    b = (rng.standard_normal((400, 200)) * scale).astype(np.float32)
    assert verify(a, b, a @ b, exact_limit=exact_limit).passed
    a, b = a / np.float32(scale), b / np.float32(scale)
    c = a @ b
    c[7, 9] *= np.float32(1.05)
    assert not verify(a, b, c).passed


@pytest.mark.parametrize("exact_limit", [10**12, 0])
def test_a_float16_c_below_its_smallest_normal_is_still_checked(exact_limit):
    # products of about 1e-5 are float16 subnormals, held to 2**-24: the allowance for C's
    # rounding near zero was float16's smallest normal (6.1e-5), which passed a C of zeros
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((300, 40)) * 1e-3).astype(np.float16)
    b = (rng.standard_normal((40, 200)) * 1e-3).astype(np.float16)
    c = bigmm.matmul(a, b, out_dtype="float16", backend="numpy")
    assert verify(a, b, c, exact_limit=exact_limit).passed
    assert not verify(a, b, np.zeros_like(c), exact_limit=exact_limit).passed
    c[7, 9] = -c[7, 9]
    assert not verify(a, b, c, exact_limit=exact_limit).passed


def test_incomplete_output_is_an_error(tmp_path):
    a, b, xa, xb = _operands(tmp_path, 9, 8, 7, "float64")
    c = _write(tmp_path, "C", _product(xa, xb, "float64"), complete=False)
    with pytest.raises(IncompleteOutputError):
        verify(a, b, c)


@pytest.mark.parametrize("kwargs, error", [
    (dict(beta=1.0), OptionError),            # beta without the old C
    (dict(samples=-1), OptionError),          # negative sample count
    (dict(trans_a=True), ShapeError),         # op(A) no longer matches op(B)
    (dict(alpha="x"), OptionError),           # alpha not a number
    (dict(alpha=float("inf")), OptionError),  # alpha not finite
    (dict(beta=float("nan"), c0=np.zeros((9, 7))), OptionError),  # beta NaN, with C0
    (dict(probes=10**12, exact_limit=0), OptionError),  # probes beyond any memory
    (dict(upper="yes"), OptionError),         # upper not a bool
])
def test_bad_arguments(tmp_path, kwargs, error):
    a, b, xa, xb = _operands(tmp_path, 9, 8, 7, "float64")
    c = _write(tmp_path, "C", _product(xa, xb, "float64"))
    with pytest.raises(error, match="Expected"):
        verify(a, b, c, **kwargs)


def test_wrong_output_shape(tmp_path):
    a, b, xa, xb = _operands(tmp_path, 9, 8, 7, "float64")
    c = _write(tmp_path, "C", _product(xa, xb, "float64")[:, :6])
    with pytest.raises(ShapeError, match="Expected C of shape"):
        verify(a, b, c)


def test_arrays_and_datasets(tmp_path):
    a, b, xa, xb = _operands(tmp_path, 19, 23, 17, "float64")
    c = _product(xa, xb, "float64")
    assert verify(xa, xb, c).passed  # NumPy arrays
    with h5py.File(tmp_path / "ops.h5", "r") as f:
        assert verify(f["A"], f["B"], c, exact_limit=0).passed  # h5py datasets, sampled
    c[3, 4] *= 1.01
    assert not verify(xa, xb, c).passed


def _with_non_finite():
    """A and B holding Inf and NaN, and their product as float64 gives it (in float32)."""
    rng = np.random.default_rng(23)
    a = rng.standard_normal((50, 40)).astype(np.float32)
    b = rng.standard_normal((40, 30)).astype(np.float32)
    a[0, 0], a[3, 2], b[5, 7] = np.inf, np.nan, -np.inf
    with np.errstate(invalid="ignore", over="ignore"):
        return a, b, (a.astype(np.float64) @ b).astype(np.float32)


@pytest.mark.parametrize("damage, passed", [
    (None, True),                # Inf and NaN where the reference has them
    ("sign of an Inf", False),   # -Inf for +Inf
    ("finite for NaN", False),   # a number where the reference is NaN
    ("Inf for finite", False),   # Inf where the reference is finite
    ("NaN for finite", False),   # NaN where the reference is finite
])
@pytest.mark.parametrize("exact_limit", [None, 0])  # element by element; sampled
def test_non_finite_operands(damage, passed, exact_limit):
    a, b, c = _with_non_finite()
    assert np.isposinf(c[0, 1]) and np.isnan(c[3, 1]) and np.isfinite(c[10, 1])
    rows = np.sort(np.random.default_rng(0).choice(50, size=16, replace=False))
    assert {0, 3, 10} <= set(rows.tolist())  # the damaged rows are among those sampled
    r = 10
    if damage == "sign of an Inf":
        c[0, 1] = -np.inf
    elif damage == "finite for NaN":
        c[3, 1] = 1.0
    elif damage == "Inf for finite":
        c[r, 1] = np.inf
    elif damage == "NaN for finite":
        c[r, 1] = np.nan
    kw = {} if exact_limit is None else {"exact_limit": exact_limit}
    result = verify(a, b, c, **kw)
    assert result.passed == passed, result
    if not passed and damage in ("Inf for finite", "NaN for finite"):
        assert result.worst == (r, 1)


@pytest.mark.parametrize("beta, kw", [
    (0.0, {}),                                # C = 0: A, B (NaN) not read
    (2.0, {}),                                # C = beta * C0
    (0.0, {"verify": "checksum"}),            # checked tile by tile as it runs
    (2.0, {"verify": "checksum"}),            # the same with C0
    (0.0, {"memory": "64KiB"}),               # many tiles and K panels
])
def test_alpha_zero_reads_neither_a_nor_b(beta, kw):
    # BLAS's convention, in bigmm.matmul (numpy backend) and in verify's reference
    a = np.ones((40, 30), np.float32)
    a[0, 0], a[5, 5] = np.nan, np.inf
    b = np.ones((30, 20), np.float32)
    b[2, 3] = np.nan
    old = np.arange(800, dtype=np.float32).reshape(40, 20)
    old[1, 1] = np.nan
    c = old.copy()
    bigmm.matmul(a, b, c, alpha=0.0, beta=beta, backend="numpy", **kw)
    np.testing.assert_array_equal(c, beta * old if beta else np.zeros_like(old))
    for limit in (10**9, 0):  # element by element; sampled
        assert verify(a, b, c, alpha=0.0, beta=beta, c0=old, exact_limit=limit).passed
    with np.errstate(invalid="ignore"):
        assert not verify(a, b, 0 * (a @ b) + beta * old, alpha=0.0, beta=beta, c0=old).passed
    c[7, 7] += 1.0
    assert not verify(a, b, c, alpha=0.0, beta=beta, c0=old).passed


def test_beta_zero_does_not_read_c0():
    a, b = np.ones((4, 3)), np.ones((3, 2))
    assert verify(a, b, a @ b, beta=0.0, c0="/nonexistent/c0.h5:/C").passed


# ----- Gram outputs of the upper triangle (bigmm.gram(..., upper=True), gram --upper) ----------

def _gram_upper(tmp_path, fmt, shape, trans, beta):
    """A fresh A, C = 0.7 * A^T A + beta * C0 (A A^T for trans=False) of the upper triangle
    written by bigmm.gram into an HDF5 or Zarr output, and the specs of A, C and C0 (None for
    beta == 0) with C's values as written."""
    a = generate(f"{tmp_path / 'a.h5'}:/A", shape, dtype="float32",
                 seed=int(np.random.default_rng().integers(1, 2**31)))
    n = shape[1] if trans else shape[0]
    c = f"{tmp_path / 'g.zarr'}" if fmt == "zarr" else f"{tmp_path / 'g.h5'}:/G"
    c0 = None
    if beta:  # old C, not symmetric (its lower triangle is never read)
        seed = int(np.random.default_rng().integers(1, 2**31))
        generate(c, (n, n), dtype="float32", seed=seed)
        c0 = generate(f"{tmp_path / 'c0.h5'}:/C0", (n, n), dtype="float32", seed=seed)
    bigmm.gram(a, c, trans=trans, upper=True, alpha=0.7, beta=beta, memory="64KiB",
               backend="numpy")
    return a, c, c0


def _poke(spec, fmt, i, j, value):
    """Set element (i, j) of the stored output C, keeping its record."""
    if fmt == "zarr":
        import zarr
        arr = zarr.open_array(spec, mode="r+")
        arr[i, j] = value
        return
    path, name = spec.rsplit(":", 1)
    with h5py.File(path, "r+") as f:
        f[name][i, j] = value


def _peek(spec, fmt, i, j):
    if fmt == "zarr":
        import zarr
        return float(zarr.open_array(spec, mode="r")[i, j])
    path, name = spec.rsplit(":", 1)
    with h5py.File(path, "r") as f:
        return float(f[name][i, j])


@pytest.mark.parametrize("fmt, shape, trans, beta, exact_limit", [
    ("h5", (61, 47), True, 0.0, None),      # A^T A in HDF5, element by element
    ("h5", (47, 61), False, 0.0, 0),        # A A^T in HDF5, sampled
    ("zarr", (53, 71), True, 1.5, None),    # Zarr, beta != 0 with C0, element by element
    ("zarr", (71, 53), False, -0.5, 0),     # Zarr, A A^T, beta < 0 with C0, sampled
    ("h5", (131, 67), False, 2.0, 0),       # ragged tiles of A A^T, beta with C0, sampled
    ("zarr", (29, 83), True, 0.0, None),    # ragged tiles of A^T A in Zarr
])
def test_upper_gram_output(tmp_path, fmt, shape, trans, beta, exact_limit):
    a, c, c0 = _gram_upper(tmp_path, fmt, shape, trans, beta)
    n = shape[1] if trans else shape[0]
    kw = dict(alpha=0.7, beta=beta, c0=c0, trans_a=trans, trans_b=not trans,
              block_elements=300)
    if exact_limit is not None:
        kw["exact_limit"] = exact_limit
    r = verify(a, a, c, **kw)  # upper read from C's record
    assert r.passed, r
    assert "upper triangle" in r.method
    assert verify(a, a, c, upper=True, **kw).passed  # the same, asked for
    rng = np.random.default_rng()
    i, j = sorted(int(v) for v in rng.choice(n, size=2, replace=False))
    kept = _peek(c, fmt, i, j)
    _poke(c, fmt, i, j, kept + 1.0 + 10 * abs(kept))  # one wrong element above the diagonal
    r = verify(a, a, c, **kw)
    assert not r.passed and r.worst is not None and r.worst[0] == i, r
    _poke(c, fmt, i, j, kept)
    for value in (rng.standard_normal() + 3.0, 1e-37):  # below: any non-zero, even a tiny one
        _poke(c, fmt, j, i, value)
        r = verify(a, a, c, **kw)
        assert not r.passed and r.worst == (j, i), r
        _poke(c, fmt, j, i, 0.0)
    assert verify(a, a, c, **kw).passed


@pytest.mark.parametrize("exact_limit", [None, 0])  # element by element; sampled
def test_upper_asked_for_without_a_record(exact_limit):
    # arrays carry no record: upper=True checks the upper triangle and zeros below
    rng = np.random.default_rng()
    a = rng.standard_normal((40, 33))
    c = np.triu(a.T @ a)
    kw = {} if exact_limit is None else {"exact_limit": exact_limit}
    assert verify(a, a, c, trans_a=True, upper=True, **kw).passed
    assert not verify(a, a, c, trans_a=True, **kw).passed  # the whole product: zeros wrong
    assert not verify(a, a, a.T @ a, trans_a=True, upper=True, **kw).passed  # mirrored below


@pytest.mark.parametrize("exact_limit", [None, 0])  # exact; sampled
def test_a_failure_names_the_options_the_output_records(tmp_path, exact_limit):
    kw = {} if exact_limit is None else dict(exact_limit=exact_limit)
    x = generate(f"{tmp_path / 'x.h5'}:/X", (23, 23), seed=5)
    c = f"{tmp_path / 'c.h5'}:/C"
    bigmm.matmul(x, x, c, trans_b=True, alpha=2.0, backend="numpy")
    r = verify(x, x, c, **kw)  # the product's options left out
    assert not r.passed and r.hint == ("C's record says alpha 2.0, trans_b True (checked with "
                                       "alpha 1.0, trans_b False)")
    assert str(r).endswith("; " + r.hint) and r.to_dict()["hint"] == r.hint
    r = verify(x, x, c, trans_b=True, alpha=2.0, **kw)
    assert r.passed and "record" not in str(r) and r.to_dict()["hint"] == ""


def test_upper_needs_a_square_product():
    rng = np.random.default_rng()
    a, b = rng.standard_normal((9, 8)), rng.standard_normal((8, 7))
    with pytest.raises(ShapeError, match="Expected a square product"):
        verify(a, b, a @ b, upper=True)


@pytest.mark.parametrize("aat", [False, True])  # gram --upper of A^T A, and of A A^T
def test_cli_verifies_an_upper_gram_output(tmp_path, capsys, aat):
    from bigmm.cli import main

    a, g = f"{tmp_path / 'x.h5'}:/X", f"{tmp_path / 'g.h5'}:/G"
    seed = int(np.random.default_rng().integers(1, 2**31))
    assert main(["generate", a, "--shape", "57", "43", "--seed", str(seed)]) == 0
    argv = ["gram", a, "-o", g, "--upper", "--memory", "64KiB", "--backend", "numpy"]
    assert main(argv + (["--aat"] if aat else [])) == 0
    check = ["verify", a, a, g, "--trans-b" if aat else "--trans-a"]
    capsys.readouterr()
    assert main(check) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASSED") and "upper triangle" in out, out
    assert main(check + ["--upper"]) == 0
    _poke(g, "h5", 5, 2, 0.25)  # non-zero below the diagonal
    capsys.readouterr()
    assert main(check) == 1
    assert capsys.readouterr().out.startswith("FAILED")
