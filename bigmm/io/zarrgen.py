"""``generate`` for a Zarr spec: the seeded matrix of :mod:`.generate`, as a Zarr v3 array
written through zarr-python in row blocks of whole chunk rows (the same values as the HDF5
dataset of the same seed, whatever the chunks or codec)."""

from __future__ import annotations

import os

import numpy as np

from ..errors import OutputExistsError, OutputNotWritable
from ._h5 import COMPLETE_ATTR
from .spec import Spec
from .zarrsink import check, remove_tree
from .zarrmeta import node_type
from .zarrsource import array_dir, zarr_module


def _compressors(codec: str | None):
    if codec is None:
        return None
    codecs = zarr_module().codecs
    return [{"zstd": lambda: codecs.ZstdCodec(level=3),
             "blosc": lambda: codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
             "gzip": lambda: codecs.GzipCodec(level=1)}[codec]()]


def generate_zarr(spec: Spec, shape: tuple[int, int], dtype: str, lay, seed: int,
                  overwrite: bool, block_elements: int, draw) -> str:
    """Write the matrix to the Zarr array ``spec`` (see :func:`.generate.generate`), its
    elements [e0, e1) in row-major order drawn by ``draw(seed, e0, e1)``."""
    zarr = zarr_module()
    store, path = spec.path, spec.dataset.strip("/")
    parent = os.path.dirname(os.path.abspath(store))
    if not os.path.isdir(parent):
        raise OutputNotWritable(f"Expected an existing directory for {store}. Got none at "
                                f"{parent}.")
    check(spec)  # the places an output may not go: a file, inside an array, a group, ...
    folder = array_dir(store, path)
    if node_type(folder) == "array":
        if not overwrite:
            raise OutputExistsError(f"Expected {spec} not to exist (pass overwrite=True to "
                                    f"replace it). Got an existing array.")
        remove_tree(folder)
    m, n = shape
    try:
        arr = zarr.create_array(store=zarr.storage.LocalStore(store), name=path or None,
                                shape=(m, n), chunks=lay.chunks, dtype=np.dtype(dtype),
                                compressors=_compressors(lay.codec), filters=None,
                                fill_value=0.0, attributes={COMPLETE_ATTR: False},
                                zarr_format=3)
    except OSError as exc:
        raise OutputNotWritable(f"Expected a writable Zarr store at {store}. Got: "
                                f"{exc.strerror or exc}.") from None
    try:
        cr = lay.chunks[0]
        rows = max(cr, max(1, block_elements // n) // cr * cr)
        for r0 in range(0, m, rows):
            r1 = min(m, r0 + rows)
            arr[r0:r1, :] = draw(seed, r0 * n, r1 * n).reshape(r1 - r0, n).astype(dtype)
    except BaseException:
        remove_tree(folder)
        raise
    arr.update_attributes({"bigmm_seed": seed, COMPLETE_ATTR: True})
    return str(spec)
