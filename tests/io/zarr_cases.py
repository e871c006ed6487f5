"""Shared by the tests of Zarr outputs (zarrsink, zarrfiles): the job's shape and budget, an
array read back, the temporary files left behind. The ``ab`` fixture (A and B in one store) is
in conftest.py. Nothing here needs zarr to import."""

from __future__ import annotations

import os

from bigmm.io.spec import parse_spec


M, K, N = 130, 120, 110  # multiples of nothing
BUDGET = 60000  # 9 tiles of 44 x 37 in 5 K panels (NumPy backend)
KW = dict(memory=BUDGET, backend="numpy")


def _read(spec):
    import zarr

    s = parse_spec(spec)
    arr = zarr.open_array(s.path, path=s.dataset.strip("/"), mode="r")
    return arr[...], arr.attrs.asdict(), arr


def _leftovers(folder):
    return [os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs
            if f.endswith(".bigmm-tmp") or f.endswith(".partial")]
