"""Compute backends: one registry selected by name; ``auto`` picks cupy where a GPU is usable.

:class:`Backend` is the core protocol; :class:`Checksums`, :class:`Calibrates`,
:class:`Describes`, :class:`Profiles`, :class:`HostHints`, :class:`Registers`,
:class:`SplitsPanels`, :class:`Syrk`, :class:`DeviceBlocks` and :class:`TimesShapes` are
optional abilities, tested for with ``isinstance``.
"""

from __future__ import annotations

import importlib
import importlib.util

from ..errors import BackendUnavailable
from .base import (Backend, Calibrates, Checksums, Describes, DeviceBlocks, HostHints,
                   Profiles, Registers, SplitsPanels, Syrk, TimesShapes)

__all__ = ["BACKENDS", "Backend", "Calibrates", "Checksums", "Describes", "DeviceBlocks",
           "HostHints", "Profiles", "Registers", "SplitsPanels", "Syrk", "TimesShapes",
           "get_backend", "probe_cuda"]

#: Names ``get_backend`` accepts.
BACKENDS = ("auto", "numpy", "cupy")


def probe_cuda() -> bool:
    """True when cupy imports and a CUDA device answers (cupy imported lazily, here only)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _has_cupy_backend() -> bool:
    return importlib.util.find_spec(f"{__name__}.cupy") is not None


def get_backend(name: str = "auto", **options) -> Backend:
    """A new backend by name: "numpy", "cupy", or "auto" (cupy where a GPU is usable)."""
    if not isinstance(name, str) or name.lower() not in BACKENDS:
        raise BackendUnavailable(
            f"Expected backend to be one of {', '.join(BACKENDS)}. Got {name!r}.")
    name = name.lower()
    if name == "auto":
        name = "cupy" if _has_cupy_backend() and probe_cuda() else "numpy"
    if name == "numpy":
        from .numpy import NumpyBackend

        return NumpyBackend(**options)
    return _cupy_backend(**options)


def _cupy_backend(**options) -> Backend:
    if not _has_cupy_backend():
        raise BackendUnavailable(
            "Expected the cupy backend to be installed with this version of bigmm. Got a build "
            "without it; use backend='numpy'.")
    try:
        module = importlib.import_module(f"{__name__}.cupy")
    except ImportError as e:
        raise BackendUnavailable(
            f"Expected cupy to import (pip install 'bigmm[cuda12]' or 'bigmm[cuda13]'). "
            f"Got {type(e).__name__}: {e}.") from e
    if not probe_cuda():
        raise BackendUnavailable(
            "Expected a usable CUDA GPU for backend 'cupy'. Got none (no device or no driver); "
            "use backend='numpy'.")
    return module.CupyBackend(**options)
