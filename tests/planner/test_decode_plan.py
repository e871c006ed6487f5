"""Decode buffers in the plan: the staging and the buffers compressed chunks are decoded into
fit the host budget together, as many readers decode as the rest of the budget holds, a budget
below one decoded chunk is refused, and the panels avoid decoding a chunk more than once where
they can."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_cases import plan_or_none, problems

from bigmm.errors import BudgetError
from bigmm.planner import make_plan
from bigmm.planner.decode import Decoding, decoded_bytes, decoded_passes, offered

MiB = 1 << 20
#: An 8000 x 4000 float32 A stored in zstd chunks of 2000 x 2000 (one decoded chunk and its
#: stored bytes: 30.5 MB), times a 4000 x 256 B read as stored.
JOB = dict(m=8000, n=256, k=4000, staging=False, a_chunks=(2000, 2000))
CHUNK = 16_000_000 + 14_500_000


def decoding_of(readers: int = 2) -> Decoding:
    return offered((CHUNK, 0), (readers, 0))


@st.composite
def decoded_problems(draw):
    """Random problems whose inputs are decoded: per input a chunk's bytes or nothing, and
    the readers that could decode it."""
    kw = draw(problems())
    per = tuple(draw(st.sampled_from([0, 64, 4096, 50_000])) if chunks else 0
                for chunks in (kw["a_chunks"], kw["b_chunks"]))
    most = tuple(draw(st.integers(1, 16)) for _ in range(2))
    return dict(kw, decoding=offered(per, most))


@settings(max_examples=300, deadline=None)
@given(decoded_problems())
def test_staging_and_decode_buffers_fit_the_host_budget(kw):
    p = plan_or_none(kw)
    if p is None or p.decoding is None:
        return
    d = p.decoding
    assert p.host_bytes + d.bytes <= p.host_budget
    for per, most, threads in zip(d.per, d.most, d.threads):
        assert (1 <= threads <= most) if per else threads == 0
    # as many readers decode as the rest of the budget holds: one more would not fit
    for i in (0, 1):
        if d.per[i] and d.threads[i] < d.most[i]:
            assert p.host_bytes + d.bytes + d.per[i] > p.host_budget


@settings(max_examples=150, deadline=None)
@given(decoded_problems())
def test_a_budget_below_one_decoded_chunk_states_the_minimum_and_the_minimum_works(kw):
    kw = dict(kw, device_budget=8, host_budget=None)
    with pytest.raises(BudgetError) as exc:
        make_plan(**kw)
    minimum = exc.value.minimum
    assert str(minimum) in str(exc.value)
    p = make_plan(**dict(kw, device_budget=minimum))
    assert p.host_bytes + (p.decoding.bytes if p.decoding else 0) <= minimum


@pytest.mark.parametrize("budget, threads", [
    (48, 1),    # the tiles take what one decoded chunk leaves
    (160, 2),   # room for both readers beside the staging
    (512, 2),   # no more than the readers that could decode
])
def test_the_decoding_readers_are_as_many_as_the_budget_holds(budget, threads):
    p = make_plan(**JOB, device_budget=budget * MiB, decoding=decoding_of(2))
    assert p.decoding.threads == (threads, 0)
    assert p.host_bytes + p.decoding.bytes <= p.host_budget
    room = (p.host_budget - p.host_bytes) // CHUNK
    assert p.decoding.threads[0] == min(2, room)


def test_without_decoding_the_plan_is_unchanged():
    assert make_plan(**JOB, device_budget=48 * MiB, decoding=offered((0, 0), (2, 2))) == \
        make_plan(**JOB, device_budget=48 * MiB)


@pytest.mark.parametrize("budget", [4, 16])  # below a decoded chunk; the staging alone fits
def test_a_budget_below_a_decoded_chunk_names_the_chunk(budget):
    make_plan(**JOB, device_budget=budget * MiB)  # fits without counting the chunk
    with pytest.raises(BudgetError) as exc:
        make_plan(**JOB, device_budget=budget * MiB, decoding=decoding_of())
    msg = str(exc.value)
    assert msg.startswith("Expected a host memory budget of at least") and "Got " in msg
    assert "A's 2000 x 2000" in msg and "smaller chunks" in msg and "\n" not in msg
    assert exc.value.minimum > CHUNK
    p = make_plan(**JOB, device_budget=exc.value.minimum, decoding=decoding_of())
    assert p.decoding.threads == (1, 0)


def test_tiles_keep_the_chunk_rows_where_k_panels_must_cut_the_chunks():
    # no tile aligned to the chunks fits beside a decoded one: the tiles keep whole chunk
    # rows and the K panels cut them, so that a tile's panels in a chunk decode it once
    p = make_plan(**JOB, device_budget=48 * MiB, decoding=decoding_of())
    assert p.bm % 2000 == 0 and 2000 % p.bk != 0
    assert decoded_passes(p) == (1.0, 1.0)
    assert decoded_bytes(p) == 4 * p.m * p.k


def test_panels_that_cut_chunk_rows_show_how_often_they_decode_them():
    p = make_plan(**JOB, device_budget=32 * MiB, decoding=decoding_of())
    assert p.bm < 2000
    passes = decoded_passes(p)[0]
    # every tile row decodes the chunk rows its rows meet, whole
    rows = sum(min(8000, -(-min(8000, r + p.bm) // 2000) * 2000) - r // 2000 * 2000
               for r in range(0, 8000, p.bm))
    assert passes == pytest.approx(rows / 8000)
    assert f"A's chunks decoded up to {passes:.2f}x a pass" in str(p)


def test_a_resumed_schedule_keeps_its_tiles_and_widens_its_decoding():
    p = make_plan(**JOB, device_budget=160 * MiB, decoding=decoding_of())
    assert p.decoding.threads == (2, 0)
    again = make_plan(**JOB, device_budget=160 * MiB, decoding=decoding_of(),
                      tile=(p.bm, p.bn, p.bk), order=p.order)
    assert again == p


def test_the_plan_prints_and_carries_its_decode_buffers():
    p = make_plan(**JOB, device_budget=48 * MiB, decoding=decoding_of())
    text = str(p)
    row = next(line for line in text.splitlines() if line.startswith("decode buffers"))
    assert "A 1 reader x 29.09 MiB" in row and "2000 x 2000 chunk" in row, text
    assert "with the decode buffers" in text
    d = json.loads(json.dumps(p.to_dict()))
    assert d["decode_bytes"] == CHUNK and d["decoding"]["threads"] == [1, 0]
    assert "decode buffers" not in str(make_plan(**JOB, device_budget=48 * MiB))
