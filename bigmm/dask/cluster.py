"""Local clusters (one worker per GPU where GPUs are usable) and ``bigmm multiply --scheduler
ADDRESS | --workers N``."""

from __future__ import annotations

import contextlib

from ..backends import probe_cuda
from ..errors import BackendUnavailable, OptionError
from ._common import RESOURCE
from ._common import distributed as _distributed
from .files import _run_files


@contextlib.contextmanager
def local_cluster(n_workers: int, *, backend: str = "auto", **kwargs):
    """A Client on a new local cluster, closed on exit.

    Where a GPU is usable (and ``backend`` is not "numpy"): dask-cuda's LocalCUDACluster, one
    worker per GPU (``n_workers`` GPUs). Otherwise a LocalCluster of ``n_workers`` processes.
    Every worker has one thread and the resource ``bigmm=1``: one bigmm task at a time per
    worker, hence per GPU. ``kwargs`` go to the cluster.
    """
    distributed = _distributed()
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise OptionError(f"Expected the number of workers as a positive integer. "
                          f"Got {n_workers!r}.")
    opts = dict(n_workers=n_workers, threads_per_worker=1, resources={RESOURCE: 1},
                dashboard_address=":0")
    opts.update(kwargs)
    if str(backend).lower() != "numpy" and probe_cuda():
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError as e:
            raise BackendUnavailable(f"Expected dask-cuda for a local cluster of GPU workers "
                                     f"(pip install dask-cuda). Got {type(e).__name__}: "
                                     f"{e}.") from e
        try:
            cluster = LocalCUDACluster(**opts)
        except ValueError as e:  # more workers than GPUs
            raise OptionError(f"Expected at most one worker per GPU. Got {n_workers} workers: "
                              f"{e}.") from e
    else:
        cluster = distributed.LocalCluster(processes=True, **opts)
    try:
        with distributed.Client(cluster) as client:
            yield client
    finally:
        cluster.close()


@contextlib.contextmanager
def _cli_client(scheduler: str | None, workers: int | None, backend: str):
    if scheduler and workers:
        raise OptionError(f"Expected either --scheduler or --workers. Got both "
                          f"(--scheduler {scheduler} --workers {workers}).")
    if scheduler:
        distributed = _distributed()
        with distributed.Client(scheduler, timeout="30s") as client:
            yield client
    else:
        with local_cluster(workers, backend=backend) as client:
            yield client


def run_cli(args) -> int:
    """``bigmm multiply ... --scheduler ADDRESS | --workers N``: the job on a dask cluster."""
    import json
    import sys

    from .. import cli

    kwargs = cli._job_kwargs(args)
    with _cli_client(args.scheduler, args.workers, args.backend) as client, \
            cli._progress_bar(enabled=not args.quiet and sys.stderr.isatty()) as progress:
        try:
            out, plan, stats, backend = _run_files(
                args.a, args.b, args.out, client=client, **kwargs, progress=progress,
                resume=args.resume, overwrite=args.overwrite, io_threads=args.io_threads)
        except KeyboardInterrupt:
            progress.stop()
            cli._err(f"interrupted; {args.out} is resumable: {cli.resume_command(args.argv)}")
            return cli.EXIT_INTERRUPTED
        workers = len(client.scheduler_info(n_workers=-1)["workers"])
    summary = cli.run_summary(plan, stats, out, args.a, args.b, backend)
    summary["workers"] = workers
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not args.quiet:
        print(cli.format_summary(summary) + f"\nworkers {workers}")
    return 0
