"""Decode buffers: the pool of buffers compressed chunks are decoded into (at most its limit
at once, a chunk still held not decoded again), the streamed inflate and the headers it
checks, and the sources that decode through it (HDF5 and Zarr), whose bytes per decoder the
plan counts."""

from __future__ import annotations

import gzip
import os
import threading
import time
import zlib

import h5py
import hdf5plugin
import numpy as np
import pytest

from bigmm.io import open_input
from bigmm.io.decode import (DecodePool, declared_size, decode_into, inflate_into,
                             unshuffle_into)
from bigmm.testing import random_matrix

SHAPE, CHUNKS = (157, 131), (40, 30)


class Counting:
    """A decode function that counts its calls and the most running at once."""

    def __init__(self, seconds: float = 0.0, fail=()):
        self.calls, self.running, self.most = [], 0, 0
        self.seconds, self.fail = seconds, set(fail)
        self.lock = threading.Lock()

    def __call__(self, key):
        def decode(stored, data):
            with self.lock:
                self.calls.append(key)
                self.running += 1
                self.most = max(self.most, self.running)
            try:
                time.sleep(self.seconds)
                if key in self.fail:
                    raise OSError(f"chunk {key} is corrupt")
                data[...] = key
            finally:
                with self.lock:
                    self.running -= 1
        return decode


def read(pool: DecodePool, key, decode: Counting) -> int:
    with pool.chunk(key, decode(key)) as data:
        return int(data[0])


@pytest.mark.parametrize("limit", [
    1,  # the least: one chunk decoded at a time
    3,  # more threads than that wait for a buffer
])
def test_at_most_the_limit_decode_at_once(limit):
    pool, decode = DecodePool(16, 8, limit), Counting(seconds=0.02)
    threads = [threading.Thread(target=read, args=(pool, key, decode)) for key in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert decode.most == limit and sorted(decode.calls) == list(range(8))
    assert len(pool._pairs) == limit


def test_a_chunk_still_held_is_not_decoded_again():
    pool, decode = DecodePool(16, 8, 2), Counting()
    assert [read(pool, key, decode) for key in (1, 1, 2, 1, 3, 1)] == [1, 1, 2, 1, 3, 1]
    # 3 took the buffer of 2 (used least recently), so 1 stayed
    assert decode.calls == [1, 2, 3]
    assert pool.holds(1) and pool.holds(3) and not pool.holds(2)


def test_threads_reading_a_chunk_being_decoded_wait_for_it():
    pool, decode = DecodePool(16, 8, 4), Counting(seconds=0.05)
    got = []
    threads = [threading.Thread(target=lambda: got.append(read(pool, 7, decode)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [7] * 4 and decode.calls == [7]


def test_a_lower_limit_drops_the_buffers_beyond_it():
    pool, decode = DecodePool(16, 8, 3), Counting(seconds=0.02)
    threads = [threading.Thread(target=read, args=(pool, key, decode)) for key in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(pool._pairs) == 3
    pool.set_limit(1)
    assert len(pool._pairs) == 1 and pool.pair_bytes == 24
    pool.close()
    assert not pool._pairs


def test_a_failed_decode_raises_and_frees_its_buffer():
    pool, decode = DecodePool(16, 8, 1), Counting(fail={5})
    with pytest.raises(OSError, match="chunk 5 is corrupt"):
        read(pool, 5, decode)
    assert read(pool, 6, decode) == 6  # the one buffer is free again
    with pytest.raises(OSError):
        read(pool, 5, decode)  # not held: decoded (and failing) again
    assert decode.calls == [5, 6, 5]


# ----- codecs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("codec, encode", [
    ("deflate", zlib.compress),                        # HDF5's deflate: a zlib stream
    ("gzip", lambda raw: gzip.compress(raw, 1)),       # Zarr's gzip codec
    ("zstd", lambda raw: __import__("numcodecs").Zstd(1).encode(raw)),    # a zstd frame
    ("blosc", lambda raw: __import__("numcodecs").Blosc().encode(raw)),   # a Blosc 1 buffer
])
def test_decode_into_fills_the_buffer_exactly(codec, encode):
    raw = random_matrix((300, 200), np.float32).tobytes()
    stored = encode(raw)
    if codec in ("zstd", "blosc"):
        assert declared_size(codec, stored) == len(raw)
    out = np.empty(len(raw), np.uint8)
    decode_into(codec, memoryview(stored), out, "chunk")
    assert out.tobytes() == raw
    with pytest.raises(OSError, match="chunk"):  # a chunk of another size
        decode_into(codec, memoryview(stored), np.empty(len(raw) + 4, np.uint8), "chunk")


def test_inflate_into_refuses_truncated_and_longer_streams():
    raw = random_matrix((64, 64), np.float32).tobytes()
    stored = zlib.compress(raw)
    with pytest.raises(OSError, match="truncated"):
        inflate_into(stored[:len(stored) // 2], np.empty(len(raw), np.uint8), 15, "chunk")
    with pytest.raises(OSError, match="more than"):
        inflate_into(stored, np.empty(len(raw) - 1, np.uint8), 15, "chunk")
    with pytest.raises(OSError, match="does not inflate"):
        inflate_into(b"not deflate at all", np.empty(len(raw), np.uint8), 15, "chunk")


@pytest.mark.parametrize("dtype", ["<f4", ">f8"])  # native; stored big-endian
def test_unshuffle_copies_a_region_of_a_shuffled_chunk(dtype):
    chunk = random_matrix((40, 30), np.dtype(dtype).newbyteorder("="), seed=3).astype(dtype)
    w = chunk.dtype.itemsize
    shuffled = np.ascontiguousarray(chunk.view(np.uint8).reshape(-1, w).T).ravel()
    out = np.full((20, 50), np.nan, np.dtype(dtype).newbyteorder("="))
    unshuffle_into(shuffled, out[3:13, 5:30], (40, 30), (7, 4), dtype.startswith(">"))
    np.testing.assert_array_equal(out[3:13, 5:30], chunk[7:17, 4:29])
    assert np.isnan(out[:3]).all() and np.isnan(out[:, :5]).all()


# ----- sources ----------------------------------------------------------------------------------

def _h5(tmp_path, **storage) -> tuple[str, np.ndarray]:
    data = random_matrix(SHAPE, np.float32, seed=1)
    path = str(tmp_path / "a.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("A", data=data, chunks=CHUNKS, **storage)
    return f"{path}:/A", data


def _largest_stored(spec: str) -> int:
    path, name = spec.split(":")
    with h5py.File(path, "r") as f:
        d = f[name]
        return max(d.id.get_chunk_info(i).size for i in range(d.id.get_num_chunks()))


@pytest.mark.parametrize("storage, layout", [
    ({"compression": "gzip"}, "deflate"),  # decoded by bigmm's readers
    (hdf5plugin.Zstd(), "zstd"),           # the same
    (hdf5plugin.LZ4(), "h5py"),            # decoded by HDF5, on one thread
])
def test_hdf5_sources_state_the_bytes_one_decoder_holds(tmp_path, storage, layout):
    spec, data = _h5(tmp_path, **storage)
    with open_input(spec, threads=3) as src:
        assert src.layout == layout
        assert src.decode_bytes == 40 * 30 * 4 + _largest_stored(spec)
        assert src.decode_threads == (1 if layout == "h5py" else None)
        out = np.empty(SHAPE, np.float32)
        src.read(0, SHAPE[0], 0, SHAPE[1], out)
        np.testing.assert_array_equal(out, data)


def test_sources_that_decode_nothing_hold_no_decode_buffers(tmp_path):
    spec, _ = _h5(tmp_path)  # chunked, not filtered: parts of chunks read raw
    with open_input(spec) as src:
        assert src.decode_bytes == 0 and src.decode_threads is None
        src.limit_decoders(1)  # nothing to limit
    with open_input(np.ones((4, 4), np.float32)) as src:
        assert src.decode_bytes == 0


@pytest.mark.parametrize("kind", ["h5", "zarr"])  # HDF5 zstd chunks; Zarr zstd chunks
def test_a_source_decodes_at_most_its_limit_at_once(tmp_path, monkeypatch, kind):
    from bigmm.io import decode as dec

    if kind == "h5":
        spec, data = _h5(tmp_path, **hdf5plugin.Zstd())
    else:
        pytest.importorskip("zarr")
        from bigmm.testing import zarr_array

        data = random_matrix(SHAPE, np.float32, seed=1)
        zarr_array(tmp_path / "a.zarr", data, chunks=CHUNKS, codec="zstd")
        spec = f"{tmp_path / 'a.zarr'}"
    real, counting = dec.decode_into, Counting()

    def decode_into(codec, raw, out, what):
        with counting.lock:
            counting.running += 1
            counting.most = max(counting.most, counting.running)
        try:
            time.sleep(0.002)
            real(codec, raw, out, what)
        finally:
            with counting.lock:
                counting.running -= 1

    monkeypatch.setattr("bigmm.io.source.decode_into", decode_into)
    monkeypatch.setattr("bigmm.io.zarrsource.decode_into", decode_into)
    with open_input(spec, threads=4) as src:
        assert src.decode_bytes > 40 * 30 * 4
        for limit in (1, 2):
            src.limit_decoders(limit)
            counting.most = 0
            out = np.empty(SHAPE, np.float32)
            readers = [threading.Thread(target=src.read, args=(0, SHAPE[0], c0, c0 + 30,
                                                               out[:, c0:c0 + 30].copy()))
                       for c0 in range(0, 120, 30)]
            for t in readers:
                t.start()
            for t in readers:
                t.join()
            src.read(0, SHAPE[0], 0, SHAPE[1], out)
            np.testing.assert_array_equal(out, data)
            assert 1 <= counting.most <= limit


@pytest.mark.parametrize("kind", [
    "gzip",  # HDF5 deflate, decoded by bigmm's readers
    "zstd",  # HDF5 zstd, the same
    "lz4",   # HDF5 lz4, decoded by HDF5 (the chunk's region read through it)
    "zarr",  # Zarr zstd chunk files
])
def test_decode_chunk_decodes_one_chunk_apart_from_the_run(tmp_path, kind):
    if kind == "zarr":
        pytest.importorskip("zarr")
        from bigmm.testing import zarr_array

        data = random_matrix(SHAPE, np.float32, seed=1)
        zarr_array(tmp_path / "a.zarr", data, chunks=CHUNKS, codec="zstd")
        spec = str(tmp_path / "a.zarr")
        os.remove(tmp_path / "a.zarr" / "c" / "0" / "1")  # a chunk not stored
    else:
        spec, data = _h5(tmp_path, **{"gzip": {"compression": "gzip"},
                                      "zstd": hdf5plugin.Zstd(), "lz4": hdf5plugin.LZ4()}[kind])
    cr, cc = CHUNKS
    with open_input(spec) as src:
        chunk = cr * cc * 4
        stored = np.zeros(src.decode_bytes - chunk, np.uint8)
        last = (-(-SHAPE[0] // cr) - 1, -(-SHAPE[1] // cc) - 1)  # an edge chunk
        for ci, cj in [(0, 0), (1, 1), last]:
            got = np.full(chunk, 255, np.uint8)
            assert src.decode_chunk(ci, cj, stored, got)
            part = data[ci * cr:(ci + 1) * cr, cj * cc:(cj + 1) * cc]
            block = (got[:part.nbytes].view(np.float32).reshape(part.shape) if kind == "lz4"
                     else got.view(np.float32).reshape(cr, cc)[:part.shape[0], :part.shape[1]])
            np.testing.assert_array_equal(block, part)
        if kind == "zarr":
            assert not src.decode_chunk(0, 1, stored, got)


@pytest.mark.parametrize("keep", [
    lambda n: n - 1,  # the last byte gone (the reused buffer beyond it still holds it)
    lambda n: 0,      # nothing stored: an empty chunk file
    lambda n: 10,     # shorter than a Blosc header
])
def test_a_blosc_buffer_shorter_than_its_header_says_is_refused(keep):
    raw = random_matrix((64, 48), np.float64).tobytes()
    stored = np.frombuffer(__import__("numcodecs").Blosc().encode(raw), np.uint8)
    buf = np.zeros(len(stored) + 64, np.uint8)  # a decode pair's stored buffer, reused
    buf[:len(stored)] = stored
    with pytest.raises(OSError, match="chunk"):
        decode_into("blosc", memoryview(buf)[:keep(len(stored))], np.empty(len(raw), np.uint8),
                    "chunk")
    decode_into("blosc", memoryview(buf)[:len(stored) + 8], np.empty(len(raw), np.uint8),
                "chunk")  # bytes after the buffer its header states are left alone
