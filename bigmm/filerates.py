"""The read and write rates of a job's files, for its predicted time.

An input file's bytes that the page cache holds (sampled:
:func:`bigmm.io.pagecache.cached_share`) are read at the rate cached reads of its layout ran at
in earlier runs, the rest at the rate earlier runs read its disk at; C is written at its
disk's write rate. Until a run has shown one, a rate is the nominal one (READ_RATE,
WRITE_RATE, CACHED_READ_RATE). A run shows a rate where its reads or writes were clearly of one
kind (:func:`learn`) and keeps it as a calibration figure (:mod:`bigmm.calibration`: this
machine, this boot), the mean of the rate kept before and the run's: reads of at least
LEARN_BYTES from inputs at most CLEAR uncached and of one layout (the cached rate of that
layout: mapped copies of HDF5 chunks and reads of Zarr's chunk files differ) or at most CLEAR
cached and on one disk (that disk's read rate, which then counts the job's own writes to it
when C is there too); writes of at least LEARN_BYTES while the inputs were cached or on other
disks (the disk's write rate). Compressed inputs teach nothing (their readers' time is mostly
decoding).

The plan is chosen with the nominal rates, so that its tiles do not depend on what the cache
holds (a resumed run plans the same tiles); its predicted time uses these.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import calibration, io
from .io import pagecache
from .planner import READ_RATE, WRITE_RATE
from .planner.search import CACHED_READ_RATE
from .runstats import RunStats

#: Bytes a run must read (write) to show a rate.
LEARN_BYTES = 1 << 30
#: Inputs count as cached where at most this share of their bytes is not, as not cached where
#: at most this share is.
CLEAR = 0.1
#: Calibration figures: a disk's read and write rates (by device), and cached reads'.
READ_FIGURE, WRITE_FIGURE, CACHED_KEY = "disk-read", "disk-write", "page-cache"


@dataclass(frozen=True)
class Input:
    """A file input as a job starts: its disk, the share of its bytes cached (None: not
    known), whether its chunks are decoded, its layout (``Source.layout``)."""

    device: str | None
    cached: float | None
    decoded: bool
    layout: str = ""


@dataclass(frozen=True)
class Files:
    """A job's files as it starts: its file inputs by operand ("A", "B"), and the disk of
    C's storage (None: C is an array)."""

    inputs: dict
    output: str | None

    def read_rate(self, op: str) -> float:
        """Bytes per second operand ``op`` is read at: its cached share at the cached rate,
        the rest at its disk's (READ_RATE where not a file this knows of)."""
        f = self.inputs.get(op)
        if f is None:
            return READ_RATE
        disk = _kept(READ_FIGURE, f.device) or READ_RATE
        share = 0.0 if f.cached is None else f.cached
        cached = _kept(READ_FIGURE, _cached_key(f.layout)) or CACHED_READ_RATE
        return 1.0 / (share / cached + (1.0 - share) / disk)

    def write_rate(self) -> float:
        """Bytes per second C is written at on its disk (WRITE_RATE until a run showed it)."""
        return _kept(WRITE_FIGURE, self.output) or WRITE_RATE

    def describe(self) -> str:
        """What the predicted time takes the files to be, in a line: each input's share in
        the page cache, the rates it is read at from the disk and from the cache and C is
        written at, and whether earlier runs showed them or they are nominal; "" where no
        file is known."""
        known = {op: f for op, f in sorted(self.inputs.items()) if f.cached is not None}
        wanted = [("disk reads", READ_FIGURE, f.device, READ_RATE)
                  for f in known.values() if f.cached < 1]
        wanted += [("cached reads", READ_FIGURE, _cached_key(f.layout), CACHED_READ_RATE)
                   for f in known.values() if f.cached > 0]
        if self.output is not None:
            wanted.append(("C writes", WRITE_FIGURE, self.output, WRITE_RATE))
        rates: dict = {}  # (name, rate) -> whether a run showed it
        for name, kind, key, nominal in wanted:
            value = _kept(kind, key)
            rates[(name, value or nominal)] = value is not None
        mixed = len(set(rates.values())) > 1
        said = [f"{name} {rate / 1e9:.1f} GB/s" + (" (nominal)" if mixed and not shown else "")
                for (name, rate), shown in rates.items()]
        if said and not mixed:
            said[-1] += (" (as earlier runs showed)" if all(rates.values())
                         else " (nominal: no run has shown them)")
        parts = ([", ".join(f"{op} {f.cached:.0%}" for op, f in known.items()) + " cached"]
                 if known else [])
        return "; ".join(parts + ([", ".join(said)] if said else []))


def look(A, B, out) -> Files:
    """What the page cache holds of the inputs ``A`` and ``B`` (opened Sources) and which
    disks they and the output ``out`` (as the API takes it) are on."""
    inputs = {}
    for op, src in (("A", A), ("B", B)):
        try:
            files = src.stored_files()
        except OSError:  # (the run's reads will say what is wrong with the file)
            continue
        if files:
            inputs[op] = Input(pagecache.device(files[0][0]), pagecache.cached_share(files),
                               bool(src.decode_bytes), src.layout)
    spec, _label = io.output_spec(out)
    return Files(inputs, pagecache.device(spec.path) if spec is not None else None)


def learn(files: Files, run: RunStats, staged: str = "AB", reads_c: bool = False) -> list[str]:
    """Keep the rates ``run`` showed (see the module docstring) for the files ``files`` had
    as it started (``staged``: the operands the host read; ``reads_c``: it read the old C
    too, whose reads then teach nothing); the figures kept, by name."""
    kept = []
    ins = [f for op, f in files.inputs.items() if op in staged]
    readable = (ins and not reads_c and len(ins) == len([op for op in staged if op in "AB"])
                and not any(f.decoded or f.cached is None for f in ins))
    if readable and run.bytes_read >= LEARN_BYTES and run.read_busy > 0:
        rate = run.bytes_read / run.read_busy
        if all(f.cached >= 1 - CLEAR for f in ins) and len({f.layout for f in ins}) == 1:
            kept += _keep(READ_FIGURE, _cached_key(ins[0].layout), rate)
        elif all(f.cached <= CLEAR for f in ins) and len({f.device for f in ins}) == 1 \
                and ins[0].device is not None:
            kept += _keep(READ_FIGURE, ins[0].device, rate)
    quiet = all(f.cached is not None and (f.cached >= 1 - CLEAR or f.device != files.output)
                for f in files.inputs.values())
    if (files.output is not None and quiet and run.bytes_written >= LEARN_BYTES
            and run.write_busy > 0):
        kept += _keep(WRITE_FIGURE, files.output, run.bytes_written / run.write_busy)
    return kept


def _kept(kind: str, key: str | None) -> float | None:
    if key is None:
        return None
    value = calibration.recall(kind, key)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _cached_key(layout: str) -> str:
    return f"{CACHED_KEY} {layout}" if layout else CACHED_KEY


def _keep(kind: str, key: str, rate: float) -> list[str]:
    """Keep the mean of the rate kept before (if any) and ``rate``; the figure's name."""
    before = _kept(kind, key)
    value = float(rate) if before is None else (before + float(rate)) / 2
    return [f"{kind}:{key}"] if calibration.keep(kind, key, value) else []
