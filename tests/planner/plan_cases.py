"""Shared cases of the planner's tests: random problems (hypothesis), random rates, and the
rates of the machines the planner's choices were measured on."""

from __future__ import annotations

from hypothesis import strategies as st

from bigmm.errors import BudgetError
from bigmm.planner import Rates, make_plan

dims = st.integers(min_value=1, max_value=700)


@st.composite
def problems(draw):
    m, n, k = draw(dims), draw(dims), draw(dims)
    dtype = draw(st.sampled_from(["float32", "float64"]))
    w = 4 if dtype == "float32" else 8
    total = w * (m * k + k * n + 2 * m * n)
    budget = draw(st.integers(min_value=max(64, total // 200), max_value=max(128, 2 * total)))
    staging = draw(st.booleans())
    host = draw(st.sampled_from([None, budget, 3 * budget]))
    chunk = st.one_of(st.none(), st.tuples(st.integers(1, 300), st.integers(1, 300)))
    return dict(m=m, n=n, k=k, dtype=dtype, trans_a=draw(st.booleans()),
                trans_b=draw(st.booleans()), reads_c=draw(st.booleans()),
                device_budget=budget, host_budget=host, staging=staging,
                a_chunks=draw(chunk), b_chunks=draw(chunk), align=draw(st.sampled_from([1, 16, 128])))


@st.composite
def resident_c(draw):
    """Problems forced into order resident-c (strips as wide as C, a random tail), with a
    budget that holds them."""
    kw = draw(problems())
    m, n, k = kw["m"], kw["n"], kw["k"]
    bm, bk = draw(st.integers(1, m)), draw(st.integers(1, k))
    nk = -(-k // bk)
    w = 4 if kw["dtype"] == "float32" else 8
    budget = w * ((m + 2 * bm) * n + (m + 2 * bm) * bk + (nk + 1) * bk * n) + 64
    return dict(kw, device_budget=budget, host_budget=None, tile=(bm, n, bk),
                order="resident-c", tail=draw(st.integers(1, nk)))


@st.composite
def whole(draw):
    """Problems forced into order whole-a or whole-b (one operand wholly on the device, random
    tiles), with a budget that holds them."""
    kw = draw(problems())
    m, n, k = kw["m"], kw["n"], kw["k"]
    bm, bn, bk = (draw(st.integers(max(1, d // 12), d)) for d in (m, n, k))
    ni, nj, nk = -(-m // bm), -(-n // bn), -(-k // bk)
    order = draw(st.sampled_from(["whole-a", "whole-b"]))
    a, b = (ni * nk, nk + 1) if order == "whole-a" else (nk + 1, nj * nk)
    w = 4 if kw["dtype"] == "float32" else 8
    budget = w * (2 * bm * bn + a * bm * bk + b * bk * bn) + 64
    return dict(kw, device_budget=budget, host_budget=None, tile=(bm, bn, bk), order=order)


@st.composite
def write_bound(draw):
    """Problems whose C is written to a slow disk, with budgets that may hold a whole operand
    (where the whole-a/-b orders are candidates), and their rates."""
    m, n, k = (draw(st.integers(64, 3000)) for _ in range(3))
    budget = int(4 * (m * k + k * n + m * n) * draw(st.sampled_from([0.4, 0.7, 1.0])))
    r = Rates(flops=draw(st.sampled_from([1e12, 1e13, 5e13])),
              read_bytes=draw(st.sampled_from([2e9, 1e10])),
              write_bytes=draw(st.sampled_from([5e8, 1e9, 2e9])), h2d_bytes=2e10,
              per_load=draw(st.sampled_from([0.0, 1e-4])))
    return dict(m=m, n=n, k=k, device_budget=budget, host_budget=4 * budget, rates=r,
                align=draw(st.sampled_from([1, 16, 128])), whole=True)


def plan_or_none(kw):
    try:
        return make_plan(**kw)
    except BudgetError as e:
        assert e.minimum > min(kw["device_budget"], kw["host_budget"] or kw["device_budget"])
        return None


@st.composite
def rates(draw):
    rate = st.floats(min_value=1e6, max_value=1e12)
    fixed = st.sampled_from([0.0, 1e-6, 4e-5, 1e-3])
    return Rates(flops=draw(st.floats(min_value=1e8, max_value=1e15)), read_bytes=draw(rate),
                 write_bytes=draw(rate), h2d_bytes=draw(st.one_of(st.none(), rate)),
                 memory_bytes=draw(st.one_of(st.none(), rate)),
                 wave_flops=draw(st.one_of(st.none(), st.floats(min_value=1e3, max_value=1e9))),
                 per_step=draw(fixed), per_load=draw(fixed), per_row=draw(fixed),
                 per_issue=draw(fixed), per_handoff=draw(fixed), per_run=draw(fixed),
                 register_bytes=draw(st.one_of(st.none(), rate)),
                 pin_bytes=draw(st.one_of(st.none(), rate)),
                 thread_bytes=draw(st.one_of(st.none(), rate)),
                 duplex=draw(st.sampled_from([1.0, 0.8, 0.5])))


@st.composite
def in_place(draw):
    """(in_place, registered) of a plan: None (the executor decides), or operands copied in
    place and some of them locked for the run."""
    ops = draw(st.one_of(st.none(), st.sets(st.sampled_from("ABC"))))
    if ops is None:
        return None, ""
    locked = draw(st.sets(st.sampled_from(sorted(ops)))) if ops else set()
    return "".join(sorted(ops)), "".join(sorted(locked))


GiB = 2**30
#: The H100 host with NumPy inputs and output: its gemm, memcpy into pinned staging, pinned
#: copies to the device, and the single writer into the output array.
H100_ARRAYS = Rates(flops=47e12, read_bytes=15e9, write_bytes=5e9, h2d_bytes=50e9)
#: The same GPU reading HDF5 files from a cold disk and writing C to it.
H100_DISK = Rates(flops=47e12, read_bytes=1.2e9, write_bytes=1.0e9, h2d_bytes=50e9)
N32 = dict(m=32768, n=32768, k=32768, device_budget=8 * GiB, host_budget=32 * GiB)
#: An H200 host's calibrated rates for bfloat16 operands from NumPy arrays (tensor cores).
H200_BF16 = Rates(flops=796e12, read_bytes=25.4e9, write_bytes=25.4e9, h2d_bytes=55.3e9,
                  memory_bytes=4.03e12, per_step=3.96e-5, per_host_row=2.5e-8,
                  register_bytes=25.4e9, pin_bytes=9.78e9)
#: The H100 from pinned NumPy arrays copied in place (nothing read or written through staging),
#: with what a gemm step adds: C tiles re-read and written at the device memory's speed, and
#: half a wave of 264 blocks of 128 x 128 lost per gemm.
H100_PINNED = Rates(flops=52e12, read_bytes=float("inf"), write_bytes=float("inf"),
                    h2d_bytes=55e9, memory_bytes=2.9e12, wave_flops=2 * 128 * 128 * 264)
