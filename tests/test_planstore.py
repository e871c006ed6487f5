"""Plans kept between processes: a kept choice rebuilds the very plan the search chose, is
taken instead of searching, is searched again where it no longer fits, and the store keeps
the newest few. Real store files in a directory of the test's; the planner's real search
under a GPU's rates (as calibrated on an H100 host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from bigmm import calibration, planstore
from bigmm.planner import Rates, make_plan

G = 1 << 30
#: Rates of an H100 host's calibration (float32 gemms on CUDA cores, files at nominal rates).
H100 = Rates(flops=51.96e12, read_bytes=2e9, write_bytes=1e9, h2d_bytes=55.3e9,
             memory_bytes=2.85e12, wave_flops=8650752.0, per_step=3.96e-05,
             per_load=3.03e-04, per_issue=2.66e-04, per_handoff=3.31e-04, per_run=3.15e-03,
             per_host_row=7.4e-08, per_row=2.09e-07, register_bytes=20.4e9, pin_bytes=7.2e9,
             decode_bytes=(0.0, 0.0))
#: The same host on TF32 tensor cores, the arrays' copies at host-memory rates.
TF32 = replace(H100, flops=370e12, read_bytes=20e9, write_bytes=20e9)

CASES = [
    # a file job, C into a file: whole-b
    (32768, 32768, 32768, dict(rates=H100, device_budget=8 * G, host_budget=31 * G,
                               whole=True)),
    # arrays copied in place: resident-c strips with A loaded two panels at a time
    (32768, 32768, 32768, dict(rates=TF32, device_budget=8 * G, host_budget=31 * G,
                               in_place="ABC")),
    # staged arrays bound by the copies: resident-c with a long tail
    (32768, 32768, 32768, dict(rates=TF32, device_budget=8 * G, host_budget=31 * G)),
    # locked for the run: resident-b
    (32768, 32768, 32768, dict(rates=TF32, device_budget=8 * G, host_budget=31 * G,
                               in_place="AB", registered="AB")),
    # tall and thin, small budgets: stream
    (50000, 3000, 7000, dict(rates=H100, device_budget=G, host_budget=2 * G)),
    # chunked inputs and a ragged shape
    (20000, 19999, 20001, dict(rates=H100, device_budget=G, host_budget=2 * G, whole=True,
                               a_chunks=(1000, 1000), b_chunks=(1000, 1000))),
]


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(calibration.MODE_ENV, "")
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path / "cache"))
    make_plan.cache_clear()
    yield tmp_path / "cache"
    make_plan.cache_clear()


def entries() -> dict:
    with open(calibration.store_path()) as f:
        return json.load(f)["entries"]


def plans() -> dict:
    """The kept plans by their arguments' digests."""
    return {json.loads(k.split(":", 1)[1]): v for k, v in entries().items()
            if k.startswith(planstore.KIND + ":")}


def key(m: int, n: int, k: int, kw: dict) -> str:
    return planstore.digest(m, n, k, "float32", dict(kw, staging=True))


@pytest.mark.parametrize("m,n,k,kw", CASES)
def test_a_kept_choice_rebuilds_the_plan_the_search_chose(m, n, k, kw):
    searched = make_plan(m, n, k, "float32", staging=True, **kw)
    again = make_plan(m, n, k, "float32", staging=True, **kw,
                      **planstore.schedule(json.loads(json.dumps(planstore.choice(searched)))))
    assert again == searched


def test_the_cases_cover_the_orders_and_spans():
    chosen = [make_plan(m, n, k, "float32", staging=True, **kw) for m, n, k, kw in CASES]
    assert {"whole-b", "resident-c", "resident-b", "stream"} <= {p.order for p in chosen}
    assert any(p.a_span > 1 for p in chosen) and any(p.tail > 1 for p in chosen)


def test_a_plan_is_kept_and_a_later_one_is_taken_from_the_store(store):
    m, n, k, kw = CASES[0]
    first = planstore.plan(m, n, k, "float32", staging=True, **kw)
    assert list(plans()) == [key(m, n, k, kw)]
    assert plans()[key(m, n, k, kw)]["value"] == planstore.choice(first)
    # another (fitting) schedule under the same arguments: a later process takes it as kept
    other = {"tile": [2048, 8192, 2048], "order": "stream", "tail": 0, "a_span": 1}
    calibration.keep(planstore.KIND, key(m, n, k, kw), other)
    make_plan.cache_clear()
    later = planstore.plan(m, n, k, "float32", staging=True, **kw)
    assert (later.bm, later.bn, later.bk, later.order) == (2048, 8192, 2048, "stream")
    assert later.rates == first.rates


def test_other_arguments_are_planned_apart(store):
    m, n, k, kw = CASES[0]
    planstore.plan(m, n, k, "float32", staging=True, **kw)
    planstore.plan(m, n, k, "float32", staging=True, **dict(kw, device_budget=4 * G))
    planstore.plan(m, n, k, "float32", staging=True,
                   **dict(kw, rates=replace(H100, flops=H100.flops * 1.01)))
    assert len(plans()) == 3


def test_a_later_call_takes_the_schedule_kept_without_the_blocks_it_holds(store):
    # a later call in a process plans with the staging blocks earlier calls kept: it takes
    # the schedule kept for the same arguments without them instead of searching
    m, n, k, kw = CASES[0]
    planstore.plan(m, n, k, "float32", staging=True, **kw)
    other = {"tile": [2048, 8192, 2048], "order": "stream", "tail": 0, "a_span": 1}
    calibration.keep(planstore.KIND, key(m, n, k, kw), other)
    held = (256 << 20, 12345)
    later_kw = dict(kw, rates=replace(kw["rates"], kept_pinned=held))
    make_plan.cache_clear()
    later = planstore.plan(m, n, k, "float32", staging=True, **later_kw)
    assert planstore.choice(later) == other and later.rates.kept_pinned == held
    assert key(m, n, k, later_kw) not in plans()  # nothing searched, nothing kept anew


def test_a_later_call_with_nothing_kept_searches(store):
    m, n, k, kw = CASES[0]
    later_kw = dict(kw, rates=replace(kw["rates"], kept_pinned=(256 << 20,)))
    later = planstore.plan(m, n, k, "float32", staging=True, **later_kw)
    assert later == make_plan(m, n, k, "float32", staging=True, **later_kw)
    assert list(plans()) == [key(m, n, k, later_kw)]


def test_a_kept_choice_that_does_not_fit_is_searched_again(store):
    m, n, k, kw = CASES[4]
    searched = planstore.plan(m, n, k, "float32", staging=True, **kw)
    too_big = {"tile": [50000, 3000, 7000], "order": "stream", "tail": 0, "a_span": 1}
    calibration.keep(planstore.KIND, key(m, n, k, kw), too_big)
    make_plan.cache_clear()
    assert planstore.plan(m, n, k, "float32", staging=True, **kw) == searched
    assert plans()[key(m, n, k, kw)]["value"] == planstore.choice(searched)  # kept again


@pytest.mark.parametrize("kept", [
    {"tile": [1, 2], "order": "stream", "tail": 0, "a_span": 1},  # a tile of two sides
    {"order": "stream"},  # fields missing
    {"tile": [256, 256, 256], "order": "diagonal", "tail": 0, "a_span": 1},  # no such order
])
def test_a_kept_choice_of_another_form_is_searched_again(store, kept):
    m, n, k, kw = CASES[4]
    searched = planstore.plan(m, n, k, "float32", staging=True, **kw)
    calibration.keep(planstore.KIND, key(m, n, k, kw), kept)
    make_plan.cache_clear()
    assert planstore.plan(m, n, k, "float32", staging=True, **kw) == searched


def test_the_store_keeps_the_newest_plans(store, monkeypatch):
    monkeypatch.setattr(planstore, "LIMIT", 3)
    m, n, k, kw = CASES[4]
    budgets = [G + i * (64 << 20) for i in range(5)]
    for b in budgets:
        planstore.plan(m, n, k, "float32", staging=True, **dict(kw, device_budget=b))
    kept = plans()
    assert len(kept) == 3
    assert set(kept) == {key(m, n, k, dict(kw, device_budget=b)) for b in budgets[2:]}


def test_a_search_by_bytes_is_not_kept(store):
    m, n, k, kw = CASES[4]
    planstore.plan(m, n, k, "float32", staging=True, **dict(kw, rates=None))
    assert not store.exists()


def test_nothing_is_kept_where_calibrations_are_off(store, monkeypatch):
    monkeypatch.setenv(calibration.MODE_ENV, "off")
    m, n, k, kw = CASES[4]
    planstore.plan(m, n, k, "float32", staging=True, **kw)
    assert not store.exists()


def test_a_second_process_takes_the_plan_the_first_kept(store, tmp_path):
    # two real processes planning the same job: the second one's plan is the first one's
    # schedule, taken from the store (the first process searched)
    script = (
        "import json, sys, time\n"
        "from dataclasses import replace\n"
        "from bigmm import planstore\n"
        "from bigmm.planner import search\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from test_planstore import CASES\n"
        "m, n, k, kw = CASES[0]\n"
        "calls = []\n"
        "real = search._fastest\n"
        "search._fastest = lambda *a, **k: calls.append(1) or real(*a, **k)\n"
        "p = planstore.plan(m, n, k, 'float32', staging=True, **kw)\n"
        "print(json.dumps([planstore.choice(p), len(calls)]))\n")
    runs = [json.loads(subprocess.run(
        [sys.executable, "-c", script, os.path.dirname(os.path.abspath(__file__))],
        capture_output=True, text=True, check=True).stdout) for _ in range(2)]
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == 1 and runs[1][1] == 0  # searched once, then taken


#: A script's opening that counts the planner's searches in ``calls``.
SEARCHES_COUNTED = (
    "import json, sys\n"
    "import bigmm\n"
    "from bigmm.planner import search\n"
    "calls = []\n"
    "real = search._fastest\n"
    "search._fastest = lambda *a, **k: calls.append(1) or real(*a, **k)\n")


def _gpu_job_files(tmp_path) -> tuple[str, str]:
    """A and B of a small chunked HDF5 job."""
    from bigmm.io.generate import generate

    a, b = str(tmp_path / "a.h5") + ":/A", str(tmp_path / "b.h5") + ":/B"
    generate(a, (3000, 2500), layout="chunked", chunks=(512, 512), seed=1)
    generate(b, (2500, 2700), layout="chunked", chunks=(512, 512), seed=2)
    return a, b


def _run(script: str, a: str, b: str, tmp_path, mode: str):
    """What a process running ``script`` on A, B and C into the test's folder printed last
    (JSON), with calibrations in ``mode``."""
    env = dict(os.environ, **{calibration.MODE_ENV: mode})
    out = subprocess.run([sys.executable, "-c", script, a, b, str(tmp_path / "c.h5:/C")],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_on_a_gpu_a_later_process_plans_a_file_job_from_the_store(store, tmp_path):
    # every figure the planner takes is kept by the first process (measured afresh and
    # kept), so a second one asks the same and takes the schedule without searching
    a, b = _gpu_job_files(tmp_path)
    script = SEARCHES_COUNTED + (
        "p = bigmm.plan(sys.argv[1], sys.argv[2], sys.argv[3], memory='64MiB',\n"
        "               host_memory='256MiB', backend='cupy')\n"
        "print(json.dumps([p.order, p.bm, p.bn, p.bk, p.tail, p.a_span, len(calls)]))\n")
    runs = [_run(script, a, b, tmp_path, mode) for mode in ("fresh", "")]
    assert runs[0][:6] == runs[1][:6]
    assert runs[0][6] >= 1 and runs[1][6] == 0, runs


@pytest.mark.gpu
def test_on_a_gpu_a_second_call_in_a_process_plans_without_searching(store, tmp_path):
    # the second call holds the staging blocks the first kept, which its rates spell: it
    # takes the first call's schedule instead of searching again, and its C is as right
    a, b = _gpu_job_files(tmp_path)
    script = SEARCHES_COUNTED + (
        "import h5py, numpy as np\n"
        "def load(spec):\n"
        "    path, name = spec.split(':')\n"
        "    with h5py.File(path) as f:\n"
        "        return f[name.strip('/')][...].astype(np.float64)\n"
        "ref = load(sys.argv[1]) @ load(sys.argv[2])\n"
        "out = []\n"
        "for i in range(2):\n"
        "    n0 = len(calls)\n"
        "    bigmm.matmul(sys.argv[1], sys.argv[2], sys.argv[3], memory='64MiB',\n"
        "                 host_memory='256MiB', backend='cupy', overwrite=True)\n"
        "    err = np.linalg.norm(load(sys.argv[3]) - ref) / np.linalg.norm(ref)\n"
        "    out.append([len(calls) - n0, bool(err < 1e-5)])\n"
        "print(json.dumps(out))\n")
    runs = _run(script, a, b, tmp_path, "fresh")
    assert runs[0][0] >= 1 and runs[0][1] and runs[1] == [0, True], runs
