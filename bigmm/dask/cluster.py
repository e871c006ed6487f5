"""Local clusters: one worker per GPU where GPUs are usable, else worker processes."""

from __future__ import annotations

import contextlib
import gc

from ..backends import probe_cuda
from ..errors import BackendUnavailable, OptionError
from ._common import RESOURCE
from ._common import distributed as _distributed


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
def connect(address: str, timeout: str = "30s"):
    """A Client of the running cluster whose scheduler is at ``address``, closed on exit
    (OptionError for an address dask cannot parse, such as one without a port;
    BackendUnavailable where no scheduler answers there within ``timeout``)."""
    error = None
    try:
        client = _distributed().Client(address, timeout=timeout)
    except (ValueError, TypeError) as exc:
        error = OptionError(f"Expected a scheduler address such as tcp://host:8786. Got "
                            f"{address!r}: {exc}.")
    except OSError as exc:  # nothing answering there (TimeoutError, refused)
        error = BackendUnavailable(f"Expected a dask scheduler answering at {address} within "
                                   f"{timeout}. Got none: {exc}.")
    if error is not None:
        # the half-made Client, no longer held by the exception's frames, finalised now: its
        # finaliser run later, while another Client starts, can hang that one
        gc.collect()
        raise error
    with client:
        yield client
