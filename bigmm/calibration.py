"""Calibrations kept between the processes of one machine.

A GPU run's planner times the machine before it plans (the backend's gemm and copies, the
host's copies, the issuing thread's costs): about a second that a CLI job pays every time.
Those figures are kept in a small store and reused by later processes, as FFTW keeps its
wisdom, where this code allows:

* a figure is kept only where the machine looked quiet while it was measured (the caller
  says: no other process holding GPU memory, the host's load under BUSY_LOAD of its cores), so
  that a measurement made beside another job does not mislead later ones;
* it is trusted for MAX_AGE, and only on this boot of the machine, with this bigmm code (its
  files' sizes and times, the CUDA kernels' sources with them) and this Python;
* ``BIGMM_CALIBRATION=off`` measures in every process and keeps nothing;
  ``BIGMM_CALIBRATION=fresh`` measures again and keeps what it measured (quiet or not: the
  user vouches for the machine); ``BIGMM_CACHE_DIR`` moves the store (default
  ``$XDG_CACHE_HOME/bigmm``, else ``~/.cache/bigmm``).

Reading or writing the store never fails a run: a store that cannot be read is measured
afresh, one that cannot be written is left alone. Values are JSON (floats, lists, dicts).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from typing import Callable

#: Environment variable: "off" (measure in every process, keep nothing) or "fresh" (measure
#: again and keep it); anything else: reuse kept figures.
MODE_ENV = "BIGMM_CALIBRATION"
#: Environment variable naming the store's directory.
DIR_ENV = "BIGMM_CACHE_DIR"
#: Seconds a kept figure is trusted.
MAX_AGE = 7 * 24 * 3600
#: The host counts as busy from this one-minute load per core.
BUSY_LOAD = 0.25
#: Files of the package whose sizes and times identify its code.
_CODE_SUFFIXES = (".py", ".cu", ".cuh")


def mode() -> str:
    """"off", "fresh" or "reuse" (see the module docstring)."""
    value = os.environ.get(MODE_ENV, "").strip().lower()
    return value if value in ("off", "fresh") else "reuse"


def host_quiet() -> bool:
    """Whether the host's one-minute load is under BUSY_LOAD per core (False where it cannot
    be read)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return False
    return load < BUSY_LOAD * (os.cpu_count() or 1)


def remembered(kind: str, key, measure: Callable[[], object], *,
               quiet: Callable[[], bool] | None = None, encode=None, decode=None):
    """The figure ``kind`` of ``key`` (JSON-able): kept from an earlier process where there
    is one, else ``measure()``, kept where ``quiet()`` (default :func:`host_quiet`) held
    before and after measuring. ``encode``/``decode`` turn the value into JSON and back (a
    decode that raises counts as no kept figure)."""
    quiet = quiet or host_quiet
    how = mode()
    if how == "off":
        return measure()
    name = f"{kind}:{json.dumps(key, sort_keys=True, default=str)}"
    if how == "reuse":
        entry = _read().get(name)
        try:
            if 0 <= time.time() - float(entry["at"]) < MAX_AGE:
                return decode(entry["value"]) if decode else entry["value"]
        except Exception:  # none, or a figure of another form: measured again
            pass
    calm = how == "fresh" or _asked(quiet)
    value = measure()
    if calm and (how == "fresh" or _asked(quiet)):
        _write(name, encode(value) if encode else value)
    return value


def _asked(quiet: Callable[[], bool]) -> bool:
    """``quiet()``, False where asking fails (a figure is then not kept; the run goes on)."""
    try:
        return bool(quiet())
    except Exception:
        return False


def forget() -> None:
    """Drop this machine's kept figures (all of them)."""
    try:
        os.unlink(store_path())
    except OSError:
        pass


def store_path() -> str:
    """The file holding this machine's figures (for this boot, code and Python)."""
    folder = os.environ.get(DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "bigmm")
    return os.path.join(folder, f"calibration-{_machine()}.json")


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    facts = [_boot_id(), platform.node(), sys.version, os.cpu_count(),
             code_facts(os.path.dirname(os.path.abspath(__file__)))]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:  # no boot id: the boot time, where known
        try:
            import psutil  # noqa: PLC0415

            return str(int(psutil.boot_time()))
        except Exception:
            return "unknown"


def code_facts(package: str) -> list:
    """(path, size, time) of the code files under the package's folder ``package`` and of
    the CUDA sources beside it (a source tree's top-level ``kernels/``; an installed package
    holds them inside)."""
    top = os.path.dirname(package)
    facts = []
    for root in (package, os.path.join(top, "kernels")):
        for here, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            for name in sorted(files):
                if name.endswith(_CODE_SUFFIXES):
                    path = os.path.join(here, name)
                    st = os.stat(path)
                    facts.append([os.path.relpath(path, top), st.st_size, st.st_mtime_ns])
    return facts


def _read() -> dict:
    try:
        with open(store_path()) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return entries if isinstance(entries, dict) else {}


def _write(name: str, value) -> None:
    """Add one figure to the store (replaced whole, atomically: a reader never sees half a
    file; of two processes writing at once, one's figure may be lost and measured again)."""
    path = store_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        entries = _read()
        entries[name] = {"at": time.time(), "value": value}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".calibration-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"entries": entries}, f)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except (OSError, TypeError, ValueError):  # read-only home, a value JSON cannot hold
        pass
