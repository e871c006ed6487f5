"""Shared by the tests of HDF5 outputs (sink, output, filesink, region): a 97 x 61 float32 C
in tiles that divide nothing, the job recorded with it, tiles written and C read back. The
``inputs`` fixture (A and B, checked unchanged afterwards) is in conftest.py."""

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bigmm.io import open_input, open_output


SHAPE = (97, 61)
BM, BN = 20, 17  # tiles that divide nothing
JOB = {"plan": {"bm": 20, "bn": 17}, "alpha": 1.5, "beta": 0.0}


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def tiles():
    return [(i, j) for i in range(-(-SHAPE[0] // BM)) for j in range(-(-SHAPE[1] // BN))]


def region(t):
    i, j = t
    return i * BM, min((i + 1) * BM, SHAPE[0]), j * BN, min((j + 1) * BN, SHAPE[1])


def write_tiles(sink, data, which):
    def one(t):
        r0, r1, c0, c1 = region(t)
        sink.write(r0, r1, c0, c1, np.ascontiguousarray(data[r0:r1, c0:c1]))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, which))


def finish_all(sink, data):
    """Every tile of ``data`` written, committed, and the output marked complete."""
    write_tiles(sink, data, tiles())
    sink.commit(tiles())
    sink.finish()


def read_back(spec):
    with open_input(spec, name="C") as src:
        out = np.full(src.shape, np.nan, src.dtype)
        src.read(0, src.shape[0], 0, src.shape[1], out)
    return out


def new_sink(spec, srcs, **kw):
    kw.setdefault("job", JOB)
    return open_output(spec, shape=SHAPE, dtype=np.float32, inputs=srcs, **kw)


def fallocate_fails(monkeypatch, code):
    def fail(fd, offset, length):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "posix_fallocate", fail)
