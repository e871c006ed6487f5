"""Fixtures shared by the tests of outputs: ``inputs``, the HDF5 operands of the HDF5 output
tests (sink_cases.py), and ``ab``, the Zarr operands of the Zarr output tests (zarr_cases.py)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from bigmm.io import open_input
from bigmm.testing import random_matrix, zarr_array
from sink_cases import SHAPE, sha
from zarr_cases import K, M, N


@pytest.fixture
def inputs(tmp_path):
    path = str(tmp_path / "ab.h5")
    with h5py.File(path, "w") as f:
        f["A"] = random_matrix(SHAPE, np.float32, seed=1)
        f["B"] = random_matrix(SHAPE, np.float32, seed=2)
    srcs = [open_input(f"{path}:/A", name="A"), open_input(f"{path}:/B", name="B")]
    before = sha(path)
    yield path, srcs
    for s in srcs:
        s.close()
    assert sha(path) == before  # inputs are never modified


@pytest.fixture
def ab(tmp_path):
    a = random_matrix((M, K), np.float64, seed=1)
    b = random_matrix((K, N), np.float64, seed=2)
    zarr_array(tmp_path / "in.zarr", a, path="A", chunks=(40, 50), codec="zstd")
    zarr_array(tmp_path / "in.zarr", b, path="B", chunks=(30, 37))
    return f"{tmp_path / 'in.zarr'}:/A", f"{tmp_path / 'in.zarr'}:/B", a, b
