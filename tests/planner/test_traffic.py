"""What a plan moves: each operand read at its stored width (the same bytes a run counts), the
copies in at the compute dtype's, the lower bound in bytes as stored."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_cases import plan_or_none, problems

import bigmm
from bigmm.io.generate import generate
from bigmm.planner import make_plan
from bigmm.testing import random_matrix
from bigmm.units import DTYPES, common_dtype, numpy_dtype

M, N, K = 150, 130, 170
MEMORY = "64KiB"  # several tiles and K panels: inputs read more than once

PAIRS = [
    # (A's dtype, B's dtype) of a product in NumPy's result type of the two
    ("float16", "float32"),   # A widened to float32
    ("float32", "bfloat16"),  # B widened to float32
    ("bfloat16", "float16"),  # both widened: no common 16-bit type
    ("float32", "float64"),   # A widened to float64
    ("float16", "float64"),   # A four times as wide
]


@pytest.mark.parametrize("da, db", PAIRS)
@pytest.mark.parametrize("stored", ["files", "arrays"])
def test_mixed_plan_reads_what_the_run_reads(tmp_path, stored, da, db):
    if stored == "files":
        a = generate(f"{tmp_path / 'a.h5'}:/A", (M, K), dtype=da, seed=1)
        b = generate(f"{tmp_path / 'b.h5'}:/B", (K, N), dtype=db, seed=2)
        out = f"{tmp_path / 'c.h5'}:/C"
    else:
        a, b = random_matrix((M, K), numpy_dtype(da), 1), random_matrix((K, N), numpy_dtype(db), 2)
        out = None
    p = bigmm.plan(a, b, memory=MEMORY, backend="numpy")
    _, stats = bigmm.matmul(a, b, out, memory=MEMORY, backend="numpy", stats=True)
    assert p.dtype == common_dtype(da, db) and p.a_reads * p.b_reads > 1
    assert p.bytes_read == stats.bytes_read
    assert p.bytes_read == round(DTYPES[da] * p.a_reads * M * K + DTYPES[db] * p.b_reads * K * N)


OLD_C = [
    # (old C's dtype) kept with beta != 0 for float32 operands (float32 tiles)
    "float16",  # narrower: widened within its buffer
    "float64",  # wider: read into a copy as stored (counted: Plan.convert_bytes)
]


@pytest.mark.parametrize("dc", OLD_C)
def test_old_c_is_read_at_its_stored_width(tmp_path, dc):
    a = generate(f"{tmp_path / 'a.h5'}:/A", (M, K), seed=1)
    b = generate(f"{tmp_path / 'b.h5'}:/B", (K, N), seed=2)
    c = generate(f"{tmp_path / 'c.h5'}:/C", (M, N), dtype=dc, seed=3)
    p = bigmm.plan(a, b, c, beta=1.0, memory=MEMORY, backend="numpy")
    _, stats = bigmm.matmul(a, b, c, beta=1.0, memory=MEMORY, backend="numpy", stats=True)
    assert p.written_dtype == dc and p.bytes_read == stats.bytes_read
    assert p.bytes_read - p.bytes_h2d == (DTYPES[dc] - 4) * M * N
    assert f"C x1 in {dc}" in str(p)


def test_stored_widths_count_reads_not_copies():
    kw = dict(device_budget=1 << 30, tile=(512, 384, 256), order="stream")
    mixed = make_plan(2000, 1500, 1000, "float32", a_dtype="float16", **kw)
    single = make_plan(2000, 1500, 1000, "float32", **kw)
    a, b = mixed.a_reads * 2000 * 1000, mixed.b_reads * 1000 * 1500
    assert mixed.bytes_read == 2 * a + 4 * b and single.bytes_read == 4 * (a + b)
    assert mixed.bytes_h2d == single.bytes_h2d == single.bytes_read
    assert mixed.device_bytes == single.device_bytes  # the buffers hold float32 panels
    assert mixed.lower_bound_bytes == 2 * 2000 * 1000 + 4 * 1000 * 1500  # each read once
    assert "(A x4 in float16, B x4)" in str(mixed)
    # stored as the product is: no stored dtype (the plan of uniform operands)
    assert make_plan(2000, 1500, 1000, "float32", a_dtype="float32", **kw) == single


@settings(max_examples=100, deadline=None)
@given(problems(), st.data())
def test_bound_holds_at_the_stored_widths(kw, data):
    narrower = [d for d in DTYPES if DTYPES[d] <= DTYPES[kw["dtype"]]]
    kw = dict(kw, a_dtype=data.draw(st.sampled_from(narrower)),
              b_dtype=data.draw(st.sampled_from(narrower)))
    p = plan_or_none(kw)
    if p is None:
        return
    assert p.bound_ratio >= 1.0 - 1e-9
    assert p.bytes_read >= p.lower_bound_bytes - 1


def test_c_converted_on_the_host_is_counted_and_printed():
    kw = dict(device_budget=1 << 30, tile=(512, 384, 256), order="stream", staging=False)
    tile = 512 * 384
    same = make_plan(2000, 1500, 1000, "float32", reads_c=True, **kw)
    wider = make_plan(2000, 1500, 1000, "float32", reads_c=True, out_dtype="float64", **kw)
    narrower = make_plan(2000, 1500, 1000, "float32", reads_c=True, out_dtype="float16", **kw)
    assert same.convert_bytes == 0 and same.host_bytes == same.device_bytes
    # old C read as stored (a tile per C slot), and each tile written converted
    assert wider.convert_bytes == (2 + 1) * 8 * tile
    assert wider.host_bytes == wider.device_bytes + wider.convert_bytes
    assert "converting C's float64" in str(wider)
    # old C widened within its buffer: only the writes convert
    assert narrower.convert_bytes == 2 * tile
    # the budget holds the conversion
    fits = make_plan(2000, 1500, 1000, "float32", reads_c=True, out_dtype="float64",
                     device_budget=wider.device_bytes, staging=False)
    assert fits.host_bytes <= fits.host_budget
