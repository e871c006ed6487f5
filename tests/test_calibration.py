"""Calibrations kept between processes: reused where kept on a quiet machine, measured again
where not kept, expired, made on another boot or code, unreadable, or turned off; a store
that cannot be written never fails the caller. Real files in a directory of the test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from bigmm import calibration
from bigmm.executor import calibrate
from bigmm.io import hostcopy


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(calibration.MODE_ENV, "")
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


class Counter:
    """A measurement: 1.5, 2.5, ... on each call."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.calls + 0.5


def test_a_figure_measured_on_a_quiet_machine_is_reused(store):
    m = Counter()
    first = calibration.remembered("rate", [4, 256], m, quiet=lambda: True)
    again = calibration.remembered("rate", [4, 256], m, quiet=lambda: True)
    other = calibration.remembered("rate", [8, 256], m, quiet=lambda: True)  # another key
    assert (first, again, other, m.calls) == (1.5, 1.5, 2.5, 2)
    assert os.path.isfile(calibration.store_path())
    assert os.path.dirname(calibration.store_path()) == str(store)


@pytest.mark.parametrize("before, after", [
    (False, False),  # busy throughout
    (True, False),   # became busy while measuring
    (False, True),   # busy when it started
    (True, None),    # asking failed (a device error): not kept, and no error
])
def test_a_figure_measured_on_a_busy_machine_is_not_kept(store, before, after):
    m = Counter()
    states = iter([before, after, before, after])

    def quiet():
        state = next(states)
        if state is None:
            raise RuntimeError("cudaErrorUnknown")
        return state

    calibration.remembered("rate", [1], m, quiet=quiet)
    calibration.remembered("rate", [1], m, quiet=quiet)
    assert m.calls == 2 and not os.path.exists(calibration.store_path())


def _age_all(seconds: float) -> None:
    """Make every figure in the store ``seconds`` old."""
    path = calibration.store_path()
    with open(path) as f:
        data = json.load(f)
    for entry in data["entries"].values():
        entry["at"] = time.time() - seconds
    with open(path, "w") as f:
        json.dump(data, f)


def test_an_old_figure_is_measured_again(store):
    m = Counter()
    calibration.remembered("rate", [1], m, quiet=lambda: True)
    _age_all(calibration.MAX_AGE + 1)
    assert calibration.remembered("rate", [1], m, quiet=lambda: True) == 2.5 and m.calls == 2
    assert calibration.remembered("rate", [1], m, quiet=lambda: True) == 2.5  # kept anew


def test_writing_drops_old_figures_and_keeps_the_newest_of_a_limited_kind(store):
    calibration.keep("disk-read", ["old"], 1.0)
    _age_all(calibration.MAX_AGE + 1)
    for i in range(4):
        assert calibration.keep("plan", [i], i, limit=2)
    assert calibration.keep("disk-read", ["new"], 2.0, limit=1)
    with open(calibration.store_path()) as f:
        names = set(json.load(f)["entries"])
    assert names == {'plan:[2]', 'plan:[3]', 'disk-read:["new"]'}
    assert calibration.recall("plan", [3], note=False) == 3
    assert not any(f.kind == "plan" for f in calibration.used())


@pytest.mark.parametrize("fact, value", [
    ("_boot_id", lambda: "another boot"),  # the machine started again
    ("code_facts", lambda _: [["api.py", 1, 2]]),  # bigmm's files changed
])
def test_another_boot_or_code_has_a_store_of_its_own(store, monkeypatch, fact, value):
    m = Counter()
    calibration.remembered("rate", [1], m, quiet=lambda: True)
    first = calibration.store_path()
    with monkeypatch.context() as other:
        other.setattr(calibration, fact, value)
        calibration._machine.cache_clear()
        try:
            assert calibration.store_path() != first
            assert calibration.remembered("rate", [1], m, quiet=lambda: True) == 2.5
        finally:
            calibration._machine.cache_clear()
    assert calibration.store_path() == first
    assert calibration.remembered("rate", [1], m, quiet=lambda: True) == 1.5  # its own


@pytest.mark.parametrize("content", [
    "{not json",                            # a torn or foreign file
    '["entries"]',                          # JSON of another shape
    '{"entries": {"rate:[1]": "x"}}',       # an entry of another shape
    '{"entries": {"rate:[1]": {"at": "now", "value": 9}}}',  # a time that is no number
    '{"entries": {"rate:[1]": {"value": 9}}}',                # no time
    '{"entries": ["rate:[1]"]}',            # entries of another shape
])
def test_an_unreadable_store_is_measured_afresh_and_rewritten(store, content):
    os.makedirs(store)
    with open(calibration.store_path(), "w") as f:
        f.write(content)
    m = Counter()
    assert calibration.remembered("rate", [1], m, quiet=lambda: True) == 1.5
    assert calibration.remembered("rate", [1], m, quiet=lambda: True) == 1.5 and m.calls == 1


def test_a_figure_that_does_not_decode_is_measured_again(store):
    m = Counter()
    calibration.remembered("rate", [1], m, quiet=lambda: True)
    value = calibration.remembered("rate", [1], m, quiet=lambda: True,
                                   decode=lambda v: v["no such field"])
    assert value == 2.5 and m.calls == 2


@pytest.mark.parametrize("mode, calls, kept", [
    ("off", 3, False),    # measured in every process, nothing kept
    ("fresh", 3, True),   # measured again each time, kept even though the machine is busy
    ("", 3, False),       # the default on a busy machine: measured, not kept
])
def test_the_environment_turns_keeping_off_or_fresh(store, monkeypatch, mode, calls, kept):
    monkeypatch.setenv(calibration.MODE_ENV, mode)
    m = Counter()
    for _ in range(3):
        calibration.remembered("rate", [1], m, quiet=lambda: False)
    assert m.calls == calls and os.path.exists(calibration.store_path()) == kept


def test_a_store_that_cannot_be_written_is_passed_over(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(calibration.MODE_ENV, "")
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path / "a-file" / "cache"))
    m = Counter()
    assert calibration.remembered("rate", [1], m, quiet=lambda: True) == 1.5
    assert calibration.remembered("rate", [1], m, quiet=lambda: True) == 2.5


def test_forget_drops_the_kept_figures(store):
    m = Counter()
    calibration.remembered("rate", [1], m, quiet=lambda: True)
    calibration.forget()
    calibration.forget()  # nothing left: no error
    assert calibration.remembered("rate", [1], m, quiet=lambda: True) == 2.5


def test_the_hosts_copy_rate_is_kept_and_reused(store, monkeypatch):
    monkeypatch.setattr(calibration, "host_quiet", lambda: True)
    calibrate._kept_copy_rate.cache_clear()
    try:
        measured = calibrate.copy_rate(2, 1 << 20)
        calibrate._kept_copy_rate.cache_clear()  # as a new process would start

        def no_measuring(*args):
            raise AssertionError("measured again")

        monkeypatch.setattr(calibrate, "_copy_rate", no_measuring)
        assert calibrate.copy_rate(2, 1 << 20) == measured
    finally:
        calibrate._kept_copy_rate.cache_clear()


def test_a_second_process_reuses_the_first_ones_figures(store):
    # two real processes: the first measures and keeps (the machine vouched for), the
    # second reads the same figure without measuring
    code = ("import sys; from bigmm import calibration\n"
            "def m():\n    print('measured', end=' ')\n    return 42.0\n"
            "print(calibration.remembered('rate', [1], m))")
    env = dict(os.environ, **{calibration.MODE_ENV: "fresh"})
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    env[calibration.MODE_ENV] = ""
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, check=True).stdout.split()
    assert first == ["measured", "42.0"] and second == ["42.0"]


@pytest.mark.parametrize("where", [
    "pkg",      # a module of the package
    "kernels",  # a CUDA source beside it (a source tree's top-level kernels/)
])
def test_the_code_facts_change_with_any_code_file(tmp_path, where):
    for path in ("pkg/a.py", "pkg/sub/b.py", "kernels/k.cu", "pkg/notes.txt"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    before = calibration.code_facts(str(tmp_path / "pkg"))
    assert [f[0] for f in before] == ["pkg/a.py", "pkg/sub/b.py", "kernels/k.cu"]
    (tmp_path / "pkg/notes.txt").write_text("not code")
    assert calibration.code_facts(str(tmp_path / "pkg")) == before
    (tmp_path / ("pkg/sub/b.py" if where == "pkg" else "kernels/k.cu")).write_text("changed")
    assert calibration.code_facts(str(tmp_path / "pkg")) != before


# ----- measuring on purpose, what a process used, and ``bigmm calibrate`` ---------------------

def test_measuring_measures_kept_figures_again_and_keeps_them(store):
    m, dropped = Counter(), []
    calibration.on_measuring(lambda: dropped.append(True))
    try:
        first = calibration.remembered("rate", [1], m, quiet=lambda: True)
        with calibration.measuring():
            again = calibration.remembered("rate", [1], m, quiet=lambda: False)  # busy: kept
        later = calibration.remembered("rate", [1], m, quiet=lambda: True)
    finally:
        calibration._DROPS.pop()
    assert (first, again, later, m.calls, dropped) == (1.5, 2.5, 2.5, 2, [True])
    assert calibration.mode() == "reuse"  # the block's end restores the mode


def test_measuring_keeps_nothing_where_the_environment_says_off(store, monkeypatch):
    monkeypatch.setenv(calibration.MODE_ENV, "off")
    with calibration.measuring():
        assert calibration.remembered("rate", [1], Counter(), quiet=lambda: True) == 1.5
    assert not os.path.exists(calibration.store_path())


@pytest.mark.parametrize("mode, kept, quiet, words", [
    ("", False, True, "measured now, kept for later jobs"),    # measured and stored
    ("", True, True, "kept, the oldest measured"),            # an earlier process's
    ("", False, False, "measured now, not all kept"),         # measured on a busy machine
    ("off", False, True, "measured now, not kept (BIGMM_CALIBRATION=off)"),
])
def test_a_process_says_how_old_its_figures_are(store, monkeypatch, mode, kept, quiet, words):
    monkeypatch.setattr(calibration, "_USED", {})
    if kept:  # an earlier process measured it an hour ago
        calibration.remembered("rate", [7], lambda: 3.0, quiet=lambda: True)
        entries = json.loads(open(calibration.store_path()).read())
        for entry in entries["entries"].values():
            entry["at"] -= 3600
        open(calibration.store_path(), "w").write(json.dumps(entries))
        calibration._USED.clear()
    monkeypatch.setenv(calibration.MODE_ENV, mode)
    calibration.remembered("rate", [7], lambda: 3.0, quiet=lambda: quiet)
    text = calibration.describe_use(calibration.used())
    assert text.startswith(words), text
    if kept:
        assert "60.0 min ago" in text or "1h00m" in text, text
    assert calibration.describe_use([]) is None


def cli(capsys, *argv):
    from bigmm.cli import main

    rc = main(["calibrate", *argv])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


def test_calibrate_measures_again_keeps_and_prints_the_figures(store, capsys, monkeypatch):
    monkeypatch.setattr(calibration, "host_quiet", lambda: True)
    out = cli(capsys, "--backend", "numpy", "--host-memory", "256MiB", "--io-threads", "2")
    assert "host copies out of arrays" in out and "GB/s" in out, out
    assert "kept 3 of 3 figures in " + calibration.store_path() in out, out
    assert ("host copies: non-temporal stores" if hostcopy.kind() == "stream"
            else "host copies: NumPy's (") in out, out
    assert "  host copies (threads, bytes, piece, how) [2, " in cli(capsys, "--show")
    before = calibration.kept()
    assert sorted(name.split(":")[0] for name in before) == [
        "copy-rate", "copy-rate", "copy-row-seconds"]
    summary = json.loads(cli(capsys, "--backend", "numpy", "--host-memory", "256MiB",
                             "--io-threads", "2", "--dtype", "float32", "float64", "--json"))
    after = calibration.kept()
    assert after.keys() == before.keys()  # the same figures, each measured again
    assert all(after[name][0] > before[name][0] for name in before)
    assert summary["kept"] == 3 and set(summary["figures"]) == {"float32", "float64"}
    assert summary["host_copies"] == hostcopy.kind()
    assert all(f["read_bytes"] > 0 for f in summary["figures"].values())


def test_a_plan_after_calibrate_measures_none_of_its_figures(store, capsys, tmp_path):
    cli(capsys, "--backend", "numpy", "--host-memory", "256MiB", "--io-threads", "2")
    # a later process (the command's in-process figures gone) plans a job of arrays with
    # them; measuring would fail
    code = ("import numpy as np, bigmm\n"
            "from bigmm import calibration\n"
            "from bigmm.executor import calibrate\n"
            "def measured(*a, **k):\n    raise AssertionError('measured again')\n"
            "calibrate._copy_rate = calibrate._copy_row_seconds = measured\n"
            "a = np.ones((300, 200), np.float32)\n"
            "bigmm.plan(a, a.T.copy(), backend='numpy', host_memory='256MiB', io_threads=2)\n"
            "print(calibration.describe_use(calibration.used()))\n")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("kept, the oldest measured"), out.stdout
    assert "(3 of 3 figures" in out.stdout, out.stdout


def test_calibrate_show_and_forget(store, capsys):
    assert "no figures kept" in cli(capsys, "--show")
    calibration.remembered("rate", [5], lambda: 2.0, quiet=lambda: True)
    shown = cli(capsys, "--show")
    assert shown.startswith("1 figures kept for this machine in " + calibration.store_path())
    assert 'rate [5]: measured' in shown, shown
    listed = json.loads(cli(capsys, "--show", "--json"))["figures"]
    assert [(f["figure"], f["value"]) for f in listed] == [("rate:[5]", 2.0)]
    calibration.keep("disk-write", "8:1", 1.5e9)  # a rate a run showed, in words
    assert 'file writes a run showed (disk) "8:1": measured' in cli(capsys, "--show")
    assert cli(capsys, "--forget").startswith("forgot the figures kept in ")
    assert not os.path.exists(calibration.store_path())
    assert cli(capsys, "--forget").startswith("no figures kept")


def test_calibrate_with_keeping_off_prints_figures_and_keeps_none(store, capsys, monkeypatch):
    monkeypatch.setenv(calibration.MODE_ENV, "off")
    out = cli(capsys, "--backend", "numpy", "--host-memory", "256MiB", "--io-threads", "2")
    assert "GB/s" in out and "not kept (BIGMM_CALIBRATION=off)" in out, out
    assert not os.path.exists(calibration.store_path())


def test_bigmm_plan_says_how_old_its_figures_are(store, tmp_path):
    # two real processes of the command line: the first measures its figures and keeps them
    # (the machine vouched for), the second plans with them and says how old they are
    spec = f"{tmp_path / 'a.h5'}:/A"
    subprocess.run([sys.executable, "-m", "bigmm", "generate", spec, "--shape", "300", "200"],
                   check=True, capture_output=True)
    lines = []
    for mode in ("fresh", ""):
        env = dict(os.environ, **{calibration.MODE_ENV: mode})
        out = subprocess.run([sys.executable, "-m", "bigmm", "plan", spec, spec, "--trans-b",
                              "--backend", "numpy", "--host-memory", "256MiB", "--io-threads",
                              "2"], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        lines.append([x for x in out.stdout.splitlines() if x.startswith("calibration")])
    assert lines[0] == ["calibration     measured now, kept for later jobs"], lines
    assert lines[1][0].startswith("calibration     kept, the oldest measured "), lines


def test_a_figure_a_run_observed_is_kept_and_recalled(store):
    assert calibration.recall("disk-write", "8:1") is None
    assert calibration.keep("disk-write", "8:1", 2.5e9)
    assert calibration.recall("disk-write", "8:1") == 2.5e9
    assert calibration.recall("disk-write", "8:2") is None  # another key
    assert any(f.kind == "disk-write" and f.kept for f in calibration.used())


def test_observed_figures_neither_kept_nor_recalled_when_off(store, monkeypatch):
    assert calibration.keep("disk-read", "8:1", 1e9)
    monkeypatch.setenv(calibration.MODE_ENV, "off")
    assert not calibration.keep("disk-read", "8:1", 3e9)
    assert calibration.recall("disk-read", "8:1") is None
    monkeypatch.setenv(calibration.MODE_ENV, "fresh")  # not measured: still recalled
    assert calibration.recall("disk-read", "8:1") == 1e9
