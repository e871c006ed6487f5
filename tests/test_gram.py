"""Gram products, C = alpha * A^T A + beta * C and alpha * A A^T + beta * C (``bigmm.gram``,
``matmul`` of one operand's data with opposite transposes, ``bigmm gram``): against float64
references on fresh random data, outputs poisoned with NaN, every shape kind, HDF5 and Zarr
inputs and outputs, resume, a SIGKILL mid-run, and the GPU path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

import bigmm
from bigmm.errors import OptionError, PlanError, ResumeError
from bigmm.io.generate import generate
from bigmm.testing import (random_matrix, reference_gemm, relative_error, tolerance,
                           wait_for_journaled_tiles)

SHAPES = [
    (1, 1),  # one element: C is 1 x 1
    (1, 7),  # one row: A^T A is 7 x 7 of rank 1, A A^T is 1 x 1
    (2003, 37),  # tall-skinny: C = A^T A small, one tile, A streamed once
    (37, 2003),  # short-wide: A A^T small, A^T A large and tiled
    (301, 299),  # ragged: neither edge a multiple of the tiles
]
MEMORY = "600KiB"  # several tiles of C for the larger shapes


def _ref(a, trans, alpha=1.0, beta=0.0, c0=None):
    return reference_gemm(a, a, alpha=alpha, beta=beta, c=c0, trans_a=trans, trans_b=not trans)


def _nan_c(a, trans, dtype):
    n = a.shape[1] if trans else a.shape[0]
    return np.full((n, n), np.nan, dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("trans", [True, False])  # A^T A, and A A^T
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gram_arrays_match_float64(shape, trans, dtype):
    a = random_matrix(shape, dtype, seed=sum(shape))
    c = _nan_c(a, trans, dtype)
    out, st = bigmm.gram(a, c, trans=trans, memory=MEMORY, backend="numpy", stats=True)
    assert out is c
    ref = _ref(a, trans)
    assert relative_error(c, ref) <= tolerance(dtype, shape[0] if trans else shape[1])
    assert np.array_equal(c, c.T)  # mirrored bit for bit
    p = bigmm.plan(a, a, trans_a=trans, trans_b=not trans, memory=MEMORY, backend="numpy")
    n = c.shape[0]
    assert p.symmetric and p.flops == n * (n + 1) * (shape[0] if trans else shape[1])
    assert st.flops == p.flops and st.tiles_done == p.n_tiles == p.ni * (p.ni + 1) // 2


@pytest.mark.parametrize("trans", [True, False])  # A^T A, and A A^T
def test_upper_writes_zeros_below(trans):
    a = random_matrix((257, 263), np.float64, seed=5)
    c = _nan_c(a, trans, np.float64)
    bigmm.gram(a, c, trans=trans, upper=True, memory=MEMORY, backend="numpy")
    ref = _ref(a, trans)
    assert relative_error(np.triu(c), np.triu(ref)) <= tolerance(np.float64, 263)
    assert np.all(np.tril(c, -1) == 0)


def test_beta_reads_the_upper_tiles_of_old_c():
    # old C symmetric: C = 0.5 A^T A - 1.5 C0
    a = random_matrix((400, 211), np.float64, seed=11)
    s = random_matrix((211, 211), np.float64, seed=12)
    c0 = s + s.T
    c = c0.copy()
    bigmm.gram(a, c, alpha=0.5, beta=-1.5, memory=MEMORY, backend="numpy")
    assert relative_error(c, _ref(a, True, 0.5, -1.5, c0)) <= tolerance(np.float64, 400)


@pytest.mark.parametrize("fmt", ["array", "h5", "zarr"])  # C in memory, HDF5, Zarr
def test_old_c_not_symmetric(tmp_path, fmt):
    # beta != 0 with an old C that is not symmetric: matmul keeps the general path (right C);
    # gram refuses it before writing anything; upper=True updates the upper triangle
    a = random_matrix((300, 211), np.float64, seed=13)
    c0 = random_matrix((211, 211), np.float64, seed=14)

    def out():
        if fmt == "array":
            return c0.copy()
        if fmt == "zarr":
            zarr = pytest.importorskip("zarr")
            zarr.create_array(tmp_path / "c.zarr", data=c0, chunks=(100, 77), overwrite=True)
            return f"{tmp_path}/c.zarr"
        with h5py.File(tmp_path / "c.h5", "w") as f:
            f["C"] = c0
        return f"{tmp_path}/c.h5:/C"

    def got(c):
        if fmt == "array":
            return c
        if fmt == "zarr":
            return _read(c)
        with h5py.File(tmp_path / "c.h5", "r") as f:
            return f["C"][...]

    ref = _ref(a, True, 0.5, -1.5, c0)
    assert not bigmm.plan(a, a, out(), trans_a=True, beta=-1.5, memory=MEMORY,
                          backend="numpy").symmetric
    c = out()
    bigmm.matmul(a, a, c, trans_a=True, alpha=0.5, beta=-1.5, memory=MEMORY, backend="numpy")
    assert relative_error(got(c), ref) <= tolerance(np.float64, 300)
    c = out()
    with pytest.raises(OptionError, match=r"symmetric old C.*C\[\d+, \d+\] = .* upper=True"):
        bigmm.gram(a, c, alpha=0.5, beta=-1.5, memory=MEMORY, backend="numpy")
    assert np.array_equal(got(c), c0)  # nothing written
    bigmm.gram(a, c, alpha=0.5, beta=-1.5, upper=True, memory=MEMORY, backend="numpy")
    assert relative_error(np.triu(got(c)), np.triu(ref)) <= tolerance(np.float64, 300)
    assert np.all(np.tril(got(c), -1) == 0)


@pytest.mark.parametrize("budget, dtype", [
    (1 << 20, np.float32),   # a 1 MiB host budget: blocks of 256 (1024 would hold 12 MiB)
    (3 << 20, np.float64),   # 3 MiB, float64: blocks of 384
])
def test_old_c_symmetry_check_holds_its_blocks_within_the_host_budget(budget, dtype):
    import tracemalloc

    from bigmm.job import check_symmetric_c

    n = 1500  # blocks of any edge leave a ragged last row and column
    x = random_matrix((n, n), dtype, seed=21)
    c = x + x.T
    check_symmetric_c(c, n, budget)  # the modules it imports on first use, loaded
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        check_symmetric_c(c, n, budget)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak <= budget
    c[1400, 3] += 1  # far from the first block: still found
    with pytest.raises(OptionError, match=r"C\[3, 1400\]|C\[1400, 3\]"):
        check_symmetric_c(c, n, budget)


@pytest.mark.parametrize("fmt", ["h5", "zarr"])  # HDF5 and Zarr outputs
def test_old_c_not_symmetric_with_resume_and_no_journal(tmp_path, fmt):
    # resume=True with nothing to resume starts the run: its old C is checked as without
    if fmt == "zarr":
        zarr = pytest.importorskip("zarr")
    a = random_matrix((120, 90), np.float64, seed=17)
    c0 = random_matrix((90, 90), np.float64, seed=18)
    if fmt == "zarr":
        zarr.create_array(tmp_path / "c.zarr", data=c0, chunks=(40, 40))
        spec = f"{tmp_path}/c.zarr"
    else:
        with h5py.File(tmp_path / "c.h5", "w") as f:
            f["C"] = c0
        spec = f"{tmp_path}/c.h5:/C"
    with pytest.raises(OptionError, match=r"symmetric old C"):
        bigmm.gram(a, spec, beta=1.0, resume=True, memory=MEMORY, backend="numpy")
    assert np.array_equal(_read(spec), c0)  # nothing written


def test_old_c_symmetric_with_nans_is_accepted():
    # one element differing from its mirror in the last bit is refused; mirrored NaNs are not
    a = random_matrix((120, 90), np.float64, seed=15)
    s = random_matrix((90, 90), np.float64, seed=16)
    c0 = s + s.T
    c0[3, 70] = c0[70, 3] = np.nan
    c = c0.copy()
    c[80, 2] = np.nextafter(c[80, 2], np.inf)
    with pytest.raises(OptionError, match=r"C\[2, 80\]"):
        bigmm.gram(a, c, beta=1.0, memory=MEMORY, backend="numpy")
    c = c0.copy()
    bigmm.gram(a, c, beta=1.0, memory=MEMORY, backend="numpy")
    ref = _ref(a, True, 1.0, 1.0, c0)
    assert np.isnan(c[3, 70]) and np.isnan(c[70, 3])
    c[3, 70] = c[70, 3] = ref[3, 70] = ref[70, 3] = 0
    assert relative_error(c, ref) <= tolerance(np.float64, 120)


def test_matmul_detects_the_same_data_with_opposite_transposes(tmp_path):
    a = random_matrix((500, 130), np.float32, seed=2)
    # same array object, a file operand spelt two ways, and same transposes (general path)
    p = bigmm.plan(a, a, trans_a=True, memory=MEMORY, backend="numpy")
    assert p.symmetric
    assert not bigmm.plan(a, a.copy(), trans_a=True, memory=MEMORY, backend="numpy").symmetric
    assert not bigmm.plan(a, a, trans_a=True, gram=False, memory=MEMORY,
                          backend="numpy").symmetric
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["A"] = a
    os.symlink(tmp_path / "a.h5", tmp_path / "link.h5")
    p = bigmm.plan(f"{tmp_path}/a.h5:/A", f"{tmp_path}/link.h5:/A", trans_b=True,
                   memory=MEMORY, backend="numpy")
    assert p.symmetric and (p.m, p.n) == (500, 500)
    sq = random_matrix((64, 64), np.float32, seed=3)
    assert not bigmm.plan(sq, sq, memory=MEMORY, backend="numpy").symmetric
    c = bigmm.matmul(a, a, trans_b=True, memory=MEMORY, backend="numpy")
    assert relative_error(c, _ref(a, False)) <= tolerance(np.float32, 130)


def test_gram_refusals():
    a = random_matrix((50, 40), np.float32, seed=4)
    with pytest.raises(OptionError, match="opposite transposes"):
        bigmm.matmul(a, a.copy(), trans_a=True, gram=True, backend="numpy")
    with pytest.raises(OptionError, match="verify=None"):
        bigmm.matmul(a, a, trans_a=True, gram=True, verify="checksum", backend="numpy")
    # verify asked for: detection keeps the checked general path
    assert not bigmm.plan(a, a, trans_a=True, verify="checksum", backend="numpy").symmetric
    with pytest.raises(PlanError, match="square tiles"):
        bigmm.planner.make_plan(40, 40, 50, trans_a=True, device_budget=1 << 20,
                                symmetric=True, tile=(16, 32, 16))


@pytest.mark.parametrize("fmt", ["h5", "zarr"])  # HDF5 input and output; Zarr both
@pytest.mark.parametrize("trans", [True, False])  # A^T A, and A A^T
def test_gram_files(tmp_path, fmt, trans):
    if fmt == "zarr":
        pytest.importorskip("zarr")
    a_spec = f"{tmp_path}/a.h5:/A" if fmt == "h5" else f"{tmp_path}/a.zarr"
    c_spec = f"{tmp_path}/c.h5:/C" if fmt == "h5" else f"{tmp_path}/c.zarr"
    generate(a_spec, (613, 389), dtype="float64", seed=21)
    a = _read(a_spec)
    bigmm.gram(a_spec, c_spec, trans=trans, memory=MEMORY, backend="numpy")
    c = _read(c_spec)
    assert relative_error(c, _ref(a, trans)) <= tolerance(np.float64, a.shape[0])
    assert np.array_equal(c, c.T)
    # resumed after it finished: nothing to do
    _, st = bigmm.gram(a_spec, c_spec, trans=trans, memory=MEMORY, backend="numpy",
                       resume=True, stats=True)
    assert st.tiles_done == 0
    # the general product's resume finds the same C complete; the upper triangle's is not
    _, st = bigmm.matmul(a_spec, a_spec, c_spec, trans_a=trans, trans_b=not trans,
                         gram=False, memory=MEMORY, backend="numpy", resume=True, stats=True)
    assert st.tiles_done == 0
    with pytest.raises(ResumeError, match="upper"):
        bigmm.gram(a_spec, c_spec, trans=trans, upper=True, memory=MEMORY, backend="numpy",
                   resume=True)


def _read(spec: str) -> np.ndarray:
    if ".zarr" in spec:
        import zarr

        return np.asarray(zarr.open_array(spec.split(":")[0], mode="r")[...])
    path, name = spec.split(":")
    with h5py.File(path, "r") as f:
        return f[name][...]


#: ``bigmm gram`` with a pause after each tile write, so that a SIGKILL lands among the tiles.
CLI = textwrap.dedent("""
    import sys, time
    from bigmm.cli import main
    from bigmm.io import filesink, zarrsink
    pause = float(sys.argv[1])
    for sink in (filesink.FileSink, zarrsink.ZarrSink):
        write = sink.write
        def slow(self, *args, _write=write, **kwargs):
            _write(self, *args, **kwargs)
            time.sleep(pause)
        sink.write = slow
    sys.exit(main(sys.argv[2:]))
""")


@pytest.mark.parametrize("fmt", ["h5", "zarr"])  # HDF5 files; Zarr stores
def test_gram_killed_and_resumed(tmp_path, fmt):
    if fmt == "zarr":
        pytest.importorskip("zarr")
    a_spec = f"{tmp_path}/a.h5:/A" if fmt == "h5" else f"{tmp_path}/a.zarr"
    out = "c.h5" if fmt == "h5" else "c.zarr"
    generate(a_spec, (900, 700), dtype="float64", seed=8)
    args = ["gram", a_spec, "-o", f"{tmp_path}/{out}" + (":/C" if fmt == "h5" else ""),
            "--memory", "1MiB", "--backend", "numpy", "-q"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", CLI, "0.05", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_journaled_tiles(tmp_path, proc, 120.0, out)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    # the general product may not resume a Gram run's tiles
    with pytest.raises(ResumeError, match="symmetric"):
        bigmm.matmul(a_spec, a_spec, args[3], trans_a=True, gram=False, memory="1MiB",
                     backend="numpy", resume=True)
    # `multiply A A --trans-a` is the same Gram product (detected): it resumes the run
    general = ["multiply", a_spec, a_spec, *args[2:-1], "--trans-a", "--resume", "--json"]
    done = subprocess.run([sys.executable, "-c", CLI, "0", *general], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["tiles_skipped"] > 0
    assert summary["tiles_done"] + summary["tiles_skipped"] == summary["tiles_total"]
    c = _read(f"{tmp_path}/{out}" + (":/C" if fmt == "h5" else ""))
    # bit for bit the product of an uninterrupted run of the same command
    again = f"{tmp_path}/whole.h5:/C" if fmt == "h5" else f"{tmp_path}/whole.zarr"
    whole = subprocess.run([sys.executable, "-c", CLI, "0", *args[:3], again, *args[4:]],
                           env=env, capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr
    assert np.array_equal(c, _read(again))
    assert relative_error(c, _ref(_read(a_spec), True)) <= tolerance(np.float64, 900)


def test_cli_plan_and_verify(tmp_path, capsys):
    from bigmm.cli import main

    generate(f"{tmp_path}/a.h5:/A", (700, 90), dtype="float32", seed=1)
    assert main(["gram", f"{tmp_path}/a.h5:/A", "-o", f"{tmp_path}/c.h5:/C", "--plan",
                 "--backend", "numpy"]) == 0
    printed = capsys.readouterr().out
    assert "Gram (symmetric)" in printed and "the upper triangle" in printed
    assert not os.path.exists(tmp_path / "c.h5")
    assert main(["gram", f"{tmp_path}/a.h5:/A", "-o", f"{tmp_path}/c.h5:/C", "--aat",
                 "--backend", "numpy", "--memory", "1MiB", "-q"]) == 0
    assert main(["verify", f"{tmp_path}/a.h5:/A", f"{tmp_path}/a.h5:/A",
                 f"{tmp_path}/c.h5:/C", "--trans-b"]) == 0
    # the arithmetic asked of the tiles off the diagonal: printed, and refused with float64
    assert main(["gram", f"{tmp_path}/a.h5:/A", "-o", f"{tmp_path}/d.h5:/C", "--plan",
                 "--backend", "numpy", "--precision", "tf32x3"]) == 0
    assert "tf32x3 asked" in capsys.readouterr().out
    generate(f"{tmp_path}/a.h5:/A64", (300, 40), dtype="float64", seed=2)
    assert main(["gram", f"{tmp_path}/a.h5:/A64", "-o", f"{tmp_path}/d.h5:/C", "--backend",
                 "numpy", "--precision", "tf32"]) == 2
    assert "precision" in capsys.readouterr().err


# ----- the GPU path ---------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("shape,trans,dtype,memory,mode", [
    ((20011, 515), True, np.float32, "64MiB", "cublas"),  # tall-skinny, one tile: A once
    ((20011, 515), True, np.float32, "64MiB", "blocks"),  # diagonal by sub-block gemms
    ((20011, 1031), True, np.float32, "64MiB", "split"),  # 2 x 2: syrk, gemm above
    ((515, 20011), False, np.float64, "64MiB", "cublas"),  # A A^T, float64
    ((3001, 1999), True, np.float32, "24MiB", "cublas"),  # several tiles, mirrored
    ((3001, 1999), False, np.float32, "24MiB", "cublas"),  # A A^T, several tiles
    ((4000, 700), True, np.float16, "64MiB", "cublas"),  # half precision: blocks always
    ((20011, 1031), True, np.float32, "64MiB", "triangle"),  # bigmm's kernel, upper tiles
    ((1031, 20011), False, np.float64, "64MiB", "triangle"),  # A A^T, float64
    ((3001, 1999), True, np.float32, "24MiB", "triangle"),  # several tiles, mirrored
    ((4000, 700), True, np.float16, "64MiB", "triangle"),  # half precision: blocks always
    ((20011, 1031), True, np.float32, "64MiB", None),  # the backend's default mode
])
def test_gram_gpu(shape, trans, dtype, memory, mode, monkeypatch):
    from bigmm.backends import cupy as cupy_backend

    monkeypatch.setattr(cupy_backend.CupyBackend, "syrk_mode", mode)
    a = random_matrix(shape, np.float32, seed=shape[0]).astype(dtype)
    c = _nan_c(a, trans, np.float32 if dtype == np.float16 else dtype)
    out, st = bigmm.gram(a, c, trans=trans, memory=memory, backend="cupy", stats=True)
    ref = _ref(a, trans)
    assert relative_error(c, ref) <= tolerance(dtype, shape[0] if trans else shape[1])
    assert np.array_equal(c, c.T)
    p = bigmm.plan(a, a, trans_a=trans, trans_b=not trans, memory=memory, backend="cupy")
    assert p.symmetric and st.tiles_done == p.n_tiles
    if p.ni == 1:  # one tile: A streamed once, no B panel
        assert p.b_slots == 0 and st.bytes_read == a.nbytes


@pytest.mark.gpu
def test_gram_gpu_file_with_beta(tmp_path):
    generate(f"{tmp_path}/a.h5:/A", (5000, 1200), dtype="float32", seed=4)
    a = _read(f"{tmp_path}/a.h5:/A")
    s = random_matrix((1200, 1200), np.float32, seed=5)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["C"] = s + s.T
    bigmm.gram(f"{tmp_path}/a.h5:/A", f"{tmp_path}/c.h5:/C", alpha=2.0, beta=0.5,
               memory="16MiB", backend="cupy")
    c = _read(f"{tmp_path}/c.h5:/C")
    assert relative_error(c, _ref(a, True, 2.0, 0.5, s + s.T)) <= tolerance(np.float32, 5000)
