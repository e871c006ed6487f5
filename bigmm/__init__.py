"""bigmm: out-of-core matrix multiplication of HDF5 matrices larger than GPU memory.

``bigmm.matmul``, ``bigmm.gram``, ``bigmm.plan`` and ``bigmm.page_locked`` are the API
(:mod:`bigmm.api`); the submodules (``bigmm.verify``, ``bigmm.io``, ``bigmm.dask``,
``bigmm.errors``, ...) are imported on first use, so that ``import bigmm`` (and the ``bigmm``
command's start) costs next to nothing.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: Functions of the API, from the module that defines them.
_API = {"matmul": "api", "gram": "api", "plan": "api", "page_locked": "api"}
#: Submodules reachable as attributes of the package.
_SUBMODULES = ("api", "backends", "calibration", "checksum", "cli", "dask", "errors", "executor",
               "io", "job", "planner", "profile", "runstats", "testing", "units", "verify")

__all__ = ["__version__", "matmul", "gram", "plan", "page_locked", *_SUBMODULES]


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'bigmm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
