"""Fixtures shared by the tests of outputs: ``inputs``, the HDF5 operands of the HDF5 output
tests (sink_cases.py)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from bigmm.io import open_input
from bigmm.testing import random_matrix
from sink_cases import SHAPE, sha


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

