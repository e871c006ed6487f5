"""The kernel build check (tests/backends/test_kernel_build.py) compiles every CUDA kernel with
nvcc: minutes of CPU time. Where that test is selected and nvcc is found, scripts/check_kernels.py
starts as soon as collection ends, in the background and at the lowest CPU priority (nice 19),
so that it uses the cores the other tests leave idle, and the test runs last and waits for it.
The test then judges that one run's exit status and report, as it would a run of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_kernels.py"
TEST = "test_kernel_build.py::test_every_kernel_compiles_without_spills"
#: The child puts itself in a process group of its own (so that the nvcc processes it starts can
#: be ended with it) and lowers its priority; it stays in pytest's session, where a priority
#: counts against the other tests' processes.
_LOW_PRIORITY = ("import os, runpy, sys; os.setpgid(0, 0); os.nice(19); "
                 "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
_KEY = pytest.StashKey[dict]()


def _is_build_test(item) -> bool:
    return item.nodeid.replace(os.sep, "/").endswith(TEST)


@pytest.hookimpl(trylast=True)  # after deselection (-k, -m): only a test that will run moves
def pytest_collection_modifyitems(config, items):
    build = [item for item in items if _is_build_test(item)]
    if build:
        items[:] = [item for item in items if not _is_build_test(item)] + build


def pytest_collection_finish(session):
    if session.config.option.collectonly or not any(map(_is_build_test, session.items)):
        return
    sys.path.insert(0, str(SCRIPT.parent))
    import check_kernels

    if check_kernels.find_nvcc() is None:
        return
    out = tempfile.TemporaryFile(mode="w+")
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-c", _LOW_PRIORITY, str(SCRIPT)], stdout=out,
                            stderr=err, stdin=subprocess.DEVNULL, text=True, cwd=ROOT)
    session.config.stash[_KEY] = {"proc": proc, "out": out, "err": err}


@pytest.fixture
def kernel_check(request):
    """The background run's result: a function of a timeout that waits for the run to end and
    returns (exit status, stdout, stderr); None where no run was started."""
    run = request.config.stash.get(_KEY, None)
    if run is None:
        return None

    def result(timeout: float) -> tuple[int, str, str]:
        rc = run["proc"].wait(timeout=timeout)
        texts = []
        for f in (run["out"], run["err"]):
            f.seek(0)
            texts.append(f.read())
        return rc, texts[0], texts[1]
    return result


def pytest_unconfigure(config):
    run = config.stash.get(_KEY, None)
    if run is None:
        return
    proc = run["proc"]
    if proc.poll() is None:  # the session ended first (a failure with -x, Ctrl-C)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait()
    run["out"].close()
    run["err"].close()
