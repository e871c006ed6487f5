"""``bigmm multiply`` and ``bigmm plan``: one job, in this process or on a dask cluster."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys

from ..errors import BigmmError, ResumeError
from ._common import as_flags, err, fail_json, interrupted_status, ok_json
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
    journal, stamp = journal_state(args.out), output_stamp(args.out)
    with progress_reporter(args.quiet, plan.flops) as progress:
        try:
            out, stats = api.matmul(args.a, args.b, args.out, **kwargs, progress=progress,
                                    resume=args.resume, overwrite=args.overwrite,
                                    stats=True, profile=prof)
        except KeyboardInterrupt as e:
            return interrupted(args, progress, e, journal, stamp)
        except Exception as e:
            note_resumable(args, journal, e)
            raise
    summary = run_summary(plan, stats, out, args.a, args.b, backend_name(args.backend))
    if prof is not None:
        files = prof.save(api.profile_prefix(args.profile, args.out))
        if "png" not in files:
            print(f"bigmm: no timeline PNG written: matplotlib is not installed (pip install "
                  f"'bigmm[plot]'); the trace is {files['trace']}", file=sys.stderr)
        summary["profile"] = {"stages": prof.summary(), "device": prof.device, "files": files}
    print_notes(summary, args.quiet)
    if args.json:
        ok_json(summary)
    elif not args.quiet:
        print(format_summary(summary))
        if prof is not None:
            print(prof.table())
            print("profile: " + ", ".join(summary["profile"]["files"].values()))
    return 0


#: ``--workers N``: at most this many local workers per CPU core this process may use (each
#: worker is a process of one thread; a few per core keep the cores busy while others read).
WORKERS_PER_CORE = 4


def max_workers() -> int:
    """The most workers ``--workers`` starts: WORKERS_PER_CORE per CPU core of this process."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return WORKERS_PER_CORE * max(1, cores)


def _multiply_on_cluster(args) -> int:
    """``multiply ... --scheduler ADDRESS | --workers N``: the job's tiles on a dask cluster,
    started only once the options, inputs and output are known to be right."""
    from ..dask import run_files
    from ..errors import OptionError

    if args.scheduler is not None and args.workers is not None:  # --workers 0 too
        raise OptionError(f"Expected either --scheduler or --workers. Got both "
                          f"(--scheduler {args.scheduler!r} --workers {args.workers}).")
    if args.workers is not None and not 1 <= args.workers <= max_workers():
        raise OptionError(f"Expected --workers as a positive integer, at most {max_workers()} "
                          f"({WORKERS_PER_CORE} per CPU core of this process). Got "
                          f"{args.workers}.")
    _check_files(args)
    kwargs = _job_kwargs(args)
    with _cluster_client(args.scheduler, args.workers, args.backend) as client:
        if not args.quiet:
            print(f"bigmm: dask dashboard at {client.dashboard_link}", file=sys.stderr,
                  flush=True)
        total = 0 if args.quiet else _flops(args.a, args.b, args.trans_a, args.trans_b)
        journal, stamp = journal_state(args.out), output_stamp(args.out)
        with progress_reporter(args.quiet, total) as progress:
            try:
                out, plan, stats, backend = run_files(
                    args.a, args.b, args.out, client=client, **kwargs, progress=progress,
                    resume=args.resume, overwrite=args.overwrite)
            except KeyboardInterrupt as e:
                return interrupted(args, progress, e, journal, stamp)
            except Exception as e:
                note_resumable(args, journal, e)
                raise
        workers = len(client.scheduler_info(n_workers=-1)["workers"])
    summary = run_summary(plan, stats, out, args.a, args.b, backend)
    summary["workers"] = workers
    summary["predicted_seconds"] = None  # the plan's time is one process's
    print_notes(summary, args.quiet)
    if args.json:
        ok_json(summary)
    elif not args.quiet:
        print(format_summary(summary) + f"\nworkers {workers}")
    return 0


def _check_files(args) -> None:
    """What the run on a cluster refuses about its inputs and output (read-only, in this
    process): an input missing or unreadable, shapes that do not fit, an output that is an
    input, cannot be written, or (without --overwrite or --resume) exists already. So that it
    is said at once, not after the cluster's start-up."""
    from ..io import open_input, refuse_output_alias
    from ..io.existing import check_output
    from ..job import check_operands, parse_scalar

    with open_input(args.a, name="A") as A, open_input(args.b, name="B") as B:
        m, _, n, _ = check_operands(A, B, args.trans_a, args.trans_b)
        refuse_output_alias(args.out, [A, B])
    check_output(args.out, (m, n), reads_c=parse_scalar(args.beta, "beta") != 0,
                 resume=args.resume, overwrite=args.overwrite)


def _flops(a, b, trans_a: bool, trans_b: bool) -> int:
    """2 m n k of op(A) @ op(B), from the operands' shapes (for the progress lines)."""
    from ..io import open_input

    with open_input(a, name="A") as A, open_input(b, name="B") as B:
        m, k = A.shape[::-1] if trans_a else A.shape
        n = B.shape[0] if trans_b else B.shape[1]
    return 2 * m * n * k


@contextlib.contextmanager
def _cluster_client(scheduler: str | None, workers: int | None, backend: str):
    """A client of the cluster at ``scheduler``, or of a new local one of ``workers`` (one of
    them given: :func:`_multiply_on_cluster` refuses both)."""
    from ..dask import connect, local_cluster

    if scheduler is not None:
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


def interrupted(args, progress, e: KeyboardInterrupt, before=None, stamp=None) -> int:
    """A run into ``args.out`` interrupted: the progress stopped, one line with the command
    that resumes it (and the --json answer); returns the exit status. ``before`` and
    ``stamp``: the output's journal (:func:`journal_state`) and files (:func:`output_stamp`)
    as the run found them. A run interrupted before it journaled anything (planning, opening
    the output) changed nothing there: the line gives the command as it was, which
    ``--resume`` could not stand for (an existing output it was to overwrite, a journal of
    another run); one that had finished the output gives the resume, which finds it done."""
    progress.stop()
    status = interrupted_status()
    after = journal_state(args.out)
    if (after is not None and (after != before or args.resume)) or (
            after is None and output_stamp(args.out) != stamp):
        message = f"interrupted; {args.out} is resumable: {resume_command(args.argv)}"
        extra = dict(output=str(args.out), resumable=True)
    else:
        message = (f"interrupted before anything was written to {args.out}; run it again: "
                   f"bigmm {shlex.join(args.argv)}")
        extra = {}
    err(message)
    fail_json(args, status, message, type(e).__name__, **extra)
    return status


def journal_state(out: str):
    """(inode, size, modification time) of the journal of the output spec ``out``; None where
    there is none."""
    from ..io.journal import journal_path
    from ..io.spec import parse_spec

    try:
        st = os.stat(journal_path(parse_spec(out)))
    except (BigmmError, OSError, ValueError):
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def output_stamp(out: str):
    """(inode, size, modification time) of the files of the output spec ``out`` (an HDF5
    file; a Zarr array's folder and its metadata), None for each that is not there."""
    from ..io.spec import parse_spec
    from ..io.zarrsink import target_dir

    try:
        spec = parse_spec(out)
        paths = [spec.path]
        if spec.zarr:
            folder = target_dir(spec, spec.dataset)
            paths += [folder, os.path.join(folder, "zarr.json")]
    except (BigmmError, OSError, ValueError):
        return None
    stamps = []
    for path in paths:
        try:
            st = os.stat(path)
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            stamps.append(None)
    return tuple(stamps)


def note_resumable(args, before, e: BaseException) -> None:
    """After a run into ``args.out`` failed with ``e``: where the run wrote the output's journal
    (created it, or journaled tiles: ``before`` is the journal as the run found it) and no other
    run holds the output, the --json answer names the output as resumable. A refused resume
    (ResumeError) adds nothing: its journal is another job's or inputs' since."""
    from ..io.journal import lock_path
    from ..io.spec import parse_spec

    after = journal_state(args.out)
    if isinstance(e, ResumeError) or after is None or after == before:
        return
    if not os.path.exists(lock_path(parse_spec(args.out))):
        args.failure.update(output=str(args.out), resumable=True)


def cmd_plan(args) -> int:
    from .. import api, calibration, io

    kwargs = _job_kwargs(args)
    if args.resume and args.out is None:
        from ..errors import OptionError

        raise OptionError("Expected -o C with --resume (the output whose run to resume). Got "
                          "no -o.")
    plan = api.plan(args.a, args.b, args.out, resume=args.resume, **kwargs)
    timed = calibration.describe_use(calibration.used())
    note = _budget_note(api, args, kwargs, plan)  # before the answer: it may fail
    journaled = io.journaled_tiles(args.out) if args.resume else None
    if args.json:
        extra = {} if journaled is None else {"tiles_journaled": journaled}
        ok_json(dict(plan.to_dict(), calibration=timed, **extra))
    else:
        print(plan)
        if plan.predicted_seconds is None:
            print("predicted time  n/a (no rates for this backend)")
        if timed:
            print(f"calibration     {timed}")
        if args.resume:
            print("resume          " + (
                "no journal of an interrupted run" if journaled is None else
                f"{journaled} of {plan.n_tiles} tiles journaled ({plan.n_tiles - journaled} "
                f"left; the resume checks the inputs and the journaled tiles first; the "
                f"predicted time is the whole job's)"))
    if note:
        print(note, file=sys.stderr)
    return 0


def _note_budget(api, args, kwargs: dict, plan) -> None:
    """The note of :func:`_budget_note` on stderr, where there is one."""
    note = _budget_note(api, args, kwargs, plan)
    if note:
        print(note, file=sys.stderr)


def _budget_note(api, args, kwargs: dict, plan) -> str:
    """The one line for stderr when the budgets given make the plan much slower than the
    defaults would (:func:`bigmm.api.budget_note`), with the budget that would help; ""
    where they do not."""
    note = api.budget_note(args.a, args.b, args.out, **kwargs, plan=plan)
    return f"bigmm: {as_flags(note)}" if note else ""


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
