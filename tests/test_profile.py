"""Stage profiles: interval unions, utilisation, the executor's clocks, Chrome trace, PNG, and
``profile=`` through the API on the NumPy backend."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
import pytest

import bigmm
from bigmm.executor import STAGES
from bigmm.profile import Interval, Profile
from bigmm.testing import random_matrix, reference_gemm, relative_error, tolerance

UNIONS = [
    # (intervals of one stage as (start, end), span, expected busy)
    ([], (0.0, 10.0), 0.0),  # idle stage
    ([(1, 2), (3, 4)], (0.0, 10.0), 2.0),  # disjoint
    ([(1, 5), (2, 3), (4, 6)], (0.0, 10.0), 5.0),  # nested and overlapping: counted once
    ([(1, 2), (2, 3)], (0.0, 10.0), 2.0),  # touching
    ([(-1, 2), (9, 12)], (0.0, 10.0), 3.0),  # clipped to the run's span
    ([(3, 3)], (0.0, 10.0), 0.0),  # empty interval
]


@pytest.mark.parametrize("pairs,span,busy", UNIONS)
def test_busy_is_the_union_within_the_span(pairs, span, busy):
    p = Profile(start=span[0], end=span[1])
    for a, b in pairs:
        p.add("read", a, b, lane="t")
    assert p.busy()["read"] == pytest.approx(busy)
    assert p.utilisation()["read"] == pytest.approx(busy / (span[1] - span[0]))
    merged = p.merged("read")
    assert all(a < b for a, b in merged)
    assert all(b0 < a1 for (_, b0), (a1, _) in zip(merged, merged[1:]))  # disjoint, sorted


def test_every_stage_is_reported_even_when_idle():
    p = Profile(start=0.0, end=1.0)
    p.add("compute", 0.0, 0.5, flops=10)
    assert list(p.busy()) == list(STAGES)
    assert p.busy()["copy_in"] == 0.0


def test_span_falls_back_to_the_extent_of_the_intervals():
    p = Profile()
    p.add("read", 2.0, 3.0)
    p.add("write", 4.0, 6.0)
    assert p.span == (2.0, 6.0) and p.seconds == 4.0


def test_stage_clock_records_per_thread_intervals_and_keeps_the_inner_total():
    class Inner:
        total = 1.5
        entered = exited = 0

        def __enter__(self):
            Inner.entered += 1

        def __exit__(self, *exc):
            Inner.exited += 1
            return False

    p = Profile()
    clock = p.clock("read", Inner())

    def work():
        with clock:
            time.sleep(0.01)

    threads = [threading.Thread(target=work, name=f"reader-{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with clock:
        with clock:  # nested use in one thread: two intervals, inner one inside the outer
            pass
    ivs = [i for i in p.intervals if i.stage == "read"]
    assert len(ivs) == 6 and Inner.entered == Inner.exited == 6
    assert {i.lane for i in ivs} >= {f"reader-{i}" for i in range(4)}
    assert all(i.end - i.start >= 0.009 for i in ivs if i.lane.startswith("reader"))
    assert clock.total == 1.5


def test_device_stages_are_not_taken_from_host_clocks():
    p = Profile(device_stages=("compute",))
    with p.clock("compute"):
        pass
    with p.clock("read"):
        pass
    assert [i.stage for i in p.intervals] == ["read"]


def test_summary_and_table():
    p = Profile(start=0.0, end=2.0, device_stages=("copy_in", "compute"), device="GPU X",
                moved={"read": 4 << 30})
    p.add("read", 0.0, 1.0, lane="r")
    p.add("copy_in", 0.5, 1.0, lane="GPU copy-in stream", nbytes=2 << 30)
    p.add("compute", 1.0, 2.0, lane="GPU compute stream", flops=int(5e13))
    s = p.summary()
    assert s["read"]["bytes"] == 4 << 30 and s["read"]["source"] == "host"
    assert s["copy_in"]["rate_while_busy"] == pytest.approx((2 << 30) / 0.5)
    assert s["compute"]["rate_while_busy"] == pytest.approx(5e13)
    assert s["compute"]["source"] == "device"
    text = p.table()
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["stage", "busy", "util"]
    assert [ln.split()[0] for ln in lines[1:6]] == list(STAGES)
    assert "50.0 TFLOP/s" in text and "GPU X" in text and "run span 2.000 s" in text
    json.dumps(s)


def test_chrome_trace_has_one_track_per_lane_and_microsecond_events(tmp_path):
    p = Profile(start=10.0, end=12.0)
    p.add("read", 10.0, 10.5, lane="bigmm-read_0", nbytes=100)
    p.add("read", 10.2, 10.6, lane="bigmm-read_1", nbytes=100)
    p.add("compute", 10.5, 11.5, lane="GPU compute stream", label="gemm 8x8x8", flops=1024)
    path = p.write_trace(tmp_path / "t.json")
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    names = {e["args"]["name"]: e["tid"] for e in events if e.get("name") == "thread_name"}
    assert set(names) == {"bigmm-read_0", "bigmm-read_1", "GPU compute stream"}
    assert names["GPU compute stream"] == 1  # device tracks first
    assert len(xs) == 3 and min(e["ts"] for e in xs) == 0.0
    gemm = next(e for e in xs if e["cat"] == "compute")
    assert gemm["ts"] == pytest.approx(0.5e6) and gemm["dur"] == pytest.approx(1e6)
    assert gemm["name"] == "gemm 8x8x8" and gemm["args"]["flops"] == 1024
    assert trace["otherData"]["utilisation"]["read"] == pytest.approx(0.3)


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    p = Profile(start=0.0, end=1.0)
    for s, (a, b) in zip(STAGES, [(0, 0.4), (0.3, 0.5), (0.4, 0.9), (0.9, 0.95), (0.9, 1.0)]):
        p.add(s, a, b)
    assert p.plot(tmp_path / "t.png")
    with open(tmp_path / "t.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    files = p.save(tmp_path / "run")
    assert files == {"trace": str(tmp_path / "run.trace.json"), "png": str(tmp_path / "run.png")}


def test_plot_without_matplotlib_says_so(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_mpl(name, *args, **kw):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    p = Profile(start=0.0, end=1.0)
    p.add("read", 0.0, 1.0)
    assert p.plot(tmp_path / "x.png") is False
    assert p.save(tmp_path / "x") == {"trace": str(tmp_path / "x.trace.json")}


def test_intervals_are_plain_values():
    iv = Interval("read", 1.0, 2.0, "t", "", 8, 0)
    assert iv.end - iv.start == 1.0 and iv.nbytes == 8


# ----- through the API on the NumPy backend ---------------------------------------------------

def test_matmul_profile_object_is_filled_and_busy_times_agree(tmp_path):
    a, b = random_matrix((300, 257), np.float64, 1), random_matrix((257, 190), np.float64, 2)
    prof = Profile()
    out, stats = bigmm.matmul(a, b, backend="numpy", memory="64KiB", stats=True, profile=prof)
    assert relative_error(out, reference_gemm(a, b)) <= tolerance(np.float64, 257)
    assert not list(tmp_path.iterdir())  # a Profile object is filled, nothing written
    assert prof.device_stages == ()
    busy = prof.busy()
    assert busy["compute"] > 0 and busy["read"] > 0
    # the same clock uses: the executor's clock is entered before and left after the profile
    # takes its timestamps, so its busy time contains the profile's; they differ by at most a
    # GIL hand-over (sys.getswitchinterval()) per use
    uses = prof.totals("compute")[0]
    assert busy["compute"] <= stats.compute_busy + 1e-9
    assert stats.compute_busy - busy["compute"] <= 0.25 * busy["compute"] + \
        uses * sys.getswitchinterval()
    assert prof.seconds >= stats.seconds * 0.9
    assert prof.totals("compute")[2] == stats.flops  # flops filled in from the run
    assert prof.totals("read")[1] == stats.bytes_read


def test_matmul_profile_prefix_writes_trace_and_png(tmp_path):
    a, b = random_matrix((120, 80), np.float32, 3), random_matrix((80, 70), np.float32, 4)
    bigmm.matmul(a, b, backend="numpy", memory="16KiB", profile=str(tmp_path / "p"))
    with open(tmp_path / "p.trace.json") as f:
        trace = json.load(f)
    stages = {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"read", "compute", "write"} <= stages
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert os.path.getsize(tmp_path / "p.png") > 0


def test_matmul_profile_true_writes_beside_a_file_output(tmp_path):
    a, b = random_matrix((60, 50), np.float64, 5), random_matrix((50, 40), np.float64, 6)
    bigmm.matmul(a, b, f"{tmp_path / 'c.h5'}:/C", backend="numpy", memory="8KiB",
                 profile=True)
    assert os.path.exists(tmp_path / "c.h5.profile.trace.json")


# ----- the command line -----------------------------------------------------------------------

def _operand_files(tmp_path):
    from bigmm.io.generate import generate

    a, b = (f"{tmp_path / 'm.h5'}:/{x}" for x in "AB")
    generate(a, (90, 70), dtype="float64", seed=1)
    generate(b, (70, 60), dtype="float64", seed=2)
    return a, b


CLI_PROFILE = [
    # (extra arguments, files expected)
    (["--profile"], ["c.h5.profile.trace.json"]),  # default prefix: beside the output
    (["--profile", "{tmp}/run"], ["run.trace.json"]),  # explicit prefix
]


@pytest.mark.parametrize("extra,files", CLI_PROFILE)
def test_cli_profile_prints_the_table_and_writes_the_trace(tmp_path, capsys, extra, files):
    from bigmm.cli import main

    a, b = _operand_files(tmp_path)
    argv = ["multiply", a, b, "-o", f"{tmp_path / 'c.h5'}:/C", "--backend", "numpy",
            "--memory", "20KB"] + [x.format(tmp=tmp_path) for x in extra]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "stage" in out and "util" in out and "run span" in out and "profile: " in out
    for f in files:
        assert os.path.exists(tmp_path / f)


def test_cli_profile_json_carries_the_stages(tmp_path, capsys):
    from bigmm.cli import main

    a, b = _operand_files(tmp_path)
    argv = ["multiply", a, b, "-o", f"{tmp_path / 'c.h5'}:/C", "--backend", "numpy",
            "--memory", "20KB", "--json", "--profile", str(tmp_path / "p")]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["profile"]["stages"]) >= set(STAGES)
    assert summary["profile"]["files"]["trace"] == str(tmp_path / "p.trace.json")


def test_cli_kernel_needs_a_gpu_backend(tmp_path, capsys):
    from bigmm.cli import main

    a, b = _operand_files(tmp_path)
    argv = ["multiply", a, b, "-o", f"{tmp_path / 'c.h5'}:/C", "--backend", "numpy",
            "--kernel", "cublas"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GPU backend" in err
