"""Shared by the tests of bigmm.dask: the workers' memory limit, operands stored transposed,
HDF5 datasets written and read back."""

from __future__ import annotations

import h5py

from bigmm.io.spec import parse_spec


WORKER_MEMORY = "1GiB"


def _stored(shape, trans):
    return shape[::-1] if trans else shape


def _h5(path, name, array, layout="contiguous"):
    kw = {"contiguous": {}, "chunked": {"chunks": (13, 17)},
          "compressed": {"chunks": (16, 16), "compression": "gzip"}}[layout]
    with h5py.File(path, "a") as f:
        f.create_dataset(name, data=array, **kw)
    return f"{path}:/{name}"


def _read(spec):
    s = parse_spec(spec)
    with h5py.File(s.path, "r") as f:
        d = f[s.dataset]
        return d[...], dict(d.attrs)
