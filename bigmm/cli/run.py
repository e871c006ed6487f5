"""``bigmm multiply`` and ``bigmm plan``: one job, in this process or on a dask cluster."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys

from ._common import as_flags, err, fail_json, interrupted_status
from .report import format_summary, print_notes, progress_reporter, run_summary


def _job_kwargs(args) -> dict:
    kwargs = dict(alpha=args.alpha, beta=args.beta, trans_a=args.trans_a, trans_b=args.trans_b,
                  memory=args.memory, host_memory=args.host_memory, backend=args.backend,
                  kernel=args.kernel, io_threads=args.io_threads)
    if getattr(args, "verify", None) is not None:
        kwargs["verify"] = args.verify
    if getattr(args, "out_dtype", None) is not None:
        kwargs["out_dtype"] = args.out_dtype
    if getattr(args, "precision", None) is not None:
        kwargs["precision"] = args.precision
    return kwargs


def cmd_multiply(args) -> int:
    from .. import api

    if args.scheduler is not None or args.workers is not None:
        if args.profile is not None:
            from ..errors import OptionError

            raise OptionError("Expected --profile without --scheduler/--workers (it times the "
                              "stages of one process). Got both.")
        return _multiply_on_cluster(args)
    kwargs = _job_kwargs(args)
    api.check_callbacks(None, args.profile, args.out)  # before the run, not after it
    plan = api.plan(args.a, args.b, args.out, resume=args.resume, **kwargs)
    if not args.quiet and not args.resume:
        _note_budget(api, args, kwargs, plan)
    prof = _new_profile() if args.profile is not None else None
    with progress_reporter(args.quiet, plan.flops) as progress:
        try:
            out, stats = api.matmul(args.a, args.b, args.out, **kwargs, progress=progress,
                                    resume=args.resume, overwrite=args.overwrite,
                                    stats=True, profile=prof)
        except KeyboardInterrupt:
            progress.stop()
            message = f"interrupted; {args.out} is resumable: {resume_command(args.argv)}"
            err(message)
            fail_json(args, interrupted_status(), message, "KeyboardInterrupt",
                      output=str(args.out), resumable=True)
            return interrupted_status()
    summary = run_summary(plan, stats, out, args.a, args.b, backend_name(args.backend))
    if prof is not None:
        files = prof.save(api.profile_prefix(args.profile, args.out))
        if "png" not in files:
            print(f"bigmm: no timeline PNG written: matplotlib is not installed (pip install "
                  f"'bigmm[plot]'); the trace is {files['trace']}", file=sys.stderr)
        summary["profile"] = {"stages": prof.summary(), "device": prof.device, "files": files}
    print_notes(summary, args.quiet)
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
    from ..dask import run_files

    kwargs = _job_kwargs(args)
    with _cluster_client(args.scheduler, args.workers, args.backend) as client:
        if not args.quiet:
            print(f"bigmm: dask dashboard at {client.dashboard_link}", file=sys.stderr,
                  flush=True)
        total = 0 if args.quiet else _flops(args.a, args.b, args.trans_a, args.trans_b)
        with progress_reporter(args.quiet, total) as progress:
            try:
                out, plan, stats, backend = run_files(
                    args.a, args.b, args.out, client=client, **kwargs, progress=progress,
                    resume=args.resume, overwrite=args.overwrite)
            except KeyboardInterrupt:
                progress.stop()
                message = f"interrupted; {args.out} is resumable: {resume_command(args.argv)}"
                err(message)
                fail_json(args, interrupted_status(), message, "KeyboardInterrupt",
                          output=str(args.out), resumable=True)
                return interrupted_status()
        workers = len(client.scheduler_info(n_workers=-1)["workers"])
    summary = run_summary(plan, stats, out, args.a, args.b, backend)
    summary["workers"] = workers
    summary["predicted_seconds"] = None  # the plan's time is one process's
    print_notes(summary, args.quiet)
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not args.quiet:
        print(format_summary(summary) + f"\nworkers {workers}")
    return 0


def _flops(a, b, trans_a: bool, trans_b: bool) -> int:
    """2 m n k of op(A) @ op(B), from the operands' shapes (for the progress lines)."""
    from ..io import open_input

    with open_input(a, name="A") as A, open_input(b, name="B") as B:
        m, k = A.shape[::-1] if trans_a else A.shape
        n = B.shape[0] if trans_b else B.shape[1]
    return 2 * m * n * k


@contextlib.contextmanager
def _cluster_client(scheduler: str | None, workers: int | None, backend: str):
    """A client of the cluster at ``scheduler``, or of a new local one of ``workers``."""
    from ..dask import connect, local_cluster
    from ..errors import OptionError

    if scheduler and workers:
        raise OptionError(f"Expected either --scheduler or --workers. Got both "
                          f"(--scheduler {scheduler} --workers {workers}).")
    if scheduler:
        with connect(scheduler) as client:
            yield client
    else:  # its workers' logs (a failed task's traceback) would come before the one-line error
        import logging

        with local_cluster(workers, backend=backend, silence_logs=logging.CRITICAL) as client:
            yield client


def _new_profile():
    from ..profile import Profile

    return Profile()


def resume_command(argv: list[str]) -> str:
    """The command line that resumes ``bigmm argv`` (multiply or gram; ``--overwrite``
    dropped)."""
    words = [w for w in argv if w not in ("--overwrite", "--resume")]
    return "bigmm " + shlex.join(words + ["--resume"])


def cmd_plan(args) -> int:
    from .. import api, calibration

    kwargs = _job_kwargs(args)
    plan = api.plan(args.a, args.b, args.out, **kwargs)
    timed = calibration.describe_use(calibration.used())
    if args.json:
        print(json.dumps(dict(plan.to_dict(), calibration=timed), indent=2, default=str))
    else:
        print(plan)
        if plan.predicted_seconds is None:
            print("predicted time  n/a (no rates for this backend)")
        if timed:
            print(f"calibration     {timed}")
    _note_budget(api, args, kwargs, plan)
    return 0


def _note_budget(api, args, kwargs: dict, plan) -> None:
    """The one line, on stderr, when the budgets given make the plan much slower than the
    defaults would (:func:`bigmm.api.budget_note`), with the budget that would help."""
    note = api.budget_note(args.a, args.b, args.out, **kwargs, plan=plan)
    if note:
        print(f"bigmm: {as_flags(note)}", file=sys.stderr)


def backend_name(requested: str) -> str:
    """The backend a run with ``--backend requested`` uses ("auto" resolved)."""
    return backend_info(requested)[0]


def backend_info(requested: str, kernel: str | None = None,
                 precision: str | None = None) -> tuple[str, str]:
    """(name, what it runs on) of the backend ``requested`` resolves to, with ``kernel`` and
    ``precision`` as a job gives them to it."""
    from ..backends import Describes
    from ..job import resolve_backend

    be = resolve_backend(requested, kernel, precision)
    try:
        return be.name, (be.describe() if isinstance(be, Describes)
                         else f"CPU ({os.cpu_count()} cores)")
    finally:
        be.close()
