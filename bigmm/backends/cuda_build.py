"""Compiling and loading bigmm's CUDA kernels: the sources in the top-level ``kernels/`` folder
(``#include "common.cuh"`` inlined), compiled by NVRTC once per process and device with
``-ftz=false`` (float32 subnormals kept), binaries cached on disk beside cupy's (keyed by source,
options and NVRTC version), shared memory granted, and the device's SM count.

cupy is imported inside functions only: importing this module needs no GPU.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

from ..errors import KernelError
from .kernel_configs import _FAMILY_SOURCE

_HEADER = "common.cuh"
_COMPILE_OPTIONS = ("-std=c++17",)


def kernel_dir() -> Path:
    """The folder holding the CUDA sources: inside the installed package, else the source tree's."""
    import bigmm

    pkg = Path(bigmm.__file__).resolve().parent
    for candidate in (pkg / "kernels", pkg.parent / "kernels"):
        if (candidate / _FAMILY_SOURCE).is_file():
            return candidate
    raise KernelError(f"Expected the CUDA sources in {pkg / 'kernels'} or {pkg.parent / 'kernels'}. Got neither.")


def kernel_source(filename: str) -> str:
    """A kernel file's text with ``#include "common.cuh"`` inlined, so that cupy's disk cache
    (keyed by the source text) sees every change to the header."""
    folder = kernel_dir()
    try:
        text = (folder / filename).read_text()
        header = (folder / _HEADER).read_text()
    except OSError as exc:
        raise KernelError(f"Expected a readable kernel source {folder / filename}. Got {exc}.") from exc
    return text.replace(f'#include "{_HEADER}"', header)


_lock = threading.Lock()
_kernels: dict[tuple, object] = {}
_modules: dict[tuple, object] = {}
_smem_granted: dict[tuple, int] = {}


def device_id() -> int:
    import cupy

    return cupy.cuda.runtime.getDevice()


def _module(filename: str, options: tuple[str, ...]):
    key = (filename, options, device_id())
    module = _modules.get(key)
    if module is None:
        module = _nvrtc_module(kernel_source(filename), _COMPILE_OPTIONS + options)
        _modules[key] = module
    return module


def _nvrtc_module(source: str, options: tuple[str, ...]):
    """A module compiled by NVRTC directly with ``options`` and ``-ftz=false`` (cupy's
    RawModule appends ``-ftz=true`` to every compile, which flushes float32 subnormal inputs
    and results to zero where IEEE float32, and cuBLAS, keep them), for the current device
    unless ``options`` name an ``-arch``; the binary cached beside cupy's (keyed by source,
    options and NVRTC version)."""
    import hashlib
    import os

    import cupy
    from cupy.cuda import nvrtc

    opts = tuple(options)
    if not any(o.startswith("-arch=") for o in opts):
        opts += (f"-arch=sm_{cupy.cuda.Device().compute_capability}",)
    opts += ("-ftz=false",)
    key = hashlib.sha256("\0".join((source, *opts, str(nvrtc.getVersion()))).encode()).hexdigest()
    cache = Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")
    path = cache / f"bigmm_{key[:40]}.cubin"
    if not path.is_file():
        prog = nvrtc.createProgram(source, "bigmm_kernel.cu", (), ())
        try:
            try:
                nvrtc.compileProgram(prog, list(opts))
            except Exception as exc:
                raise KernelError(f"Expected NVRTC to compile with {opts}. Got {exc}: "
                                  f"{nvrtc.getProgramLog(prog)}") from exc
            cubin = nvrtc.getCUBIN(prog)
        finally:
            nvrtc.destroyProgram(prog)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        os.replace(tmp, path)
    return cupy.RawModule(path=str(path))


def raw_kernel(filename: str, entry: str, options: tuple[str, ...] = ()):
    """A compiled ``cupy.RawKernel`` for ``entry`` of ``kernels/filename`` on the current device
    (compiled once per process and device; binaries cached on disk by cupy)."""
    key = (filename, entry, options, device_id())
    kern = _kernels.get(key)
    if kern is not None:
        return kern
    with _lock:
        kern = _kernels.get(key)
        if kern is None:
            try:
                kern = _module(filename, options).get_function(entry)
                kern.kernel  # compile (or load from the disk cache) now, not at first launch
            except Exception as exc:  # cupy raises CompileException / CUDADriverError
                raise KernelError(f"Expected {filename}:{entry} with {options} to compile. Got {exc}.") from exc
            _kernels[key] = kern
    return kern


def grant_smem(kern, options: tuple, nbytes: int, what: str) -> None:
    """Let ``kern`` (compiled with ``options``) use ``nbytes`` of dynamic shared memory on the
    current device (once per kernel and device)."""
    key = (options, device_id())
    if _smem_granted.get(key) != nbytes:
        try:
            kern.max_dynamic_shared_size_bytes = nbytes
        except Exception as exc:
            raise KernelError(f"Expected the device to grant {nbytes} bytes of shared memory "
                              f"to {what}. Got {exc}.") from exc
        _smem_granted[key] = nbytes


@functools.lru_cache(maxsize=None)
def sm_count_of(device: int) -> int:
    """The number of SMs of ``device``."""
    import cupy

    return cupy.cuda.Device(device).attributes["MultiProcessorCount"]


def sm_count() -> int:
    return sm_count_of(device_id())
