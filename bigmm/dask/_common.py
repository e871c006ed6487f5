"""What the array and file halves share: lazy dask imports, the per-process backend cache."""

from __future__ import annotations

import functools
import importlib

from ..backends import get_backend
from ..errors import BackendUnavailable

#: Worker resource that stands for "one bigmm task at a time" (one GPU per worker).
RESOURCE = "bigmm"


def _require(module: str):
    """The imported module, or BackendUnavailable naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise BackendUnavailable(f"Expected {module} to import (pip install 'bigmm[dask]'). "
                                 f"Got {type(e).__name__}: {e}.") from e


def dask_array():
    return _require("dask.array")


def distributed():
    return _require("distributed")


@functools.lru_cache(maxsize=None)
def backend(name: str, precision: str | None = None):
    """One backend per process, name and precision (tasks share it; buffers are per call)."""
    if precision is None:
        return get_backend(name)
    from ..job import resolve_backend

    return resolve_backend(name, None, precision)
