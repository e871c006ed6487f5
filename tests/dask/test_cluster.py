"""Clusters: bigmm.dask.connect and local_cluster, and the command line's --scheduler and
--workers (on the local cluster of conftest.py, or on one the command starts).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import bigmm  # noqa: E402
import bigmm.dask as bd  # noqa: E402
from bigmm import cli  # noqa: E402
from bigmm.testing import (gpu_available, random_matrix, reference_gemm,  # noqa: E402
                           relative_error, tolerance)
from dask_cases import _h5, _read  # noqa: E402


def test_cli_scheduler_and_workers(client, tmp_path, capsys):
    a = random_matrix((70, 90), np.float32, seed=31)
    b = random_matrix((90, 50), np.float32, seed=32)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b, "chunked")
    ref = a.astype(np.float64) @ b
    for i, where in enumerate((["--scheduler", client.scheduler.address], ["--workers", "1"])):
        sc = f"{tmp_path / f'c{i}.h5'}:/C"
        rc = cli.main(["multiply", sa, sb, "-o", sc, "--memory", "64KiB", "--backend", "numpy",
                       "--json", *where])
        assert rc == 0
        out, err = capsys.readouterr()
        summary = json.loads(out)
        assert summary["workers"] == (2 if i == 0 else 1)
        # a log without a terminal: the dashboard's address, then progress lines
        lines = err.strip().splitlines()
        assert lines[0].startswith("bigmm: dask dashboard at http"), err
        assert lines[-1].startswith("bigmm: 100% ("), err
        assert summary["backend"] == "numpy" and summary["tiles_done"] == summary["tiles_total"]
        assert relative_error(_read(sc)[0], ref) <= tolerance(np.float32, 90)


CLI_ERRORS = [
    # (extra arguments, message)
    # both ways of choosing a cluster
    (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], "either --scheduler or --workers"),
    # no workers
    (["--workers", "0"], "positive integer"),
    # an address dask cannot parse (no port)
    (["--scheduler", "garbage"], "Expected a scheduler address"),
    # both, with no workers: refused at once, not a wait for that scheduler
    (["--workers", "0", "--scheduler", "tcp://127.0.0.1:1"], "either --scheduler or --workers"),
    # an empty address is an address, not a missing one
    (["--scheduler", ""], "Expected a scheduler address"),
]


@pytest.mark.parametrize("extra,message", CLI_ERRORS)
def test_cli_errors(tmp_path, capsys, extra, message):
    sa = _h5(tmp_path / "a.h5", "A", random_matrix((5, 5), np.float64))
    t0 = time.perf_counter()
    rc = cli.main(["multiply", sa, sa, "-o", f"{tmp_path / 'c.h5'}:/C", *extra])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_ERROR and message in err and len(err.strip().splitlines()) == 1
    assert time.perf_counter() - t0 < 20  # no cluster was started


def test_a_scheduler_that_does_not_answer_is_one_error():
    from bigmm.dask.cluster import connect

    t0 = time.perf_counter()
    with pytest.raises(bigmm.errors.BackendUnavailable,
                       match=r"Expected a dask scheduler answering at tcp://127\.0\.0\.1:1 "
                             r"within 1s\. Got none"):
        with connect("tcp://127.0.0.1:1", timeout="1s"):
            pass
    assert time.perf_counter() - t0 < 15


@pytest.mark.skipif(not gpu_available(), reason="needs a usable CUDA GPU and cupy")
@pytest.mark.gpu
def test_local_cluster_one_worker_per_gpu():
    pytest.importorskip("dask_cuda")
    with bd.local_cluster(1) as c:
        info = c.scheduler_info(n_workers=-1)["workers"]
        assert all(w["nthreads"] == 1 and w["resources"] == {bd.RESOURCE: 1}
                   for w in info.values())


def test_cli_workers_on_zarr(client, tmp_path, capsys):
    a, b, c = (f"{tmp_path / 's.zarr'}:/{x}" for x in "ABC")
    assert cli.main(["generate", a, "--shape", "70", "90", "--seed", "1", "--compression",
                     "zstd", "--chunks", "35", "45"]) == 0
    assert cli.main(["generate", b, "--shape", "90", "50", "--seed", "2"]) == 0
    capsys.readouterr()
    rc = cli.main(["multiply", a, b, "-o", c, "--memory", "64KiB", "--backend", "numpy",
                   "--json", "--workers", "2"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["workers"] == 2 and summary["tiles_done"] == summary["tiles_total"]
    assert cli.main(["verify", a, b, c]) == 0


def test_cli_on_a_cluster_takes_a_precision(client, tmp_path, capsys):
    a, b = random_matrix((70, 90), np.float64, 45), random_matrix((90, 50), np.float64, 46)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    where = ["--scheduler", client.scheduler.address, "--backend", "numpy", "-q"]
    rc = cli.main(["multiply", sa, sb, "-o", f"{tmp_path / 'c.h5'}:/C", "--precision", "tf32",
                   *where])
    err = capsys.readouterr().err
    assert rc == 2 and "--precision 'float32'" in err and "float64 operands" in err
    a32, b32 = (x.astype(np.float32) for x in (a, b))
    sa, sb = _h5(tmp_path / "a.h5", "A32", a32), _h5(tmp_path / "b.h5", "B32", b32)
    sc = f"{tmp_path / 'c.h5'}:/C32"
    assert cli.main(["multiply", sa, sb, "-o", sc, "--precision", "tf32x3", *where]) == 0
    assert relative_error(_read(sc)[0], reference_gemm(a32, b32)) <= tolerance(np.float32, 90)
