"""bigmm: out-of-core matrix multiplication of HDF5 matrices larger than GPU memory."""

from __future__ import annotations

__version__ = "0.1.0"
