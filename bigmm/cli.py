"""The ``bigmm`` command: multiply | plan | generate | verify | demo | bench.

Every error a user can cause ends in one line on stderr (``bigmm: error: ...``) and exit status 2;
``--debug`` shows the traceback instead. ``verify`` exits 0 on pass and 1 on fail. An interrupted
``multiply`` prints the command that resumes it and exits 130.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import __version__
from .errors import BigmmError
from .units import format_bytes, format_seconds

EXIT_FAIL, EXIT_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED = 1, 2, 3, 130
STAGES = ("read", "copy_in", "compute", "copy_out", "write")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line, like every other error."""

    def error(self, message):
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ----- parser -------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    p = _Parser(prog="bigmm", parents=[common],
                description="Out-of-core matrix multiplication of HDF5 matrices.")
    p.add_argument("--version", action="version", version=f"bigmm {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    m = sub.add_parser("multiply", parents=[common], help="C = alpha*op(A)@op(B) + beta*C",
                       description="Multiply two HDF5 matrices out of core.")
    _operands(m)
    m.add_argument("-o", "--out", required=True, metavar="C", help="output spec file.h5:/C")
    _job_options(m)
    m.add_argument("--overwrite", action="store_true", help="replace an existing output")
    m.add_argument("--resume", action="store_true", help="continue an interrupted run")
    m.add_argument("--io-threads", type=int, default=None, help="disk I/O threads")
    m.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    m.add_argument("--verify", default=None, choices=("checksum",),
                   help="check every C tile with checksums and recompute a tile that fails")
    m.add_argument("-q", "--quiet", action="store_true", help="no summary (errors only)")
    m.add_argument("--profile", nargs="?", const=True, default=None, metavar="PREFIX",
                   help="time each stage; print its utilisation and write PREFIX.trace.json "
                        "(Perfetto) and PREFIX.png (default PREFIX: the output file + .profile)")
    m.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the tiles on the dask cluster at ADDRESS (tcp://host:8786)")
    m.add_argument("--workers", type=int, default=None, metavar="N",
                   help="run the tiles on a new local dask cluster of N workers "
                        "(one per GPU where GPUs are usable)")
    m.set_defaults(func=cmd_multiply)

    pl = sub.add_parser("plan", parents=[common], help="dry run: print the plan, write nothing",
                        description="Print the schedule and the predicted time; write nothing.")
    _operands(pl)
    pl.add_argument("-o", "--out", default=None, metavar="C", help="output spec (optional)")
    _job_options(pl)
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument("--verify", default=None, choices=("checksum",),
                    help="plan for a run with checksums (their time counts on a GPU)")
    pl.set_defaults(func=cmd_plan)

    g = sub.add_parser("generate", parents=[common], help="write a seeded random matrix",
                       description="Write a seeded standard-normal matrix to HDF5.")
    g.add_argument("spec", help="output spec file.h5:/A")
    g.add_argument("--shape", nargs=2, type=int, required=True, metavar=("M", "N"))
    g.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    g.add_argument("--layout", default="contiguous", choices=("contiguous", "chunked", "compressed"))
    g.add_argument("--chunks", nargs=2, type=int, default=None, metavar=("R", "C"))
    g.add_argument("--compression", default="gzip", choices=("gzip", "zstd", "lz4"))
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    g.set_defaults(func=cmd_generate)

    v = sub.add_parser("verify", parents=[common], help="check C against A@B (exit 0 pass, 1 fail)",
                       description="Check C = alpha*op(A)@op(B) + beta*C0 in float64. "
                                   "Exit 0: pass, 1: fail, 2: error.")
    _operands(v)
    v.add_argument("c", metavar="C", help="product spec file.h5:/C")
    v.add_argument("--alpha", type=float, default=1.0)
    v.add_argument("--beta", type=float, default=0.0)
    v.add_argument("--c0", default=None, help="C before the run (needed when beta != 0)")
    v.add_argument("--trans-a", action="store_true")
    v.add_argument("--trans-b", action="store_true")
    v.add_argument("--samples", type=int, default=None, help="rows checked in sampled mode")
    v.add_argument("--probes", type=int, default=None, help="Freivalds vectors in sampled mode")
    v.add_argument("--exact-limit", type=int, default=None,
                   help="largest M*N*K checked element by element")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_verify)

    d = sub.add_parser("demo", parents=[common], help="generate, multiply out of core, verify",
                       description="Generate A and B, multiply them under a small memory budget, "
                                   "verify the product and print the throughput.")
    d.add_argument("--size", type=int, default=3000, help="n for n x n operands (default 3000)")
    d.add_argument("--memory", default=None,
                   help="device budget (default: an eighth of the inputs' size)")
    d.add_argument("--backend", default="auto")
    d.add_argument("--dir", default=None, help="keep the files in this directory")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", parents=[common], help="time bigmm against an in-core gemm",
                       description="Time one out-of-core multiply (HDF5 to HDF5) against one "
                                   "in-core gemm of the same data on the same backend; the "
                                   "bigmm product is verified.")
    b.add_argument("--size", type=int, default=4000)
    b.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    b.add_argument("--memory", default=None, help="device budget (default: a quarter of the inputs)")
    b.add_argument("--backend", default="auto")
    b.add_argument("--kernel", default=None, choices=("bigmm", "cublas", "cublas-tf32"),
                   help="GPU tile products (as for multiply)")
    b.add_argument("--dir", default=None, help="directory for the operands (default: a temp dir)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench)
    return p


def _operands(p) -> None:
    p.add_argument("a", metavar="A", help="left operand spec file.h5:/A")
    p.add_argument("b", metavar="B", help="right operand spec file.h5:/B")


def _job_options(p) -> None:
    p.add_argument("--memory", default=None, help="device memory budget, e.g. 8GiB")
    p.add_argument("--host-memory", default=None, help="host staging budget, e.g. 16GiB")
    p.add_argument("--backend", default="auto", help="auto, numpy or cupy")
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--trans-a", action="store_true", help="use A transposed")
    p.add_argument("--trans-b", action="store_true", help="use B transposed")
    p.add_argument("--kernel", default=None, choices=("bigmm", "cublas", "cublas-tf32"),
                   help="GPU tile products: bigmm's kernel (default), cublas, or cublas-tf32 "
                        "(TF32 tensor cores)")


def _job_kwargs(args) -> dict:
    kwargs = dict(alpha=args.alpha, beta=args.beta, trans_a=args.trans_a, trans_b=args.trans_b,
                  memory=args.memory, host_memory=args.host_memory, backend=args.backend,
                  kernel=args.kernel)
    if getattr(args, "verify", None) is not None:
        kwargs["verify"] = args.verify
    return kwargs


# ----- entry point --------------------------------------------------------------------------

def main(argv=None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # a second Ctrl-C while the first one was being handled
        return EXIT_INTERRUPTED


def _main(argv) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version and usage errors
        return int(e.code or 0) if isinstance(e.code, int) else EXIT_ERROR
    args.argv = argv
    debug = getattr(args, "debug", False)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # stdout closed by its reader (`... --json | head -1`)
        _quiet_stdout()
        return 0
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        _err("interrupted")
        return EXIT_INTERRUPTED
    except (BigmmError, OSError, MemoryError) as e:
        if debug:
            traceback.print_exc()
        _err(_one_line(e))
        return EXIT_ERROR
    except Exception as e:  # a bug: still one line unless --debug
        if debug:
            traceback.print_exc()
        _err(f"internal error: {type(e).__name__}: {_one_line(e)} (run with --debug for details)")
        return EXIT_INTERNAL


def _err(message: str) -> None:
    print(f"bigmm: error: {message}", file=sys.stderr)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, OSError) and not isinstance(e, BigmmError) and e.filename:
        text = f"{e.strerror or text}: {e.filename}"
    return " ".join(text.split())


# ----- multiply and plan --------------------------------------------------------------------

def cmd_multiply(args) -> int:
    from . import api

    if args.scheduler is not None or args.workers is not None:
        if args.profile is not None:
            from .errors import OptionError

            raise OptionError("Expected --profile without --scheduler/--workers (it times the "
                              "stages of one process). Got both.")
        return _multiply_on_cluster(args)
    kwargs = _job_kwargs(args)
    plan = api.plan(args.a, args.b, args.out, resume=args.resume, **kwargs)
    prof = _new_profile() if args.profile is not None else None
    with _progress_bar(enabled=not args.quiet and sys.stderr.isatty()) as progress:
        try:
            out, stats = api.matmul(args.a, args.b, args.out, **kwargs, progress=progress,
                                    resume=args.resume, overwrite=args.overwrite,
                                    io_threads=args.io_threads, stats=True, profile=prof)
        except KeyboardInterrupt:
            progress.stop()
            _err(f"interrupted; {args.out} is resumable: {resume_command(args.argv)}")
            return EXIT_INTERRUPTED
    summary = run_summary(plan, stats, out, args.a, args.b, backend_name(args.backend))
    if prof is not None:
        files = prof.save(api.profile_prefix(args.profile, args.out))
        summary["profile"] = {"stages": prof.summary(), "device": prof.device, "files": files}
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not args.quiet:
        print(format_summary(summary))
        if prof is not None:
            print(prof.table())
            print("profile: " + ", ".join(summary["profile"]["files"].values()))
    return 0


def _multiply_on_cluster(args) -> int:
    """``multiply ... --scheduler ADDRESS | --workers N``: the job's tiles on a dask cluster."""
    from .dask import run_files

    kwargs = _job_kwargs(args)
    with _cluster_client(args.scheduler, args.workers, args.backend) as client, \
            _progress_bar(enabled=not args.quiet and sys.stderr.isatty()) as progress:
        try:
            out, plan, stats, backend = run_files(
                args.a, args.b, args.out, client=client, **kwargs, progress=progress,
                resume=args.resume, overwrite=args.overwrite, io_threads=args.io_threads)
        except KeyboardInterrupt:
            progress.stop()
            _err(f"interrupted; {args.out} is resumable: {resume_command(args.argv)}")
            return EXIT_INTERRUPTED
        workers = len(client.scheduler_info(n_workers=-1)["workers"])
    summary = run_summary(plan, stats, out, args.a, args.b, backend)
    summary["workers"] = workers
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not args.quiet:
        print(format_summary(summary) + f"\nworkers {workers}")
    return 0


@contextlib.contextmanager
def _cluster_client(scheduler: str | None, workers: int | None, backend: str):
    """A client of the cluster at ``scheduler``, or of a new local one of ``workers``."""
    from .dask import connect, local_cluster
    from .errors import OptionError

    if scheduler and workers:
        raise OptionError(f"Expected either --scheduler or --workers. Got both "
                          f"(--scheduler {scheduler} --workers {workers}).")
    if scheduler:
        with connect(scheduler) as client:
            yield client
    else:
        with local_cluster(workers, backend=backend) as client:
            yield client


def _new_profile():
    from .profile import Profile

    return Profile()


def resume_command(argv: list[str]) -> str:
    """The command line that resumes ``bigmm multiply argv`` (``--overwrite`` dropped)."""
    words = [w for w in argv if w not in ("--overwrite", "--resume")]
    return "bigmm " + shlex.join(words + ["--resume"])


def cmd_plan(args) -> int:
    from . import api

    plan = api.plan(args.a, args.b, args.out, **_job_kwargs(args))
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2, default=str))
    else:
        print(plan)
        if plan.predicted_seconds is None:
            print("predicted time  n/a (no rates for this backend)")
    return 0


def backend_name(requested: str) -> str:
    """The backend a run with ``--backend requested`` uses ("auto" resolved)."""
    return backend_info(requested)[0]


def backend_info(requested: str) -> tuple[str, str]:
    """(name, what it runs on) of the backend ``requested`` resolves to."""
    from .backends import get_backend

    be = get_backend(requested)
    try:
        describe = getattr(be, "describe", None)
        return be.name, (describe() if callable(describe) else f"CPU ({os.cpu_count()} cores)")
    finally:
        be.close()


def run_summary(plan, stats, out, a, b, backend: str | None = None) -> dict:
    """Machine-readable summary of a finished run (what ``--json`` prints)."""
    seconds = max(float(stats.seconds), 1e-12)
    moved = stats.bytes_read + stats.bytes_written
    stages = {}
    for name in STAGES:
        busy = getattr(stats, f"{name}_busy", None)
        if busy is not None:
            stages[name] = {"busy_seconds": float(busy), "utilisation": float(busy) / seconds}
    a_shape = (plan.k, plan.m) if plan.trans_a else (plan.m, plan.k)
    b_shape = (plan.n, plan.k) if plan.trans_b else (plan.k, plan.n)
    return {
        "a": str(a), "b": str(b), "out": str(out),
        "shape_a": list(a_shape), "shape_b": list(b_shape), "shape_c": [plan.m, plan.n],
        "dtype": plan.dtype, "backend": getattr(stats, "backend", None) or backend,
        "seconds": float(stats.seconds), "flops": int(stats.flops),
        "tflops": stats.flops / seconds / 1e12, "gbps": moved / seconds / 1e9,
        "bytes_read": int(stats.bytes_read), "bytes_written": int(stats.bytes_written),
        "tiles_done": int(stats.tiles_done), "tiles_skipped": int(stats.tiles_skipped),
        "tiles_total": plan.n_tiles, "tile": [plan.bm, plan.bn, plan.bk], "order": plan.order,
        "stages": stages,
        **checksum_summary(stats),
    }


def checksum_summary(stats) -> dict:
    """{"checksum": counts and mismatches} for a run that checked its tiles, else {}."""
    checked = int(getattr(stats, "tiles_checked", 0) or 0)
    if not checked:
        return {}
    return {"checksum": {"tiles_checked": checked,
                         "mismatches": int(stats.checksum_mismatches),
                         "tiles_recomputed": int(stats.tiles_recomputed),
                         "details": [str(m) for m in getattr(stats, "mismatches", ())]}}


def format_summary(s: dict) -> str:
    if s["tiles_done"] == 0 and s["tiles_skipped"] == s["tiles_total"] and not s["flops"]:
        return (f"{s['out']} is complete: an earlier run of the same job finished all "
                f"{s['tiles_total']} tiles (nothing computed)")
    lines = [
        f"wrote {s['out']}: C[{s['shape_c'][0]} x {s['shape_c'][1]}] {s['dtype']}"
        + (f" on {s['backend']}" if s["backend"] else ""),
        f"time {format_seconds(s['seconds'])}, {s['tflops']:.3f} TFLOP/s, {s['gbps']:.2f} GB/s "
        f"(read {format_bytes(s['bytes_read'])}, wrote {format_bytes(s['bytes_written'])})",
        f"tiles {s['tiles_done']} done, {s['tiles_skipped']} skipped of {s['tiles_total']}",
    ]
    if "checksum" in s:
        ck = s["checksum"]
        lines.append(f"checksum: {ck['tiles_checked']} tile checks, {ck['mismatches']} "
                     f"mismatches detected, {ck['tiles_recomputed']} tiles recomputed")
        lines += [f"  mismatch: {d}" for d in ck["details"]]
    if s["stages"]:
        lines.append("stages busy: " + ", ".join(
            f"{k} {format_seconds(v['busy_seconds'])} ({100 * v['utilisation']:.0f}%)"
            for k, v in s["stages"].items()))
    return "\n".join(lines)


class _progress_bar:
    """Context manager giving a progress callback: a rich bar on stderr, or a no-op."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._bar = None
        self._task = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._bar = Progress(TextColumn("multiply"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("tiles"), TimeElapsedColumn(), TextColumn("eta"),
                                 TimeRemainingColumn(), TextColumn("{task.fields[rates]}"),
                                 console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("multiply", total=None, rates="")
        return self

    def __call__(self, p) -> None:
        if self._bar is None:
            return
        t = max(float(p.elapsed), 1e-9)
        rates = (f"{p.flops_done / t / 1e12:.3f} TFLOP/s  "
                 f"{(p.bytes_read + p.bytes_written) / t / 1e9:.2f} GB/s")
        self._bar.update(self._task, completed=p.tiles_done, total=p.tiles_total, rates=rates)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __exit__(self, *exc):
        self.stop()
        return False


# ----- generate and verify ------------------------------------------------------------------

def cmd_generate(args) -> int:
    from .io.generate import generate

    t0 = time.perf_counter()
    spec = generate(args.spec, tuple(args.shape), dtype=args.dtype, layout=args.layout,
                    chunks=tuple(args.chunks) if args.chunks else None,
                    compression=args.compression, seed=args.seed, overwrite=args.overwrite)
    m, n = args.shape
    size = m * n * (4 if args.dtype == "float32" else 8)
    print(f"wrote {spec}: {m} x {n} {args.dtype}, {args.layout}, {format_bytes(size)}, "
          f"seed {args.seed}, in {format_seconds(time.perf_counter() - t0)}")
    return 0


def cmd_verify(args) -> int:
    from .verify import verify

    kwargs = {}
    for name in ("samples", "probes", "exact_limit"):
        if getattr(args, name) is not None:
            kwargs[name] = getattr(args, name)
    result = verify(args.a, args.b, args.c, alpha=args.alpha, beta=args.beta, c0=args.c0,
                    trans_a=args.trans_a, trans_b=args.trans_b, seed=args.seed, **kwargs)
    print(json.dumps(result.to_dict(), indent=2) if args.json else str(result))
    return 0 if result.passed else EXIT_FAIL


# ----- demo and bench -----------------------------------------------------------------------

def cmd_demo(args) -> int:
    from . import api
    from .io.generate import generate
    from .verify import verify

    n = _positive(args.size, "--size")
    with _workdir(args.dir) as d:
        a, b, c = (f"{d / 'demo.h5'}:/{x}" for x in "ABC")
        t0 = time.perf_counter()
        for spec, seed in ((a, 1), (b, 2)):
            generate(spec, (n, n), dtype="float32", seed=seed, overwrite=True)
        print(f"generated A and B: {n} x {n} float32 ({format_bytes(2 * 4 * n * n)}) in "
              f"{format_seconds(time.perf_counter() - t0)}")
        memory = args.memory or max(2 * 4 * n * n // 8, 1 << 20)
        plan = api.plan(a, b, memory=memory, backend=args.backend)
        print(plan, end="\n\n")
        with _progress_bar(enabled=sys.stderr.isatty()) as progress:
            out, stats = api.matmul(a, b, c, memory=memory, backend=args.backend,
                                    progress=progress, overwrite=True, stats=True)
        name, device = backend_info(args.backend)
        s = run_summary(plan, stats, out, a, b, name)
        print(format_summary(s))
        t0 = time.perf_counter()
        result = verify(a, b, c)
        print(f"verify: {result} in {format_seconds(time.perf_counter() - t0)}")
        where = f"files kept in {d}" if args.dir else "temporary files removed"
        print(f"demo {'passed' if result.passed else 'FAILED'}: "
              f"{s['tflops']:.3f} TFLOP/s, {s['gbps']:.2f} GB/s on {name}, {device}; {where}")
    return 0 if result.passed else EXIT_FAIL


def cmd_bench(args) -> int:
    from . import api
    from .io.generate import generate
    from .verify import verify

    n = _positive(args.size, "--size")
    w = 4 if args.dtype == "float32" else 8
    name = backend_name(args.backend)
    with _workdir(args.dir) as d:
        a, b, c = (f"{d / 'bench.h5'}:/{x}" for x in "ABC")
        for spec, seed in ((a, 1), (b, 2)):
            generate(spec, (n, n), dtype=args.dtype, seed=seed, overwrite=True)
        memory = args.memory or max(2 * w * n * n // 4, 1 << 20)
        out, stats = api.matmul(a, b, c, memory=memory, backend=name, overwrite=True,
                                stats=True, kernel=args.kernel)
        check = verify(a, b, c)
        t_core = in_core_seconds(a, b, name, args.kernel)
    flops = 2.0 * n ** 3
    result = {"n": n, "dtype": args.dtype, "memory": str(memory), "backend": name,
              "kernel": args.kernel,
              "verified": check.passed, "bigmm_seconds": stats.seconds,
              "bigmm_tflops": flops / stats.seconds / 1e12, "in_core_seconds": t_core,
              "in_core_tflops": flops / t_core / 1e12, "ratio_to_in_core": t_core / stats.seconds}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        budget = memory if isinstance(memory, str) else format_bytes(memory)
        print(f"n={n} {args.dtype}, budget {budget}, backend {name}, "
              f"product {'verified' if check.passed else 'WRONG'}")
        print(f"bigmm out of core (HDF5 to HDF5): {format_seconds(stats.seconds)}, "
              f"{result['bigmm_tflops']:.3f} TFLOP/s")
        print(f"in-core gemm, same backend:       {format_seconds(t_core)}, "
              f"{result['in_core_tflops']:.3f} TFLOP/s (operands already in its memory)")
        print(f"bigmm / in-core throughput: {result['ratio_to_in_core']:.2f}")
    return 0 if check.passed else EXIT_FAIL


def in_core_seconds(a: str, b: str, backend: str, kernel: str | None = None) -> float:
    """Seconds of one gemm of the whole operands in the backend's memory (after a warm-up)."""
    from .backends import get_backend
    from .io import open_input

    be = get_backend(backend, **({"kernel": kernel} if kernel else {}))
    try:
        views = []
        for spec in (a, b, None):
            src = open_input(spec) if spec else None
            shape = src.shape if src else (views[0][1].shape[0], views[1][1].shape[1])
            dtype = src.dtype if src else views[0][1].dtype
            host = be.view(be.host_buffer(shape[0] * shape[1], dtype), shape)
            dev = be.view(be.device_buffer(shape[0] * shape[1], dtype), shape)
            if src:
                src.read(0, shape[0], 0, shape[1], host)
                src.close()
            views.append((host, dev))
        stream = be.stream()
        for host, dev in views[:2]:
            be.copy_in(host, dev, stream)
        (_, da), (_, db), (_, dc) = views
        be.gemm(da, db, dc, 1.0, 0.0, False, False, stream)  # warm-up (and kernel compile)
        be.synchronize(be.record(stream))
        t0 = time.perf_counter()
        be.gemm(da, db, dc, 1.0, 0.0, False, False, stream)
        be.synchronize(be.record(stream))
        return time.perf_counter() - t0
    finally:
        be.close()


def _positive(v: int, name: str) -> int:
    from .errors import OptionError

    if v < 1:
        raise OptionError(f"Expected {name} to be a positive integer. Got {v}.")
    return v


class _workdir:
    """The given directory (created, kept) or a temporary one (removed)."""

    def __init__(self, path):
        self.path = path
        self._tmp = None

    def __enter__(self) -> Path:
        if self.path is not None:
            p = Path(self.path)
            p.mkdir(parents=True, exist_ok=True)
            return p
        self._tmp = tempfile.TemporaryDirectory(prefix="bigmm-")
        return Path(self._tmp.name)

    def __exit__(self, *exc):
        if self._tmp is not None:
            self._tmp.cleanup()
        return False
