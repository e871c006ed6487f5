"""dask integration: bigmm as a dask task graph, and one HDF5 job spread over a dask cluster.

* :func:`matmul`: dask arrays in (NumPy or CuPy chunks, any chunking), dask array out. Every
  output block is the end of a chain of accumulate tasks along K; each task holds one A block,
  one B block and the partial C block, and accumulates with the backend's gemm.
* :func:`matmul_files`: ``C = alpha*op(A)@op(B) + beta*C`` on HDF5 files as C-tile tasks on a
  ``dask.distributed`` cluster. Each task reopens A and B by path on its worker, runs bigmm's
  executor on its tile and writes it into C's file at its byte offsets; the calling process
  creates C, journals the tiles the tasks report and alone touches HDF5 metadata.
  :func:`run_files` is the same, returning the plan and the statistics too.
* :func:`local_cluster`: a client on a new local cluster (one worker per GPU with dask-cuda where
  GPUs are usable, else worker processes), as ``bigmm multiply --workers N`` starts it;
  :func:`connect`: a client of a running cluster.

dask and distributed are imported inside functions: importing this module needs neither.
"""

from __future__ import annotations

from ._common import RESOURCE
from .array import matmul
from .cluster import connect, local_cluster
from .files import matmul_files, run_files

__all__ = ["RESOURCE", "connect", "local_cluster", "matmul", "matmul_files", "run_files"]
