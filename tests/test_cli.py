"""The ``bigmm`` command, in process through ``main([...])`` and as ``python -m bigmm``."""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from bigmm import errors
from bigmm.cli import main
from bigmm.io.generate import block
from bigmm.testing import reference_gemm, relative_error, tolerance

M, K, N = 157, 211, 103  # multiples of nothing
BUDGET = "80KB"           # forces many tiles and K panels


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def operands(tmp_path, capsys):
    """A (chunked) and B (compressed, each chunk decoded well within BUDGET) on disk, and
    their in-memory copies."""
    a, b = f"{tmp_path / 'a.h5'}:/A", f"{tmp_path / 'b.h5'}:/grp/B"
    assert run(capsys, "generate", a, "--shape", M, K, "--layout", "chunked",
               "--chunks", 50, 70, "--seed", 1)[0] == 0
    assert run(capsys, "generate", b, "--shape", K, N, "--layout", "compressed",
               "--chunks", 60, 40, "--seed", 2)[0] == 0
    return a, b, block((M, K), 1, 0, M, "float32"), block((K, N), 2, 0, K, "float32")


def test_generate_multiply_verify_roundtrip(tmp_path, capsys, operands):
    a, b, xa, xb = operands
    c = f"{tmp_path / 'c.h5'}:/C"
    rc, out, err = run(capsys, "multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy")
    assert rc == 0, err
    assert "TFLOP/s" in out
    check_progress_lines(err)
    with h5py.File(tmp_path / "c.h5", "r") as f:
        got = f["C"][...]
    assert relative_error(got, reference_gemm(xa, xb)) < tolerance(np.float32, K)
    rc, out, err = run(capsys, "verify", a, b, c)
    assert rc == 0 and out.startswith("PASSED"), out + err


def test_multiply_json_summary(tmp_path, capsys, operands):
    a, b, _, _ = operands
    c = f"{tmp_path / 'c.h5'}:/C"
    rc, out, err = run(capsys, "multiply", a, b, "-o", c, "--memory", BUDGET, "--backend",
                       "numpy", "--alpha", "0.5", "--json")
    assert rc == 0, err
    s = json.loads(out)
    assert s["ok"] is True and s["tiles_redone"] == 0 and s["notes"] == []
    assert s["shape_a"] == [M, K] and s["shape_b"] == [K, N] and s["shape_c"] == [M, N]
    assert s["dtype"] == "float32" and s["out"].endswith("c.h5:/C")
    assert s["tiles_total"] > 4 and s["tiles_done"] + s["tiles_skipped"] == s["tiles_total"]
    assert s["bytes_read"] >= 4 * (M * K + K * N) and s["bytes_written"] == 4 * M * N
    assert s["flops"] == 2 * M * N * K and s["seconds"] > 0 and s["tflops"] > 0
    assert s["gbps"] > 0 and set(s["stages"]) >= {"read", "compute", "write"}
    assert all(0 <= v["utilisation"] <= 1.5 for v in s["stages"].values())
    # the time the plan predicted for it, and how old the figures behind it were
    assert 0 < s["predicted_seconds"] < 600
    assert s["calibration"].startswith(("measured now", "kept, the oldest")), s["calibration"]
    # float16 operands: C in float32 by default, in float16 when asked; the summary says which
    h = tmp_path / "h.h5"
    with h5py.File(h, "w") as f:
        f["A"], f["B"] = np.ones((5, 4), np.float16), np.ones((4, 3), np.float16)
    for extra, c_dtype in (([], "float32"), (["--out-dtype", "float16"], "float16")):
        rc, out, err = run(capsys, "multiply", f"{h}:/A", f"{h}:/B", "-o", f"{h}:/C{c_dtype}",
                           "--backend", "numpy", "--json", *extra)
        s = json.loads(out)
        assert rc == 0 and (s["dtype"], s["c_dtype"]) == ("float16", c_dtype), err


def test_plan_writes_nothing(tmp_path, capsys, operands):
    a, b, _, _ = operands
    before = sorted(os.listdir(tmp_path))
    c = f"{tmp_path / 'c.h5'}:/C"
    rc, out, err = run(capsys, "plan", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy")
    assert rc == 0, err
    assert f"C[{M} x {N}]" in out and "C tiles" in out and "predicted time" in out
    rc, out, err = run(capsys, "plan", a, b, "--memory", BUDGET, "--backend", "numpy", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["ok"] is True and (d["m"], d["n"], d["k"]) == (M, N, K) and d["n_tiles"] > 4
    assert sorted(os.listdir(tmp_path)) == before


def test_plan_of_a_resume_counts_the_journaled_tiles(tmp_path, capsys, operands):
    import bigmm
    from bigmm.io.journal import journal_path, parse_journal
    from bigmm.io.spec import parse_spec

    a, b, _, _ = operands
    c = f"{tmp_path / 'c.h5'}:/C"
    args = ("--backend", "numpy")

    def stop(p):
        if p.tiles_done >= 3:
            raise KeyboardInterrupt

    with pytest.raises(errors.Interrupted):
        bigmm.matmul(a, b, c, memory=BUDGET, backend="numpy", progress=stop)
    journaled = len(parse_journal(journal_path(parse_spec(c)))[1])
    before = {p: os.stat(p).st_mtime_ns for p in glob.glob(str(tmp_path / "*"))}
    # another budget: the journal's schedule all the same
    rc, out, err = run(capsys, "plan", a, b, "-o", c, "--resume", "--memory", "64MiB", *args)
    assert rc == 0, err
    d = json.loads(run(capsys, "plan", a, b, "-o", c, "--resume", "--json", *args)[1])
    assert d["tiles_journaled"] == journaled >= 3 and d["n_tiles"] > journaled
    assert f"{journaled} of {d['n_tiles']} tiles journaled" in out
    rc, out, err = run(capsys, "plan", a, b, "-o", c, "--resume", "--alpha", "2", *args)
    assert rc == 2 and "alpha: recorded 1.0, now 2.0" in err  # another job: refused
    rc, out, err = run(capsys, "plan", a, b, "--resume", *args)
    assert rc == 2 and "Expected -o C with --resume" in err
    rc, out, err = run(capsys, "plan", a, b, "-o", f"{tmp_path / 'new.h5'}:/C", "--resume", *args)
    assert rc == 0 and "no journal of an interrupted run" in out
    assert {p: os.stat(p).st_mtime_ns for p in glob.glob(str(tmp_path / "*"))} == before
    assert run(capsys, "multiply", a, b, "-o", c, "--resume", "--quiet", *args)[0] == 0


def test_verify_fails_on_a_changed_element(tmp_path, capsys, operands):
    a, b, xa, xb = operands
    c = reference_gemm(xa, xb).astype(np.float32)
    c[M // 2, N - 1] += 1.0
    with h5py.File(tmp_path / "bad.h5", "w") as f:
        f["C"] = c
    rc, out, err = run(capsys, "verify", a, b, f"{tmp_path / 'bad.h5'}:/C", "--json")
    assert rc == 1, err
    r = json.loads(out)
    assert r["passed"] is False and r["worst"] == [M // 2, N - 1]
    # a product that fails is the command's error: ok false, exit status 1
    assert r["ok"] is False and r["exit_code"] == 1 and r["error_type"] == "VerificationError"
    assert r["error"].startswith("FAILED") and err == ""


# Each case: argv (with {a}, {b}, {t} for the operands and tmp_path) and a word the error names.
ERROR_CASES = [
    (["multiply", "{t}/nope.h5:/A", "{b}", "-o", "{t}/c.h5:/C"], "nope.h5"),  # missing file
    (["multiply", "{a}", "{t}/b.h5:/missing", "-o", "{t}/c.h5:/C"], "missing"),  # no dataset
    (["multiply", "{a}", "{a}", "-o", "{t}/c.h5:/C"], "Expected"),           # inner dims differ
    (["multiply", "{a}", "{b}", "-o", "{a}", "--overwrite"], "Expected"),    # output is input
    (["multiply", "{a}", "{b}", "-o", "{t}/c.h5:/C", "--memory", "lots"], "lots"),  # bad size
    (["multiply", "{a}", "{b}", "-o", "{t}/c.h5:/C", "--memory", "100"], "budget"),  # too small
    (["multiply", "{a}", "{b}", "-o", "{t}/no/dir/c.h5:/C"], "Expected"),    # no such directory
    (["plan", "{a}", "{b}", "-o", "{a}"], "other than the inputs"),         # output is input
    (["plan", "{a}", "{b}", "--memory", "inf"], "inf"),                      # infinite budget
    (["plan", "{a}", "{b}", "--memory", "nan"], "nan"),                      # not a number
    (["plan", "{a}", "{b}", "--memory", "1e400"], "1e400"),                  # overflows a float
    (["multiply", "{a}", "{b}", "-o", "{t}/c.h5:/C", "--memory", "16KB"],    # below B's decoded
     "store B in smaller chunks"),                                            # chunk
    (["multiply", "{a}", "{b}", "-o", "{t}/c.h5:/C", "--backend", "tpu"], "tpu"),  # backend
    (["plan", "{a}", "{b}", "--memory=-3GiB"], "Expected"),                   # negative size
    (["plan", "{a}", "{b}", "--io-threads", "0"], "Expected --io-threads"),   # no threads
    (["plan", "{a}", "{b}", "--memory", "abc"], "Expected --memory like"),    # not a size
    (["verify", "{a}", "{b}", "{a}", "--probes", "0"], "Expected --probes"),  # no probes
    (["verify", "{a}", "{b}", "{t}/c.h5:/C", "--beta", "1"],                 # beta, no --c0
     "Expected --c0 (the C before the run) when beta != 0. Got --beta 1.0."),
    (["plan", "{a}", "{b}", "--backend", "numpy", "--kernel", "cublas"],      # GPU kernel, CPU
     "Expected --kernel only with a GPU backend. Got --kernel 'cublas'"),
    (["calibrate", "--backend", "numpy", "--kernel", "cublas"], "--kernel only"),  # the same
    (["verify", "{a}", "{b}", "{t}/nope.h5:/C"], "nope.h5"),                 # missing C
    (["verify", "{a}", "{b}", "{a}"], "Expected"),                           # C has wrong shape
    (["generate", "{t}/g.h5:/G", "--shape", "0", "5"], "shape"),             # empty shape
    (["generate", "{a}", "--shape", "5", "5"], "overwrite"),                 # exists
    (["generate", "no-dataset-part", "--shape", "5", "5"], "Expected"),      # bad spec
    (["generate", "{t}/g.h5:/G", "--shape", "5", "5", "--seed", str(2**64)], "2**64"),  # seed
    (["verify", "{a}", "{a}", "{t}/c.h5:/C", "--seed", "-1"], "seed"),        # negative seed
    (["multiply", "{a}", "{b}", "-o", "{t}/c.h5:/C", "--profile", "{t}/no/dir/p"],
     "profile"),                                                              # before the run
    (["frobnicate"], "invalid choice"),                                      # unknown command
    (["multiply", "{a}"], "required"),                                       # missing arguments
]


@pytest.mark.parametrize("argv, word", ERROR_CASES)
def test_errors_are_one_line(tmp_path, capsys, operands, argv, word):
    a, b, _, _ = operands
    with h5py.File(tmp_path / "a.h5", "r") as f:
        a_before = f["A"][...]
    argv = [w.format(a=a, b=b, t=tmp_path) for w in argv]
    rc, out, err = run(capsys, *argv)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bigmm"), err
    assert "error:" in lines[0] and word in lines[0] and "Traceback" not in err
    with h5py.File(tmp_path / "a.h5", "r") as f:
        assert np.array_equal(f["A"][...], a_before)  # the inputs are untouched
    if argv[0] != "verify":
        assert not glob.glob(str(tmp_path / "c.h5*")) and not (tmp_path / "g.h5").exists()


# Each case: argv, the error's class (or part of its name) and a word of its message.
JSON_ERRORS = [
    (["multiply", "{t}/nope.h5:/A", "{b}", "-o", "{t}/c.h5:/C"],             # missing input
     "OperandNotFound", "nope.h5"),
    (["multiply", "{b}", "{b}", "-o", "{t}/c.h5:/C"], "ShapeError", "Expected"),  # inner dims
    (["multiply", "{a}", "{b}", "-o", "{a}"], "Error", "other than the inputs"),  # C is A
    (["plan", "{a}", "{b}", "--memory", "100"], "Error", "budget"),          # budget too small
    (["verify", "{a}", "{b}", "{t}/nope.h5:/C"], "OperandNotFound", "nope.h5"),  # verify's C
    (["gram", "{a}", "-o", "{t}/g.h5:/G", "--memory", "lots"], "SizeParseError", "lots"),  # size
    (["calibrate", "--backend", "numpy", "--kernel", "cublas"],               # GPU kernel, CPU
     "OptionError", "--kernel"),
    (["bench", "--size", "0", "--backend", "numpy"], "OptionError", "--size"),  # bench's size
    (["multiply", "{a}", "{b}"], "UsageError", "-o/--out"),                   # missing option
    (["plan", "{a}", "{b}", "--memroy", "4MiB"], "UsageError", "--memroy"),   # misspelt option
]


@pytest.mark.parametrize("argv, kind, word", JSON_ERRORS)
def test_json_commands_answer_on_stdout_when_they_fail(tmp_path, capsys, operands, argv, kind,
                                                       word):
    a, b, _, _ = operands
    argv = [w.format(a=a, b=b, t=tmp_path) for w in argv] + ["--json"]
    rc, out, err = run(capsys, *argv)
    assert rc == 2, (out, err)
    s = json.loads(out)  # one object: nothing else on stdout
    assert s["ok"] is False and s["exit_code"] == 2, s
    assert issubclass(getattr(errors, s["error_type"]), errors.BigmmError), s
    assert kind in s["error_type"], s
    # the line on stderr, as without --json ("bigmm COMMAND: error: ..." for usage errors)
    assert word in s["error"] and err.startswith("bigmm") and err.count("\n") == 1, err
    assert err.strip().endswith(f": error: {s['error']}"), err
    assert "resumable" not in s and "output" not in s  # failed before any run: nothing left
    assert not glob.glob(str(tmp_path / "c.h5*")) and not (tmp_path / "g.h5").exists()


def test_a_failed_run_and_a_refused_resume_answer_in_json(tmp_path, capsys):
    """A run that fails after it journaled its output names the output, resumable; a resume
    it then refuses, and a fresh run over its journal, do not."""
    h = tmp_path / "h.h5"
    with h5py.File(h, "w") as f:  # products of 3.6e7: beyond float16
        f["A"], f["B"] = np.full((64, 48), 3000, np.float16), np.full((48, 40), 3000, np.float16)
    c = f"{tmp_path / 'c.h5'}:/C"
    argv = ["multiply", f"{h}:/A", f"{h}:/B", "-o", c, "--out-dtype", "float16", "--memory",
            "20KB", "--backend", "numpy", "--json"]
    rc, out, err = run(capsys, *argv)
    s = json.loads(out)
    assert rc == 2 and s["exit_code"] == 2 and s["error_type"] == "OutputOverflowError", s
    assert s["output"] == c and s["resumable"] is True
    assert err.strip() == f"bigmm: error: {s['error']}"
    assert glob.glob(str(tmp_path / "c.h5*.bigmm-journal"))  # what makes it resumable
    # the same output resumed as another job: refused, the journal untouched
    rc, out, err = run(capsys, *argv, "--resume", "--alpha", "0.5")
    s = json.loads(out)
    assert rc == 2 and s["error_type"] == "ResumeError" and "alpha" in s["error"], s
    assert "resumable" not in s and "output" not in s
    # and run again without --resume: refused before it starts
    rc, out, err = run(capsys, *argv)
    s = json.loads(out)
    assert rc == 2 and s["error_type"] == "OutputExistsError" and "--resume" in s["error"], s
    assert "resumable" not in s


def test_json_successes_say_ok(tmp_path, capsys, operands):
    # gram's plan, a gram run and the verify of its C: each one JSON object, ok true
    a, _, _, _ = operands
    g = f"{tmp_path / 'g.h5'}:/G"
    for argv in (["gram", a, "-o", g, "--plan", "--backend", "numpy"],
                 ["gram", a, "-o", g, "--memory", BUDGET, "--backend", "numpy"],
                 ["verify", a, a, g, "--trans-a"]):
        rc, out, err = run(capsys, *argv, "--json")
        s = json.loads(out)
        assert rc == 0 and s["ok"] is True, (argv, err)
    assert s["passed"] is True


def test_debug_shows_the_traceback(tmp_path, capsys):
    rc, _, err = run(capsys, "--debug", "verify", f"{tmp_path}/x.h5:/A", f"{tmp_path}/x.h5:/B",
                     f"{tmp_path}/x.h5:/C")
    assert rc == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("bigmm")


def test_demo_runs(tmp_path, capsys):
    rc, out, err = run(capsys, "demo", "--size", 173, "--dir", tmp_path, "--backend", "numpy")
    assert rc == 0, out + err
    assert "C tiles" in out and "PASSED" in out and "demo passed" in out and "GB/s" in out
    assert (tmp_path / "demo.h5").exists()


@pytest.mark.parametrize("command", ["demo", "bench"])  # both work in --dir
def test_a_work_dir_that_is_a_file_is_one_error(tmp_path, capsys, command):
    (tmp_path / "f").write_text("x")
    rc, _, err = run(capsys, command, "--size", 64, "--dir", tmp_path / "f", "--backend",
                     "numpy")
    assert rc == 2 and err.startswith("bigmm: error: Expected a directory to work in")


def _bigmm(*argv, **kw):
    return subprocess.run([sys.executable, "-m", "bigmm", *map(str, argv)], capture_output=True,
                          text=True, timeout=120, **kw)


def check_progress_lines(err: str) -> None:
    """stderr of a run without a terminal: progress lines up to 100%, no escape codes."""
    lines = err.strip().splitlines()
    assert lines and all(re.match(r"bigmm: \d+% \(\d+ of \d+ tiles", ln) for ln in lines), err
    percents = [int(ln.split()[1].rstrip("%")) for ln in lines]
    assert percents == sorted(percents) and percents[-1] == 100, err
    assert len(lines) <= 11 and "\x1b" not in err and "eta" in lines[0], err


def test_progress_lines_in_a_log(tmp_path, monkeypatch):
    # a long run: a line at least every LINE_SECONDS even between tenths
    from bigmm.cli import report
    from bigmm.runstats import Progress

    lines = []

    class Log:
        def write(self, text):
            lines.append(text)

        def flush(self):
            pass

    reporter = report._progress_lines(total_flops=1000, stream=Log())
    monkeypatch.setattr(report, "LINE_SECONDS", 0.0)
    for done in (1, 2, 3):
        reporter(Progress(done, 100, 0, 0, 0, done * 10, 1.0 * done))
    assert len([ln for ln in lines if ln.strip()]) == 3
    monkeypatch.setattr(report, "LINE_SECONDS", 1e9)
    reporter(Progress(4, 100, 0, 0, 0, 40, 4.0))  # 4%: not a new tenth, not due
    assert len([ln for ln in lines if ln.strip()]) == 3
    reporter(Progress(60, 100, 50, 0, 0, 100, 5.0))  # half skipped: 60% of the work done
    assert "60% (60 of 100 tiles, 50 skipped)" in lines[-2]


def test_subprocess_roundtrip_and_error(tmp_path):
    a, b, c = (f"{tmp_path / 'm.h5'}:/{x}" for x in "ABC")
    assert _bigmm("generate", a, "--shape", 31, 45, "--dtype", "float64").returncode == 0
    assert _bigmm("generate", b, "--shape", 45, 29, "--seed", 3, "--dtype", "float64").returncode == 0
    p = _bigmm("multiply", a, b, "-o", c, "--memory", "20KB", "--backend", "numpy", "--trans-b")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    p = _bigmm("multiply", a, b, "-o", c, "--memory", "20KB", "--backend", "numpy")
    assert p.returncode == 0, p.stderr
    check_progress_lines(p.stderr)  # not a TTY: plain lines, not a bar
    p = _bigmm("multiply", a, b, "-o", c, "--memory", "20KB", "--backend", "numpy",
               "--overwrite", "--quiet")
    assert p.returncode == 0 and p.stderr == "" and p.stdout == ""
    p = _bigmm("verify", a, b, c)
    assert p.returncode == 0 and "PASSED" in p.stdout


#: A Ctrl-C that lands while the command line is still being loaded (the import of bigmm.cli).
CTRL_C_WHILE_LOADING = """
import sys

class Stop:
    def find_spec(self, name, path=None, target=None):
        if name == "bigmm.cli":
            raise KeyboardInterrupt

sys.meta_path.insert(0, Stop())
sys.argv = ["bigmm", *sys.argv[1:]]
from bigmm._command import run
sys.exit(run())
"""


@pytest.mark.parametrize("json_flag", [["--json"], []])  # with and without its JSON answer
def test_ctrl_c_while_loading(tmp_path, json_flag):
    p = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_LOADING, "plan", "a.h5:/A", "b.h5:/B",
                        *json_flag], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert p.returncode == 130 and p.stderr == "bigmm: error: interrupted\n", p.stderr
    if json_flag:
        s = json.loads(p.stdout)
        assert s == {"ok": False, "error": "interrupted", "error_type": "KeyboardInterrupt",
                     "exit_code": 130}
    else:
        assert p.stdout == ""


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130),   # Ctrl-C
                                         (signal.SIGTERM, 143)])  # a scheduler's stop
def test_ctrl_c_leaves_a_resumable_output(tmp_path, sig, status):
    """SIGINT or SIGTERM mid-run: one line with the --resume command, exit 130 or 143; that
    command finishes."""
    a, b, c = (f"{tmp_path / 'i.h5'}:/{x}" for x in "ABC")
    n = 1600  # about 3 s at --memory 150KB on 2 cores: long enough to interrupt mid-run
    for spec, seed in ((a, 1), (b, 2)):
        assert _bigmm("generate", spec, "--shape", n, n, "--seed", seed).returncode == 0
    argv = ["multiply", a, b, "-o", c, "--memory", "150KB", "--backend", "numpy"]
    if sig == signal.SIGTERM:  # and a script reading --json gets the interruption on stdout
        argv.append("--json")
    proc = subprocess.Popen([sys.executable, "-m", "bigmm", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    journal = None
    while time.time() < deadline and proc.poll() is None:
        found = [p for p in os.listdir(tmp_path) if p.endswith(".bigmm-journal")]
        if found and '"tiles"' in (tmp_path / found[0]).read_text():  # a tile is done
            journal = found[0]
            break
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.skip("the run finished before it could be interrupted")
    assert journal is not None
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    if sig == signal.SIGTERM:
        s = json.loads(out)
        assert s["ok"] is False and s["exit_code"] == status and s["resumable"] is True
        assert s["output"] == c and s["error"].startswith("interrupted")
        assert s["error_type"] == "Interrupted"  # bigmm.errors.Interrupted: the run's
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("bigmm: ") or
             "error" in ln]  # progress lines aside (stderr is not a terminal)
    assert len(lines) == 1 and "resumable" in lines[0] and "Traceback" not in err
    command = lines[0].split("resumable: ", 1)[-1]
    assert command.startswith("bigmm multiply") and command.endswith("--resume")
    p = _bigmm("verify", a, b, c)
    assert p.returncode == 2 and "incomplete" in p.stderr and p.stderr.count("\n") == 1
    p = _bigmm(*shlex.split(command)[1:])
    assert p.returncode == 0, p.stderr
    assert _bigmm("verify", a, b, c).returncode == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])  # half: in-core C float32
def test_bench_reports_both_timings(tmp_path, capsys, dtype):
    rc, out, err = run(capsys, "bench", "--size", 97, "--backend", "numpy", "--dir", tmp_path,
                       "--dtype", dtype, "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["ok"] is True and r["verified"] is True and r["backend"] == "numpy" and r["n"] == 97
    assert r["bigmm_seconds"] > 0 and r["in_core_seconds"] > 0 and r["ratio_to_in_core"] > 0


def test_beta_and_transposes_roundtrip(tmp_path, capsys):
    """C = 0.5 * A^T @ B^T - 2 * C; the old C is regenerated from its seed for verify."""
    f = tmp_path / "t.h5"
    a, b, c, c0 = (f"{f}:/{x}" for x in ("A", "B", "C", "C0"))
    for spec, shape, seed in ((a, (K, M), 1), (b, (N, K), 2), (c, (M, N), 3), (c0, (M, N), 3)):
        assert run(capsys, "generate", spec, "--shape", *shape, "--seed", seed,
                   "--dtype", "float64")[0] == 0
    rc, out, err = run(capsys, "multiply", a, b, "-o", c, "--alpha", 0.5, "--beta", -2,
                       "--trans-a", "--trans-b", "--memory", BUDGET, "--backend", "numpy")
    assert rc == 0, err
    rc, out, err = run(capsys, "verify", a, b, c, "--alpha", 0.5, "--beta", -2, "--c0", c0,
                       "--trans-a", "--trans-b")
    assert rc == 0 and "PASSED" in out, out + err
    rc, out, err = run(capsys, "verify", a, b, c, "--alpha", 0.5, "--trans-a", "--trans-b")
    assert rc == 1 and "FAILED" in out  # without the beta term the check must fail


def test_hints_name_the_flags(tmp_path, capsys, operands):
    a, b, _, _ = operands
    c = f"{tmp_path / 'c.h5'}:/C"
    assert run(capsys, "multiply", a, b, "-o", c, "--backend", "numpy", "--quiet")[0] == 0
    rc, _, err = run(capsys, "multiply", a, b, "-o", c, "--backend", "numpy")
    assert rc == 2 and "--overwrite" in err and "=True" not in err, err


def test_generate_does_what_its_options_say(tmp_path, capsys):
    spec = f"{tmp_path / 'g.h5'}:/A"
    rc, out, _ = run(capsys, "generate", spec, "--shape", 300, 200, "--compression", "gzip")
    assert rc == 0 and "gzip, chunks 300 x 200" in out, out
    with h5py.File(tmp_path / "g.h5", "r") as f:
        assert f["A"].compression == "gzip" and f["A"].chunks == (300, 200)
    rc, _, err = run(capsys, "generate", spec, "--shape", 300, 200, "--layout", "contiguous",
                     "--compression", "gzip", "--overwrite")
    assert rc == 2 and "compression only with the compressed layout" in err, err


@pytest.mark.skipif(__import__("importlib").util.find_spec("matplotlib") is not None,
                    reason="matplotlib is installed: the PNG is written")
def test_profile_without_matplotlib_says_so(tmp_path, capsys, operands):
    a, b, _, _ = operands
    rc, out, err = run(capsys, "multiply", a, b, "-o", f"{tmp_path / 'c.h5'}:/C", "--backend",
                       "numpy", "--profile", tmp_path / "prof")
    assert rc == 0 and "no timeline PNG" in err and "matplotlib" in err, err
    assert (tmp_path / "prof.trace.json").exists() and not (tmp_path / "prof.png").exists()


@pytest.mark.parametrize("delay", [0.05, 0.15, 0.3, 0.6])
def test_ctrl_c_while_starting_prints_no_traceback(tmp_path, delay):
    # SIGINT while Python loads bigmm, opens the inputs and plans: one line, exit 130
    a, b = (f"{tmp_path / 's.h5'}:/{x}" for x in "AB")
    for spec, seed in ((a, 1), (b, 2)):
        assert _bigmm("generate", spec, "--shape", 300, 300, "--seed", seed).returncode == 0
    for _ in range(3):  # a signal before any of bigmm ran (Python still starting, on a
        # loaded machine: its traceback names no file of bigmm's, or it came before Python's
        # own handler, and the signal ended the process silently) is retried
        proc = subprocess.Popen([sys.executable, "-m", "bigmm", "multiply", a, b, "-o",
                                 f"{tmp_path / 'c.h5'}:/C", "--backend", "numpy"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        frames = [line for line in err.splitlines() if line.strip().startswith("File ")]
        before_python = proc.returncode == -signal.SIGINT and not err.strip()
        if not (before_python or (frames and not any(f"{os.sep}bigmm{os.sep}" in f
                                                     for f in frames))):
            break
    else:
        pytest.skip("Python was still starting at every try (a loaded machine)")
    assert "Traceback" not in err, err
    assert proc.returncode in (0, 130), err  # 0: it had finished
    if proc.returncode == 130:
        assert err.strip().splitlines()[-1].startswith("bigmm: error: interrupted"), err


def test_a_second_ctrl_c_still_exits_130(tmp_path):
    a, b = (f"{tmp_path / 'd.h5'}:/{x}" for x in "AB")
    for spec, seed in ((a, 1), (b, 2)):
        assert _bigmm("generate", spec, "--shape", 1200, 1200, "--seed", seed).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "bigmm", "multiply", a, b, "-o",
                             f"{tmp_path / 'c.h5'}:/C", "--backend", "numpy", "--memory",
                             "200KB"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not list(tmp_path.glob("*.bigmm-journal")):
        time.sleep(0.02)
    for _ in range(2):  # twice, 30 ms apart: the second lands while the first is handled
        proc.send_signal(signal.SIGINT)
        time.sleep(0.03)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err


def test_plan_and_multiply_note_a_budget_that_slows_the_plan_down(tmp_path, capsys,
                                                                  monkeypatch):
    from bigmm import advice

    monkeypatch.setattr(advice, "NOTE_SECONDS", 0.1)  # a small job: a tenth of a second matters
    a, b = f"{tmp_path / 'ab.h5'}:/A", f"{tmp_path / 'ab.h5'}:/B"
    for spec, shape, seed in ((a, (1000, 1200), 1), (b, (1200, 900), 2)):
        assert run(capsys, "generate", spec, "--shape", *shape, "--chunks", 128, 128,
                   "--seed", seed)[0] == 0
    for argv in (("plan", a, b), ("multiply", a, b, "-o", f"{tmp_path / 'c.h5'}:/C")):
        rc, out, err = run(capsys, *argv, "--memory", "128KiB", "--backend", "numpy")
        assert rc == 0, err
        notes = [ln for ln in err.splitlines() if ln.startswith("bigmm: note:")]
        assert len(notes) == 1, err
        assert re.match(r"bigmm: note: --memory 128KiB makes this plan about \d+x slower .*; "
                        r"--memory \d+[KMG]iB is predicted to take", notes[0]), notes[0]
    rc, out, err = run(capsys, "plan", a, b, "--backend", "numpy")  # default budgets
    assert rc == 0 and "note" not in err


def test_verify_help_gives_the_check_defaults(capsys):
    from bigmm.verify import EXACT_LIMIT, PROBES, SAMPLES

    rc, out, _ = run(capsys, "verify", "--help")
    text = " ".join(out.split())
    assert rc == 0
    for flag, value in (("--samples", SAMPLES), ("--probes", PROBES),
                        ("--exact-limit", EXACT_LIMIT)):
        assert re.search(rf"{flag} \S+ [^-]*\(default: {value}\)", text), (flag, text)


#: ``bigmm ARGS`` (the command's entry point) that sends itself real signals at chosen calls:
#: argv[1] lists "module:Owner.function:signal" (a signal before each first call) or
#: "module:Owner.function:signal:after" (once that call returned), ";"-separated.
SIGNAL_AT = """
import importlib, os, signal, sys, time
for point in filter(None, sys.argv[1].split(";")):
    mod, path, sig, *when = point.split(":")
    owner, name = importlib.import_module(mod), path.split(".")
    for part in name[:-1]:
        owner = getattr(owner, part)
    raw = owner.__dict__[name[-1]] if isinstance(owner, type) else getattr(owner, name[-1])
    wrap = type(raw) if isinstance(raw, (staticmethod, classmethod)) else (lambda f: f)
    func, fired = getattr(raw, "__func__", raw), []
    def f(*args, _func=func, _sig=getattr(signal, sig), _fired=fired, _after=when == ["after"],
          **kwargs):
        result = _func(*args, **kwargs) if _after else None
        if not _fired:
            _fired.append(True)
            os.kill(os.getpid(), _sig)
            time.sleep(0.05)  # the handler runs here, in the main thread
        return result if _after else _func(*args, **kwargs)
    setattr(owner, name[-1], wrap(f))
sys.argv = ["bigmm", *sys.argv[2:]]
from bigmm._command import run
sys.exit(run())
"""


def _signalled(points: str, *argv, cwd):
    return subprocess.run([sys.executable, "-c", SIGNAL_AT, points, *map(str, argv)],
                          capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))


@pytest.mark.parametrize("sig, status, flags", [
    ("SIGINT", 130, ["--overwrite"]),             # Ctrl-C while the output is opened
    ("SIGTERM", 143, ["--overwrite", "--json"]),  # a scheduler's stop, a script reading JSON
])
def test_interrupted_before_the_journal_gives_the_command_that_runs_again(tmp_path, capsys,
                                                                          sig, status, flags):
    # C of another job (alpha 2) is there to be overwritten; a signal before the run wrote its
    # journal changed nothing: "--resume" would be refused (another job), the command is right
    a, b, c = (f"{tmp_path / 'm.h5'}:/{x}" for x in "ABC")
    for spec, shape, seed in ((a, (40, 30), 1), (b, (30, 20), 2)):
        assert run(capsys, "generate", spec, "--shape", *shape, "--seed", seed)[0] == 0
    common = ["multiply", a, b, "-o", c, "--memory", "20KB", "--backend", "numpy", "--quiet"]
    assert run(capsys, *common, "--alpha", 2)[0] == 0
    p = _signalled(f"bigmm.io.journal:Journal.create:{sig}", *common, *flags, cwd=tmp_path)
    assert p.returncode == status and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1 and "--resume" not in p.stderr, p.stderr
    line = p.stderr.strip()
    assert line.startswith(f"bigmm: error: interrupted before anything was written to {c}")
    if "--json" in flags:
        s = json.loads(p.stdout)
        assert s["ok"] is False and s["error"] == line[len("bigmm: error: "):]
        assert s["exit_code"] == status and "resumable" not in s
    again = shlex.split(line.split("run it again: ", 1)[1])
    assert again[0] == "bigmm" and run(capsys, *again[1:])[0] == 0
    assert run(capsys, "verify", a, b, c)[0] == 0


def _signal_case(tmp_path, capsys, command: str) -> list:
    """Small operands in ``tmp_path``; the argv of ``command`` on them (``verify``: of a C that
    is not their product)."""
    a, b, c = (f"{tmp_path / 'm.h5'}:/{x}" for x in "ABC")
    for spec, shape, seed in ((a, (40, 30), 1), (b, (30, 20), 2)):
        assert run(capsys, "generate", spec, "--shape", *shape, "--seed", seed)[0] == 0
    if command == "verify":
        assert run(capsys, "generate", c, "--shape", 40, 20, "--seed", 3)[0] == 0
        return ["verify", a, b, c]
    return ["multiply", a, b, "-o", c, "--memory", "20KB", "--backend", "numpy", "--quiet"]


@pytest.mark.parametrize("command, status", [("multiply", 0),  # done
                                             ("verify", 1)])   # a product that fails
def test_sigterm_while_threads_are_joined_at_exit_ends_with_the_status(tmp_path, capsys,
                                                                       command, status):
    # the command has returned: a scheduler's stop as Python joins threads ends the process
    # with the command's status, not by the signal
    argv = _signal_case(tmp_path, capsys, command)
    p = _signalled("threading:_shutdown:SIGTERM", *argv, "--json", cwd=tmp_path)
    assert p.returncode == status, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and "interrupted" not in p.stderr, p.stderr
    assert json.loads(p.stdout)["ok"] is (status == 0)
    if command == "multiply":
        assert run(capsys, "verify", *argv[1:3], argv[4])[0] == 0


@pytest.mark.parametrize("command, sig, status", [
    ("multiply", "SIGTERM", 0),  # a scheduler's stop as the command ends: C is complete
    ("multiply", "SIGINT", 0),
    ("verify", "SIGTERM", 1),    # a product that fails: its answer's status
])
def test_a_signal_after_the_json_answer_keeps_its_status(tmp_path, capsys, command, sig,
                                                         status):
    argv = _signal_case(tmp_path, capsys, command)
    p = _signalled(f"bigmm.cli._common:print_json:{sig}:after", *argv, "--json",
                   cwd=tmp_path)
    assert p.returncode == status, (p.returncode, p.stderr)
    s = json.loads(p.stdout)  # the one answer
    assert s["ok"] is (status == 0) and s.get("exit_code", 0) == status
    assert "Traceback" not in p.stderr and "interrupted" not in p.stderr, p.stderr
    if command == "multiply":
        assert run(capsys, "verify", *argv[1:3], argv[4])[0] == 0


@pytest.mark.parametrize("name", ["g.h5:/C", "g.zarr:/C"])  # HDF5 and Zarr
def test_verify_of_a_killed_generate_says_to_generate_again(tmp_path, capsys, name):
    # generate killed before its first block: C is marked incomplete, and no run can resume it
    a, b, c = f"{tmp_path / 'm.h5'}:/A", f"{tmp_path / 'm.h5'}:/B", f"{tmp_path / name}"
    for spec, shape, seed in ((a, (40, 30), 1), (b, (30, 20), 2)):
        assert run(capsys, "generate", spec, "--shape", *shape, "--seed", seed)[0] == 0
    p = _signalled("bigmm.io.generate:_draw:SIGKILL", "generate", c, "--shape", 40, 20,
                   cwd=tmp_path)
    assert p.returncode == -signal.SIGKILL
    rc, out, err = run(capsys, "verify", a, b, c)
    assert rc == 2 and err.count("\n") == 1 and "incomplete" in err, err
    assert "--resume" not in err and "run generate again with --overwrite" in err, err
    assert run(capsys, "generate", c, "--shape", 40, 20, "--overwrite")[0] == 0
    # a multiply's output interrupted keeps its advice: resume it
    def stop(p):
        raise KeyboardInterrupt

    import bigmm
    with pytest.raises(errors.Interrupted):
        bigmm.matmul(a, b, c, memory="20KB", backend="numpy", overwrite=True, progress=stop)
    rc, out, err = run(capsys, "verify", a, b, c)
    assert rc == 2 and "continue it with --resume" in err, err


# Each case: argv after "multiply" ({a}, {b}, {t} as in ERROR_CASES) and what the error says.
BEFORE_THE_CLUSTER = [
    (["{a}", "{b}", "-o", "{t}/c.h5:/C", "--workers", "100000"],              # far too many
     "Expected --workers as a positive integer, at most "),
    (["{a}", "{b}", "-o", "{t}/c.h5:/C", "--workers", "-1"],                  # negative
     "Expected --workers as a positive integer"),
    (["{t}/nope.h5:/A", "{b}", "-o", "{t}/c.h5:/C", "--workers", "1"], "nope.h5"),  # no input
    (["{a}", "{a}", "-o", "{t}/c.h5:/C", "--workers", "1"], "inner dimensions"),  # shapes
    (["{a}", "{b}", "-o", "{t}/old.h5:/C", "--workers", "1"],                 # C exists
     "pass --overwrite to replace it"),
    (["{a}", "{b}", "-o", "{t}/old.h5:/D", "--workers", "1"],                 # a dangling link
     "pass --overwrite to replace it"),
    (["{a}", "{b}", "-o", "{t}/old.zarr", "--workers", "1"],                  # a Zarr C exists
     "Expected no existing output at"),
    (["{a}", "{b}", "-o", "{a}", "--overwrite", "--workers", "1"], "other than the inputs"),
]


def test_workers_with_an_interrupted_runs_journal_say_resume_before_the_cluster(
        tmp_path, capsys, operands, monkeypatch):
    pytest.importorskip("distributed")
    import bigmm
    import bigmm.dask

    a, b, _, _ = operands
    c = f"{tmp_path / 'c.h5'}:/C"

    def stop(p):
        raise KeyboardInterrupt

    with pytest.raises(errors.Interrupted):
        bigmm.matmul(a, b, c, memory="100KB", backend="numpy", progress=stop)

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(bigmm.dask, "local_cluster", no_cluster)
    rc, out, err = run(capsys, "multiply", a, b, "-o", c, "--workers", "1", "--backend", "numpy")
    assert rc == 2 and err.count("\n") == 1, err
    assert "an interrupted run's journal exists; pass --resume to continue it" in err, err


@pytest.mark.parametrize("argv, word", BEFORE_THE_CLUSTER)
def test_workers_refused_before_the_cluster_starts(tmp_path, capsys, operands, monkeypatch,
                                                  argv, word):
    pytest.importorskip("distributed")
    import bigmm.dask

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(bigmm.dask, "local_cluster", no_cluster)
    a, b, _, _ = operands
    with h5py.File(tmp_path / "old.h5", "w") as f:
        f["C"] = np.zeros((M, N), np.float32)
        f["D"] = h5py.SoftLink("/nothing")
    assert run(capsys, "generate", f"{tmp_path / 'old.zarr'}", "--shape", M, N)[0] == 0
    rc, out, err = run(capsys, "multiply", *[w.format(a=a, b=b, t=tmp_path) for w in argv],
                       "--backend", "numpy")
    assert rc == 2 and err.count("\n") == 1 and word in err, err
    if "--workers" in word:
        assert f"Got {argv[-1]}." in err
    assert not (tmp_path / "c.h5").exists()
