"""What the array and file halves share: lazy dask imports, the per-process backend cache."""

from __future__ import annotations

import functools

from ..backends import get_backend
from ..errors import BackendUnavailable

#: Worker resource that stands for "one bigmm task at a time" (one GPU per worker).
RESOURCE = "bigmm"


def dask_array():
    try:
        import dask.array as da
    except ImportError as e:
        raise BackendUnavailable(f"Expected dask to import (pip install 'bigmm[dask]'). "
                                 f"Got {type(e).__name__}: {e}.") from e
    return da


def distributed():
    try:
        import distributed
    except ImportError as e:
        raise BackendUnavailable(f"Expected dask.distributed to import (pip install "
                                 f"'bigmm[dask]'). Got {type(e).__name__}: {e}.") from e
    return distributed


@functools.lru_cache(maxsize=None)
def backend(name: str):
    """One backend per process and name (tasks share it; buffers are per call)."""
    return get_backend(name)
