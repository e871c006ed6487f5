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
  ``BIGMM_CALIBRATION=fresh`` (and ``bigmm calibrate``: :func:`measuring`) measures again
  and keeps what it measured (quiet or not: the user vouches for the machine);
  ``BIGMM_CACHE_DIR`` moves the store (default ``$XDG_CACHE_HOME/bigmm``, else
  ``~/.cache/bigmm``).

A process notes which figures it took from the store and which it measured (:func:`used`),
so that a plan can say how old the figures it was made with are.

Reading or writing the store never fails a run: a store that cannot be read is measured
afresh, one that cannot be written is left alone. Values are JSON (floats, lists, dicts).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from .units import format_seconds

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
_CODE_SUFFIXES = (".py", ".c", ".cu", ".cuh")


@dataclass(frozen=True)
class Figure:
    """One figure this process planned with: its kind and key, when it was measured (by an
    earlier process where ``kept``), and whether it is in the store for later processes."""

    kind: str
    key: object
    at: float
    kept: bool
    stored: bool


#: The figures this process took or measured, by name (the latest of each).
_USED: dict[str, Figure] = {}
#: The figures of each :func:`measuring` block open in this process.
_MEASURING: list[list[Figure]] = []
#: What drops the figures modules hold in this process (:func:`on_measuring`).
_DROPS: list[Callable[[], None]] = []


def mode() -> str:
    """"off", "fresh" or "reuse" (see the module docstring); "fresh" within :func:`measuring`
    unless the environment says "off"."""
    value = os.environ.get(MODE_ENV, "").strip().lower()
    if value != "off" and _MEASURING:
        return "fresh"
    return value if value in ("off", "fresh") else "reuse"


def on_measuring(drop: Callable[[], None]) -> None:
    """Call ``drop`` as a :func:`measuring` block starts: a module drops the figures it
    holds for the rest of the process, so that they are asked for (and measured) again."""
    _DROPS.append(drop)


@contextlib.contextmanager
def measuring() -> Iterator[list[Figure]]:
    """Within the block every figure asked for is measured again and kept, as with
    ``BIGMM_CALIBRATION=fresh`` (nothing is kept where the environment says "off"); the
    figures modules held in this process are dropped first (:func:`on_measuring`). Yields
    the list of the figures measured in the block, filled as they are."""
    for drop in _DROPS:
        drop()
    figures: list[Figure] = []
    _MEASURING.append(figures)
    try:
        yield figures
    finally:
        _MEASURING.pop()


def used() -> list[Figure]:
    """The figures this process took from the store or measured, oldest first."""
    return sorted(_USED.values(), key=lambda f: f.at)


def describe_use(figures: list[Figure], now: float | None = None) -> str | None:
    """How old ``figures`` are, in a few words (None where there are none)."""
    if not figures:
        return None
    now = time.time() if now is None else now
    kept = [f for f in figures if f.kept]
    if kept:
        age = format_seconds(now - min(f.at for f in kept))
        return (f"kept, the oldest measured {age} ago ({len(kept)} of {len(figures)} "
                f"figures; bigmm calibrate measures them again)")
    if all(f.stored for f in figures):
        return "measured now, kept for later jobs"
    if mode() == "off":
        return f"measured now, not kept ({MODE_ENV}=off)"
    return "measured now, not all kept (the machine was busy, or the store is not writable)"


def host_quiet() -> bool:
    """Whether the host's one-minute load is under BUSY_LOAD per core (False where it cannot
    be read)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return False
    return load < BUSY_LOAD * (os.cpu_count() or 1)


def remembered(kind: str, key, measure: Callable[[], object], *,
               quiet: Callable[[], bool] | None = None, encode=None, decode=None,
               limit: int | None = None):
    """The figure ``kind`` of ``key`` (JSON-able): kept from an earlier process where there
    is one, else ``measure()``, kept where ``quiet()`` (default :func:`host_quiet`) held
    before and after measuring. ``encode``/``decode`` turn the value into JSON and back (a
    decode that raises counts as no kept figure). ``limit``: the most figures of this kind
    kept (the newest)."""
    quiet = quiet or host_quiet
    how = mode()
    name = _name(kind, key)
    if how == "off":
        value = measure()
        _note(name, Figure(kind, key, time.time(), kept=False, stored=False))
        return value
    hit = kept().get(name) if how == "reuse" else None
    if hit is not None:
        at, stored_value = hit
        try:
            value = decode(stored_value) if decode else stored_value
        except Exception:  # a figure of another form: measured again
            pass
        else:
            _note(name, Figure(kind, key, at, kept=True, stored=True))
            return value
    calm = how == "fresh" or _asked(quiet)
    value = measure()
    stored = calm and (how == "fresh" or _asked(quiet)) and _write(
        name, encode(value) if encode else value, limit)
    _note(name, Figure(kind, key, time.time(), kept=False, stored=bool(stored)))
    return value


def recall(kind: str, key, note: bool = True):
    """The kept figure ``kind`` of ``key`` observed by an earlier run (:func:`keep`), or None
    (none kept, or ``BIGMM_CALIBRATION`` says "off"). ``note``: count it among the figures
    this process planned with (:func:`used`)."""
    if mode() == "off":
        return None
    name = _name(kind, key)
    hit = kept().get(name)
    if hit is None:
        return None
    if note:
        _note(name, Figure(kind, key, hit[0], kept=True, stored=True))
    return hit[1]


def keep(kind: str, key, value, limit: int | None = None) -> bool:
    """Keep ``value`` as the figure ``kind`` of ``key``: one a run observed of itself (a
    disk's rate), not measured for the purpose; nothing where the mode is "off". ``limit``:
    the most figures of this kind kept (the newest). Whether it was written."""
    if mode() == "off":
        return False
    return _write(_name(kind, key), value, limit)


def _name(kind: str, key) -> str:
    """A figure's name in the store: its kind and its key as JSON."""
    return f"{kind}:{json.dumps(key, sort_keys=True, default=str)}"


def _note(name: str, figure: Figure) -> None:
    _USED[name] = figure
    for block in _MEASURING:
        block.append(figure)


def _asked(quiet: Callable[[], bool]) -> bool:
    """``quiet()``, False where asking fails (a figure is then not kept; the run goes on)."""
    try:
        return bool(quiet())
    except Exception:
        return False


def forget() -> bool:
    """Drop this machine's kept figures (all of them); whether there were any."""
    try:
        os.unlink(store_path())
    except OSError:
        return False
    return True


def kept() -> dict[str, tuple[float, object]]:
    """The figures kept for this machine: name (kind and key) -> (when measured, value);
    expired ones and those of another form left out."""
    now = time.time()
    return {name: (float(entry["at"]), entry["value"]) for name, entry in _read().items()
            if _fresh(entry, now)}


def _fresh(entry, now: float) -> bool:
    """Whether a stored entry is a figure of this form measured within MAX_AGE."""
    try:
        at, whole = float(entry["at"]), "value" in entry
    except Exception:  # a figure of another form
        return False
    return whole and 0 <= now - at < MAX_AGE


def cache_dir() -> str:
    """bigmm's directory for what it keeps on this machine (``BIGMM_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/bigmm``, else ``~/.cache/bigmm``)."""
    return os.environ.get(DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "bigmm")


def store_path() -> str:
    """The file holding this machine's figures (for this boot, code and Python)."""
    return os.path.join(cache_dir(), f"calibration-{_machine()}.json")


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


def _write(name: str, value, limit: int | None = None) -> bool:
    """Add one figure to the store (replaced whole, atomically: a reader never sees half a
    file; of two processes writing at once, one's figure may be lost and measured again),
    the expired ones dropped and, with ``limit``, the oldest of its kind beyond that many;
    whether it was written."""
    path = store_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        now = time.time()
        entries = {k: v for k, v in _read().items() if _fresh(v, now)}
        entries[name] = {"at": now, "value": value}
        if limit:
            kind = name.partition(":")[0]
            same = sorted((k for k in entries if k.startswith(kind + ":")),
                          key=lambda k: entries[k]["at"])
            for k in same[:max(0, len(same) - limit)]:
                del entries[k]
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".calibration-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"entries": entries}, f)
            os.replace(tmp, path)
            return True
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except (OSError, TypeError, ValueError):  # read-only home, a value JSON cannot hold
        return False
