"""The host costs timed for the predicted time: the issuing thread's work per step and per
staged load, on real runs of a staging backend."""

from __future__ import annotations

import time

import numpy as np

from bigmm.backends.numpy import NumpyBackend
from bigmm.executor import calibrate


class _Staging(NumpyBackend):
    """The NumPy backend driven as a staging one (copies into "device" buffers, synchronous),
    its own host buffers taken as page-locked: the steps' arrays copy in place."""

    name, staging = "numpy-staging", True

    def __init__(self, delay: float = 0.0):
        super().__init__()
        self.delay, self.pinned = delay, []

    def host_buffer(self, size, dtype):
        buf = super().host_buffer(size, dtype)
        self.pinned.append((buf.ctypes.data, buf.ctypes.data + buf.nbytes))
        return buf

    def host_pinned(self, arr):
        lo = arr.ctypes.data
        return any(a <= lo and lo + arr.nbytes <= b for a, b in self.pinned)

    def gemm_launcher(self, *args, **kwargs):
        launch = super().gemm_launcher(*args, **kwargs)

        def slow(stream):
            if self.delay:
                time.sleep(self.delay)  # the launch's own cost, on the issuing thread
            launch(stream)

        return slow


class _SlowLaunch(_Staging):
    name = "numpy-staging-slow"


def test_the_issuing_threads_work_per_step_is_timed_on_real_runs():
    fast = calibrate.issue_seconds(_Staging(), 2)
    slow = calibrate.issue_seconds(_SlowLaunch(3e-3), 2)
    assert all(np.isfinite(x) and x >= 0 for x in fast + slow)
    # 3 ms more per launch shows per step, not per hand-off or per run
    assert slow[0] - fast[0] >= 0.8 * 3e-3
    assert slow[2] < 16 * 3e-3  # not the shorter run's 16 launches
    assert fast[0] < 3e-3
    assert calibrate.issue_seconds(_SlowLaunch(0.0), 2) == slow  # once per kind and threads


def test_a_reader_threads_rate_is_timed_in_pieces():
    rate = calibrate.piece_rate(16 << 20)
    assert np.isfinite(rate) and rate > 1e8  # any host copies faster than 100 MB/s
    assert calibrate.piece_rate(16 << 20) == rate  # once per size
    # each of two threads copying at once: its share of what both copy, timed once
    both = calibrate.piece_rate(16 << 20, 2)
    assert both == calibrate.copy_rate(2, 16 << 20, 4 << 20) / 2 == calibrate.piece_rate(
        16 << 20, 2)



def test_one_readers_decode_rate_is_timed_on_the_sources_chunks(tmp_path, monkeypatch):
    from bigmm.io import open_input
    from bigmm.io.generate import generate

    spec, raw = str(tmp_path / "z.h5") + ":/A", str(tmp_path / "r.h5") + ":/A"
    generate(spec, (300, 200), layout="compressed", compression="zstd", chunks=(64, 50),
             seed=1)
    generate(raw, (300, 200), layout="chunked", chunks=(64, 50), seed=1)
    with open_input(spec) as src, open_input(raw) as plain:
        assert calibrate.decode_rate(plain) is None  # read in part, not decoded
        assert calibrate.decode_rate(open_input(np.ones((4, 4), np.float32))) is None
        calls = []
        decode_chunk = type(src).decode_chunk

        def slow(self, ci, cj, stored, data):  # 20 ms more a chunk
            calls.append((ci, cj))
            time.sleep(0.02)
            return decode_chunk(self, ci, cj, stored, data)

        monkeypatch.setattr(type(src), "decode_chunk", slow)
        rate = calibrate.decode_rate(src)
        chunk = 64 * 50 * 4
        assert chunk / 0.2 < rate <= chunk / 0.02
        # the last chunks, as many as DECODE_SAMPLES; then timed once per source
        assert calls == [(4, 3), (4, 2), (4, 1)][:calibrate.DECODE_SAMPLES]
        assert calibrate.decode_rate(src) == rate and len(calls) == calibrate.DECODE_SAMPLES
        # four readers at once: a round of the last four chunks, then the four before
        calls.clear()
        four = calibrate.decode_rate(src, 4)
        assert chunk / 0.2 < four <= chunk / 0.02
        assert set(calls[:4]) == {(4, 3), (4, 2), (4, 1), (4, 0)}
        assert set(calls[4:8]) == {(3, 3), (3, 2), (3, 1), (3, 0)}
        calls.clear()  # buffers for two readers within the budget: two at once
        calibrate.decode_rate(src, 4, within=2 * src.decode_bytes + 1)
        assert set(calls[:2]) == {(4, 3), (4, 2)} and set(calls[2:4]) == {(4, 1), (4, 0)}


def test_a_sources_read_cost_and_decoding_rate_are_kept_for_later_processes(tmp_path,
                                                                              monkeypatch):
    # a later process plans with the figures the first kept (so one job gets one plan): a
    # kept figure changed in the store is what a fresh process reads back
    import json
    import os
    import subprocess
    import sys

    from bigmm import calibration
    from bigmm.io import open_input
    from bigmm.io.generate import generate

    monkeypatch.setenv(calibration.MODE_ENV, "")
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path / "cache"))
    spec = str(tmp_path / "z.h5") + ":/A"
    generate(spec, (300, 200), layout="compressed", compression="zstd", chunks=(64, 50),
             seed=1)
    script = ("import json, sys\n"
              "from bigmm.io import open_input\n"
              "from bigmm.executor import calibrate\n"
              "with open_input(sys.argv[1]) as src:\n"
              "    print(json.dumps([calibrate.load_seconds(src), calibrate.decode_rate(src)]))\n")

    def fresh() -> list:
        out = subprocess.run([sys.executable, "-c", script, spec], capture_output=True,
                             text=True, check=True, env=dict(os.environ))
        return json.loads(out.stdout)

    monkeypatch.setattr(calibration, "host_quiet", lambda: True)  # this process writes
    with open_input(spec) as src:
        first = [calibrate.load_seconds(src), calibrate.decode_rate(src)]
    assert first[0] > 0 and first[1] > 0
    path = calibration.store_path()
    with open(path) as f:
        data = json.load(f)
    kinds = sorted(name.split(":", 1)[0] for name in data["entries"])
    assert kinds == ["decode-rate", "load-seconds"]
    for entry in data["entries"].values():
        entry["value"] = 12.5  # not what any timing gives
    with open(path, "w") as f:
        json.dump(data, f)
    assert fresh() == [12.5, 12.5]
