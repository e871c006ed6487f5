"""Where an output is stored, as the run's checks and its predicted time look at it: specs,
HDF5 datasets and Zarr arrays name their storage; arrays and None have none."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import zarr

from bigmm.errors import SpecError
from bigmm.io import output_spec


def test_an_output_spec_of_every_kind(tmp_path):
    assert output_spec(None) == (None, "C (NumPy array)")
    assert output_spec(np.zeros((2, 2))) == (None, "C (NumPy array)")
    spec, label = output_spec(f"{tmp_path}/c.h5:/C")  # not made yet
    assert (spec.path, spec.dataset, label) == (f"{tmp_path}/c.h5", "/C",
                                                f"C ({tmp_path}/c.h5:/C)")
    with h5py.File(tmp_path / "d.h5", "w") as f:
        spec, _ = output_spec(f.create_dataset("g/D", (3, 4), "f4"))
        assert (spec.path, spec.dataset) == (os.path.realpath(tmp_path / "d.h5"), "/g/D")
    z = zarr.create_array(str(tmp_path / "z.zarr"), shape=(3, 4), chunks=(2, 2), dtype="f4")
    spec, _ = output_spec(z)
    assert spec.zarr and os.path.realpath(spec.path) == os.path.realpath(tmp_path / "z.zarr")


def test_an_output_of_another_kind_is_refused():
    with pytest.raises(SpecError, match="Expected 'file.h5:/dataset'.*Got list"):
        output_spec([[1.0]])
