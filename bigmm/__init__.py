"""bigmm: out-of-core matrix multiplication of HDF5 matrices larger than GPU memory."""

from __future__ import annotations

__version__ = "0.1.0"

from . import errors  # noqa: E402
from .api import matmul, plan  # noqa: E402

__all__ = ["__version__", "errors", "matmul", "plan"]
