"""Checksum verification (ABFT) of every C tile: no false positives, and injected faults (a bit
flipped in an input panel after it landed, a value changed in a finished C tile) detected, the
tile recomputed and the product right. The same fault tests run on the GPU backend (``gpu``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import bigmm
from bigmm import io
from bigmm.backends import get_backend
from bigmm.backends.numpy import NumpyBackend
from bigmm.checksum import FUSED_ROUNDINGS, Mismatch, bounds, parse_verify
from bigmm.cli import main
from bigmm.errors import ChecksumError, OptionError, OutputOverflowError
from bigmm.executor import execute
from bigmm.planner import make_plan
from bigmm.testing import (Faults, flip_exponent, random_matrix, reference_gemm, relative_error,
                           tolerance)

F32, F64 = np.float32, np.float64


def _operands(m, n, k, dtype, trans_a, trans_b, beta, data="normal", seed=0):
    shape_a = (k, m) if trans_a else (m, k)
    shape_b = (n, k) if trans_b else (k, n)
    if data == "positive":
        rng = np.random.default_rng(seed)
        a, b = (rng.random(s).astype(dtype) for s in (shape_a, shape_b))
    else:
        a, b = random_matrix(shape_a, dtype, seed), random_matrix(shape_b, dtype, seed + 1)
    c0 = random_matrix((m, n), dtype, seed + 2) if beta != 0 else None
    return a, b, c0


def _run(m, n, k, dtype, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, budget=300_000,
         order=None, data="normal", faults=None, backend=None, staging=False):
    """(stats, C, reference, plan) of one checked run on arrays."""
    a, b, c0 = _operands(m, n, k, dtype, trans_a, trans_b, beta, data)
    be = backend or NumpyBackend()
    p = make_plan(m, n, k, np.dtype(dtype).name, trans_a=trans_a, trans_b=trans_b,
                  reads_c=beta != 0, device_budget=budget, host_budget=budget,
                  staging=be.staging, order=order)
    c = c0.copy() if beta != 0 else np.full((m, n), np.nan, dtype)
    A, B = io.open_input(a, name="A"), io.open_input(b, name="B")
    sink = io.open_output(c, shape=(m, n), dtype=np.dtype(dtype), inputs=[A, B], job={},
                          reads_c=beta != 0)
    try:
        stats = execute(p, A, B, sink, be, alpha=alpha, beta=beta, verify="checksum",
                        faults=faults)
    finally:
        if backend is None:
            be.close()
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=trans_a, trans_b=trans_b)
    return stats, sink.result, ref, p


# ----- no false positives -------------------------------------------------------------------

CLEAN = [
    # (m, n, k, dtype, trans_a, trans_b, alpha, beta, budget, data)
    # shapes not multiples of the tiles: edge tiles and a short last K panel
    (301, 257, 701, F32, False, False, 1.0, 0.0, 300_000, "normal"),
    # A transposed, alpha and beta (C0 read and summed in the first step)
    (199, 233, 517, F64, True, False, -1.5, 0.5, 600_000, "normal"),
    # B transposed, negative beta
    (160, 300, 450, F32, False, True, 0.75, -1.0, 300_000, "normal"),
    # both transposed, float64
    (211, 190, 640, F64, True, True, 2.0, 0.0, 500_000, "normal"),
    # all-positive data: the sums grow with K and every rounding error has the same scale
    (256, 256, 2048, F32, False, False, 1.0, 0.0, 1_500_000, "positive"),
    # all-positive, float64, with beta
    (128, 200, 999, F64, False, True, 1.0, 1.0, 800_000, "positive"),
    # long K (1e5), mixed sign, float32: the bound's K term
    (40, 36, 100_000, F32, False, False, 1.0, 0.0, 2_000_000, "normal"),
    # long K (1e5), all positive, float32: the largest sums relative to their rounding
    (36, 40, 100_000, F32, True, False, 1.0, 0.0, 2_000_000, "positive"),
    # long K (1e5), all positive, float64
    (32, 24, 100_000, F64, False, True, 1.0, 0.0, 3_000_000, "positive"),
    # tiny values whose products underflow: the absolute floor
    (64, 48, 300, F32, False, False, 1e-30, 0.0, 200_000, "normal"),
]


@pytest.mark.parametrize("m, n, k, dtype, ta, tb, alpha, beta, budget, data", CLEAN)
def test_no_false_positives(m, n, k, dtype, ta, tb, alpha, beta, budget, data):
    stats, c, ref, p = _run(m, n, k, dtype, trans_a=ta, trans_b=tb, alpha=alpha, beta=beta,
                            budget=budget, data=data)
    assert p.n_tiles >= 2 or len(p.k_panels()) >= 2
    assert stats.tiles_checked == p.n_tiles
    assert (stats.checksum_mismatches, stats.tiles_recomputed, stats.mismatches) == (0, 0, ())
    assert relative_error(c, ref) < tolerance(dtype, k)


def test_resident_panels_are_checked():
    # resident-a: one A row panel serves a row of tiles; its vectors are taken once
    stats, c, ref, p = _run(120, 2000, 600, F32, budget=2_000_000, order="resident-a")
    assert p.order == "resident-a" and p.n_tiles > 2
    assert stats.tiles_checked == p.n_tiles and stats.checksum_mismatches == 0
    assert relative_error(c, ref) < tolerance(F32, 600)


# ----- faults -------------------------------------------------------------------------------

FAULTS = [
    # (where, tile, kp, element, check that sees it, dtype, trans_a, trans_b, beta)
    # a bit flipped in an A panel after it landed: the column check (a_k came from the panel)
    ("A", (0, 1), 1, (3, 5), "column", F32, False, False, 0.0),
    # the same in a transposed A, float64
    ("A", (1, 0), 2, (6, 2), "column", F64, True, False, 0.0),
    # a bit flipped in a B panel: the row check
    ("B", (1, 0), 0, (7, 2), "row", F32, False, False, 0.0),
    # B transposed, with beta
    ("B", (0, 0), 3, (1, 9), "row", F32, False, True, 1.0),
    # a C value changed before write-back: both checks
    ("C", (1, 1), 0, (9, 9), "both", F32, False, False, 0.0),
    # C, float64, both transposed, beta
    ("C", (0, 1), 0, (0, 0), "both", F64, True, True, -0.5),
]


def _check_detected(stats, c, ref, faults, check, dtype, k):
    assert len(faults.fired) == 1, faults.fired
    assert stats.checksum_mismatches >= 1 and stats.tiles_recomputed == stats.checksum_mismatches
    first = stats.mismatches[0]
    assert first.tile == tuple(faults.tile)
    # the named check must fail; the other may too where the flipped value overflows C
    assert set(("column", "row") if check == "both" else (check,)) <= set(first.checks)
    assert stats.tiles_checked == stats.tiles_done + stats.tiles_recomputed
    assert relative_error(c, ref) < tolerance(dtype, k)


@pytest.mark.parametrize("where, tile, kp, element, check, dtype, ta, tb, beta", FAULTS)
def test_fault_detected_and_tile_recomputed(where, tile, kp, element, check, dtype, ta, tb, beta):
    faults = Faults(where, tile=tile, kp=kp, element=element)
    stats, c, ref, p = _run(300, 250, 700, dtype, trans_a=ta, trans_b=tb, beta=beta,
                            budget=300_000 if dtype == F32 else 600_000, faults=faults)
    assert p.ni >= 2 and p.nj >= 2 and len(p.k_panels()) > kp
    _check_detected(stats, c, ref, faults, check, dtype, 700)
    # stream order reloads each panel here, so only the faulty tile saw the fault
    assert stats.checksum_mismatches == 1


def test_fault_in_resident_panel_recomputes_every_tile_that_used_it():
    # the flipped A panel stays in its slot for the rest of the tile row
    faults = Faults("A", tile=(0, 0), kp=0, element=(5, 5))
    stats, c, ref, p = _run(120, 2000, 600, F32, budget=2_000_000, order="resident-a",
                            faults=faults)
    assert p.order == "resident-a"
    assert stats.checksum_mismatches == p.nj and stats.tiles_recomputed == p.nj
    assert all(m.checks == ("column",) for m in stats.mismatches)
    assert relative_error(c, ref) < tolerance(F32, 600)


def test_second_failure_raises_and_keeps_the_tile_unwritten(tmp_path):
    # the fault fires again when the tile is computed the second time
    faults = Faults("C", tile=(0, 1), element=(2, 2), times=2)
    a, b = random_matrix((300, 700), F32, 1), random_matrix((700, 250), F32, 2)
    out = f"{tmp_path / 'c.h5'}:/C"
    with pytest.raises(ChecksumError, match=r"Expected tile \(0, 1\) .* Got a second mismatch"):
        _matmul_with_faults(a, b, out, faults)
    job = io.read_journal(out)
    assert job is not None and [0, 1] not in job.get("tiles", [])


def _matmul_with_faults(a, b, out, faults):
    be = NumpyBackend()
    A, B = io.open_input(a, name="A"), io.open_input(b, name="B")
    p = make_plan(a.shape[0], b.shape[1], a.shape[1], "float32", device_budget=300_000,
                  host_budget=300_000, staging=False)
    sink = io.open_output(out, shape=(p.m, p.n), dtype=np.dtype(F32), inputs=[A, B],
                          job={"plan": p.key()}, tile=(p.bm, p.bn))
    try:
        return execute(p, A, B, sink, be, verify="checksum", faults=faults)
    finally:
        sink.close()


# ----- pieces -------------------------------------------------------------------------------

def test_weighted_sums_on_strided_views():
    be, rng = NumpyBackend(), np.random.default_rng(3)
    x = rng.standard_normal((70, 90)).astype(F32)
    w, wa = rng.standard_normal(90), rng.random(90)
    view = x[5:65:2, 3:].T  # 87 x 30, strided and transposed
    out, out_abs = np.full(30, 1.0), np.full(30, 2.0)
    be.weighted_sums(view, out, out_abs, weights=w[:87], abs_weights=wa[:87], scale=-2.0,
                     accumulate=True)
    v = view.astype(F64)
    np.testing.assert_allclose(out, 1.0 - 2.0 * (w[:87] @ v), rtol=1e-12)
    np.testing.assert_allclose(out_abs, 2.0 + 2.0 * (wa[:87] @ np.abs(v)), rtol=1e-12)
    be.weighted_sums(view, out, out_abs)  # ones, overwritten
    np.testing.assert_allclose(out, v.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(out_abs, np.abs(v).sum(axis=0), rtol=1e-12)


def test_compare_sums_non_finite():
    be = NumpyBackend()
    res = np.zeros(2)
    expected = np.array([1.0, np.inf, 3.0, 4.0])
    actual = np.array([1.0, 5.0, np.nan, 4.0])
    be.compare_sums(expected, np.ones(4), actual, 1e-6, 0.0, res)
    assert res[0] == np.inf and res[1] == 2  # NaN against a finite sum; Inf inputs skipped
    be.compare_sums(expected[:1], np.ones(1), actual[:1], 1e-6, 0.0, res)
    assert tuple(res) == (0.0, 0.0)


def test_compare_sums_where_c_may_truly_overflow():
    be = NumpyBackend()
    res = np.zeros(2)
    lim = float(np.finfo(F32).max)
    expected = np.array([1.0, 5e38, 3.0])
    actual = np.array([1.0, np.inf, 3.0])
    # column 1's magnitude reaches float32's limit: its Inf may be true, not a fault
    be.compare_sums(expected, np.array([1.0, 5e38, 3.0]), actual, 1e-6, 0.0, res, limit=lim)
    assert tuple(res) == (0.0, 0.0)
    # the same Inf where the magnitude could not overflow: a fault
    be.compare_sums(expected, np.array([1.0, 3e38, 3.0]), actual, 1e-6, 0.0, res, limit=lim)
    assert res[0] == np.inf and res[1] == 1


@pytest.mark.parametrize("backend", [
    "numpy",                                                             # the CPU
    pytest.param("cupy", marks=pytest.mark.gpu),                         # the GPU's kernels
])
def test_a_true_overflow_is_reported_as_one_and_a_fault_is_still_caught(backend):
    m, n, k = 130, 110, 96
    a, b = random_matrix((m, k), F32, 1), random_matrix((k, n), F32, 2)
    big_a, big_b = a.copy(), b.copy()
    big_a[3, :], big_b[:, 5] = 3e19, 3e19  # C[3, 5] = 96 * 9e38: +Inf in float32, for real
    be = get_backend(backend)
    try:
        p = make_plan(m, n, k, "float32", device_budget=60_000, host_budget=60_000,
                      staging=be.staging)

        def run(x, y, faults=None):
            c = np.full((m, n), np.nan, F32)
            A, B = io.open_input(x, name="A"), io.open_input(y, name="B")
            sink = io.open_output(c, shape=(m, n), dtype=np.dtype(F32), inputs=[A, B], job={})
            return execute(p, A, B, sink, be, verify="checksum", faults=faults), c

        # the overflow is the arithmetic's, not a fault: no recompute, one clear error
        with pytest.raises(OutputOverflowError, match=r"rows 0:\d+, columns 0:\d+"):
            run(big_a, big_b)
        clean, c = run(a, b)
        faulty, c2 = run(a, b, Faults(where="C", tile=(p.ni - 1, p.nj - 1), element=(1, 1)))
    finally:
        be.close()
    assert p.n_tiles > 4 and clean.tiles_checked == p.n_tiles
    assert clean.checksum_mismatches == 0 and clean.tiles_recomputed == 0  # no cry of wolf
    assert relative_error(c, reference_gemm(a, b)) < tolerance(F32, k)
    # a flipped exponent in a tile is caught and recomputed
    assert faulty.checksum_mismatches == 1 and faulty.tiles_recomputed == 1
    np.testing.assert_array_equal(c2, c)


def test_bounds_scale_with_k_eps_and_the_summed_dimension():
    r32, f32 = bounds(np.finfo(F32).eps, np.dtype(F32), 1000, 4, 256)
    r64, _ = bounds(np.finfo(F64).eps, np.dtype(F64), 1000, 4, 256)
    # K products, P panels, the rows summed, alpha, beta and the float64 sums, and what a
    # fused update's k-tiles summed in float32 add
    assert r32 == pytest.approx(2 * np.finfo(F32).eps * (1000 + 4 + 256 + 4 + FUSED_ROUNDINGS))
    assert r64 < r32 * 1e-8 and 0 < f32 < 1e-30


@pytest.mark.parametrize("dtype", [F32, F64])
def test_flip_exponent_makes_ordinary_values_huge_or_inf(dtype):
    x = np.array([[0.3, -1.5, 40.0]], dtype)
    for j in range(3):
        old, new = flip_exponent(x, (0, j))
        assert not np.isfinite(new) or abs(new) > 2.0 ** 60 * abs(old)
        assert x[0, j] == new or (np.isnan(new) and np.isnan(x[0, j]))


def test_parse_verify_and_mismatch_text():
    assert parse_verify(None) is None and parse_verify("CHECKSUM") == "checksum"
    with pytest.raises(OptionError, match="Expected verify to be None or 'checksum'. Got 'crc'"):
        parse_verify("crc")
    with pytest.raises(OptionError, match="where"):
        Faults("D")
    m = Mismatch((0, 1), (0, 10), (10, 20), 5.0, 3, 0.5, 1)
    assert m.checks == ("column",) and "column sums off by 5x" in str(m) and "row sums" not in str(m)


# ----- API and command line -----------------------------------------------------------------

def test_matmul_verify_counts_and_default_off():
    a, b = random_matrix((300, 500), F32, 1), random_matrix((500, 260), F32, 2)
    c, stats = bigmm.matmul(a, b, memory="300KB", backend="numpy", verify="checksum",
                            stats=True)
    assert stats.tiles_checked == stats.tiles_total > 1 and stats.checksum_mismatches == 0
    assert relative_error(c, reference_gemm(a, b)) < tolerance(F32, 500)
    _, stats = bigmm.matmul(a, b, memory="300KB", backend="numpy", stats=True)
    assert stats.tiles_checked == 0
    with pytest.raises(OptionError, match="Expected verify"):
        bigmm.matmul(a, b, backend="numpy", verify="yes")


def test_cli_multiply_verify_json_and_summary(tmp_path, capsys):
    from bigmm.io.generate import generate

    a, b, c = (f"{tmp_path / 'x.h5'}:/{n}" for n in "ABC")
    generate(a, (200, 300), seed=1)
    generate(b, (300, 150), seed=2)
    args = ["multiply", a, b, "-o", c, "--memory", "200KB", "--backend", "numpy",
            "--verify", "checksum"]
    assert main(args + ["--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["checksum"]["tiles_checked"] == s["tiles_total"] > 1
    assert (s["checksum"]["mismatches"], s["checksum"]["tiles_recomputed"]) == (0, 0)
    assert main(args + ["--overwrite"]) == 0
    out = capsys.readouterr().out
    assert f"checksum: {s['tiles_total']} tile checks, 0 mismatches detected" in out
    assert main(["multiply", a, b, "-o", c, "--overwrite", "--verify", "crc"]) == 2


# ----- GPU ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("where, tile, kp, element, check, dtype, ta, tb, beta", FAULTS)
def test_gpu_fault_detected_and_tile_recomputed(where, tile, kp, element, check, dtype, ta, tb,
                                                beta):
    faults = Faults(where, tile=tile, kp=kp, element=element)
    be = get_backend("cupy")
    try:
        stats, c, ref, p = _run(300, 250, 700, dtype, trans_a=ta, trans_b=tb, beta=beta,
                                budget=300_000 if dtype == F32 else 600_000, faults=faults,
                                backend=be)
    finally:
        be.close()
    _check_detected(stats, c, ref, faults, check, dtype, 700)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k, dtype, ta, tb, alpha, beta, budget, data", CLEAN)
@pytest.mark.parametrize("kernel", ["bigmm", "cublas"])
def test_gpu_no_false_positives(m, n, k, dtype, ta, tb, alpha, beta, budget, data, kernel):
    be = get_backend("cupy", kernel=kernel)
    try:
        stats, c, ref, p = _run(m, n, k, dtype, trans_a=ta, trans_b=tb, alpha=alpha,
                                beta=beta, budget=budget, data=data, backend=be)
    finally:
        be.close()
    assert stats.tiles_checked == p.n_tiles and stats.checksum_mismatches == 0
    assert relative_error(c, ref) < tolerance(dtype, k)


TF32_RUNS = [
    # (kernel, precision): tensor-core products, whose inputs are rounded (the bound adds
    # that rounding per product: bigmm.precision.ROUNDING)
    ("cublas-tf32", None),  # cuBLAS's TF32 mode, as kernel="cublas-tf32" has always meant
    ("cublas", "tf32"),  # the same, by precision
    ("bigmm", "tf32"),  # bigmm's TF32 kernels: the checks in passes of their own
    ("bigmm", "tf32x3"),  # bigmm's 3xTF32 kernels: float32's bound with three terms
]


def _tf32_backend(kernel, precision):
    return get_backend("cupy", kernel=kernel, **({"precision": precision} if precision else {}))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, precision", TF32_RUNS)
@pytest.mark.parametrize("data", ["normal", "positive"])
def test_gpu_tf32_no_false_positives(kernel, precision, data):
    be = _tf32_backend(kernel, precision)
    try:
        assert not be.fuses_checks
        stats, c, ref, p = _run(611, 701, 1023, F32, budget=500_000, data=data, backend=be)
    finally:
        be.close()
    assert stats.tiles_checked == p.n_tiles and stats.checksum_mismatches == 0
    assert relative_error(c, ref) < (tolerance(F32, 1023) if precision == "tf32x3" else 2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, precision", TF32_RUNS[1:])
@pytest.mark.parametrize("where, tile, kp, element, check, dtype, ta, tb, beta",
                         [f for f in FAULTS if f[5] == F32])
def test_gpu_tf32_fault_detected_and_tile_recomputed(kernel, precision, where, tile, kp,
                                                     element, check, dtype, ta, tb, beta):
    faults = Faults(where, tile=tile, kp=kp, element=element)
    be = _tf32_backend(kernel, precision)
    try:
        stats, c, ref, p = _run(300, 250, 700, dtype, trans_a=ta, trans_b=tb, beta=beta,
                                budget=300_000, faults=faults, backend=be)
    finally:
        be.close()
    assert len(faults.fired) == 1, faults.fired
    assert stats.checksum_mismatches >= 1 and stats.tiles_recomputed == stats.checksum_mismatches
    assert stats.mismatches[0].tile == tuple(faults.tile)
    assert relative_error(c, ref) < (tolerance(F32, 700) if precision == "tf32x3" else 2e-3)


# ----- which checksum kernel a view gets (no GPU needed) ------------------------------------

SUMS_PATHS = [
    # (rows, cols, sr, sc, itemsize, address, kernel)
    # the row check: op(A).T of a row-major A panel, summed along its contiguous rows
    (4096, 16384, 1, 4096, 4, 0, "contig"),
    # the A panel's column sums: columns contiguous, rows 16 KiB apart
    (16384, 4096, 4096, 1, 4, 256, "strided"),
    # the B panel (4096 x 768) both ways, float64
    (768, 4096, 1, 768, 8, 512, "contig"),
    (4096, 768, 768, 1, 8, 512, "strided"),
    # a leading dimension that is not a multiple of 16 bytes: the fallback
    (300, 257, 1, 257, 4, 0, "generic"),
    (257, 300, 257, 1, 4, 0, "generic"),
    # a view starting 4 bytes into an aligned buffer
    (300, 256, 256, 1, 4, 4, "generic"),
    # one column (both strides 1) and one row: any leading dimension
    (70000, 1, 1, 1, 4, 0, "contig"),
    (1, 70000, 70001, 1, 8, 16, "strided"),
    # neither stride 1
    (200, 100, 800, 4, 4, 0, "generic"),
]


@pytest.mark.parametrize("rows, cols, sr, sc, itemsize, ptr, kernel", SUMS_PATHS)
def test_checksum_kernel_choice(rows, cols, sr, sc, itemsize, ptr, kernel):
    from bigmm.backends.cuda_checksums import sums_path

    assert sums_path(rows, cols, sr, sc, itemsize, ptr) == kernel


def test_numpy_launchers_read_their_views_at_each_launch():
    from bigmm.backends.numpy import NumpyBackend

    be, rng = NumpyBackend(), np.random.default_rng(3)
    x = rng.standard_normal((50, 7)).astype(np.float32)
    out = np.zeros(7)
    launch = be.sums_launcher(x, out, accumulate=True)
    launch(None)
    first = out.copy()
    x *= 2  # the panel changes in place, as a slot's does between steps
    launch(None)
    np.testing.assert_allclose(out, 3 * first, rtol=1e-12)
