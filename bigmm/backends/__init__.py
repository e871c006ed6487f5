"""Compute backends: one registry selected by name; ``auto`` picks cupy where a GPU is usable."""

from __future__ import annotations


def probe_cuda() -> bool:
    """True when cupy imports and a CUDA device answers (cupy imported lazily, here only)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False
