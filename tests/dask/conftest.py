"""What the tests of bigmm.dask share: ``client``, a client of one local cluster of two worker
processes (one thread each), for every test here that computes on a cluster.

The cluster starts when the first test asks for it and is closed after the last test of this
folder, so it starts once for all the files here and is gone before the tests elsewhere run
(an open client would be dask's default scheduler for them). A package-scoped fixture would
not end there: pytest gives it session scope in a folder without ``__init__.py``, and this
folder cannot have one (a package named ``dask`` would hide dask itself).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

import bigmm.dask as bd
from dask_cases import WORKER_MEMORY

HERE = Path(__file__).parent
_running = {}  # the cluster while it runs: its client and the stack that closes it


@pytest.fixture
def client():
    if "client" not in _running:
        stack = contextlib.ExitStack()
        _running["client"] = stack.enter_context(
            bd.local_cluster(2, backend="numpy", memory_limit=WORKER_MEMORY))
        _running["stack"] = stack
    return _running["client"]


def _close_cluster():
    _running.pop("client", None)
    stack = _running.pop("stack", None)
    if stack is not None:
        stack.close()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or HERE not in nextitem.path.parents:  # the last test here
        _close_cluster()


def pytest_sessionfinish(session):
    _close_cluster()  # a run stopped early (-x, Ctrl-C)
