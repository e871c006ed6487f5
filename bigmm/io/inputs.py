"""What every input shares: the :class:`Source` base class (regions read into a caller's
buffer, where its bytes lie, its identity), the reader threads a source runs and the size of
their tasks, and the message for an output left incomplete."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from ..errors import ReadError, ShapeError
from .base import Matrix
from .identity import Footprint
from .layout import DECODED_KINDS

#: Reader threads per source. Copies out of the page cache are bound by memory bandwidth, which
#: a few threads saturate; more only take cores from the compute. Measured on a 16-core VM (the
#: CPU engine's 12288^3 float32 job, inputs in the page cache): 16 threads per source ran the
#: job at 675-694 GFLOP/s with the reads in flight 60-64% of the run, 4 threads at 766-846 with
#: 44-49%, 2 threads at 822 with 36-38%.
DEFAULT_THREADS = 4
#: A region is split into one piece per reader thread, each at least this many bytes.
TASK_BYTES = 256 << 10

_caller = threading.local()


@contextmanager
def on_caller_thread() -> Iterator[None]:
    """Within it, a source's reads run their copies and decodes on the calling thread, not on
    the source's own reader threads: for a caller that splits a region between threads of its
    own (the executor's readers), whose pieces would otherwise each be split again and queued
    behind one another on the source's pool (see BENCHMARKS.md, reads of HDF5 panels)."""
    before = getattr(_caller, "inline", False)
    _caller.inline = True
    try:
        yield
    finally:
        _caller.inline = before


def caller_splits() -> bool:
    """True inside :func:`on_caller_thread` on this thread."""
    return getattr(_caller, "inline", False)


class Source(Matrix):
    """An input matrix as stored (before any transpose)."""

    chunks: tuple[int, int] | None = None
    mapped: bool = False
    #: Bytes one thread decoding a chunk of the source holds beside the region it reads: the
    #: decoded chunk and its stored bytes (:mod:`.decode`); 0 where it decodes nothing.
    decode_bytes: int = 0
    #: The most threads that decode its chunks at once, whatever the run allows (HDF5's own
    #: filters: one); None where the run chooses (:meth:`limit_decoders`).
    decode_threads: int | None = None

    def limit_decoders(self, n: int) -> None:
        """Decode at most ``n`` chunks at once, in buffers held to the source's close (the
        run's plan: ``Plan.decoding``); a source that decodes nothing ignores it."""

    def decode_chunk(self, ci: int, cj: int, stored: np.ndarray, data: np.ndarray) -> bool:
        """Read chunk (ci, cj) and decode it into all of ``data`` (uint8, a chunk's bytes),
        its stored bytes read into ``stored`` (uint8, at least ``decode_bytes`` less a
        chunk's bytes), as a reader does, apart from the run's decode buffers (to time it);
        False where the chunk is not stored. Only for sources that decode."""
        raise NotImplementedError

    @property
    def panel_chunks(self) -> tuple[int, int] | None:
        """The chunk edges a plan's panels align to: those of chunks read whole (compressed),
        None where part of a chunk is read as cheaply as contiguous storage."""
        return self.chunks

    def where(self) -> dict | None:
        """Where the data is stored (file facts, HDF5 object address, storage), for the
        identity record (:func:`.identity.describe`); None for in-memory arrays."""
        return None

    def record(self) -> dict | None:
        """The job a finished bigmm output records (``bigmm_job``: its options under "job"),
        None where it records none (an array, or data bigmm did not write)."""
        return None

    def footprint(self) -> Footprint:
        """Where the operand's bytes lie, for refusing an output that is an input."""
        return Footprint()

    def stored_files(self) -> tuple:
        """``(path, lo, hi)``: the byte ranges of files the operand is stored in (those of a
        store of many files, a sample of them), for what the page cache holds of it; none
        for in-memory arrays."""
        return ()

    @property
    def fast(self) -> bool:
        """True when reads bypass h5py (and so run in parallel)."""
        return self.layout in ("array", "contiguous", "chunked", *DECODED_KINDS)

    def read(self, r0: int, r1: int, c0: int, c1: int, out: np.ndarray) -> None:
        raise NotImplementedError

    def _check_out(self, r0, r1, c0, c1, out) -> None:
        self._check_region(r0, r1, c0, c1)
        if (out.shape != (r1 - r0, c1 - c0) or out.dtype != self.dtype
                or not out.flags.c_contiguous):
            raise ShapeError(f"Expected a C-contiguous {self.dtype} buffer of shape "
                             f"{(r1 - r0, c1 - c0)}. Got {out.dtype} {out.shape} "
                             f"(C-contiguous: {out.flags.c_contiguous}).")

    def _read_error(self, r0, r1, c0, c1, exc) -> ReadError:
        return ReadError(f"Expected to read rows {r0}:{r1}, columns {c0}:{c1} of {self.label}. "
                         f"Got {type(exc).__name__}: {exc}.")


def incomplete_message(label: str) -> str:
    return (f"Expected a complete dataset. Got {label}, left incomplete by an interrupted bigmm "
            f"run; continue it with resume=True, "
            f"or start over with overwrite=True.")


def _batches(items, piece: int) -> list[list]:
    """Consecutive (item, nbytes) pairs grouped into tasks of at least ``piece`` bytes (the
    last may hold less): one task per reader thread's turn."""
    groups, group, size = [], [], 0
    for item, nbytes in items:
        group.append(item)
        size += nbytes
        if size >= piece:
            groups.append(group)
            group, size = [], 0
    if group:
        groups.append(group)
    return groups
