"""The planner's loop orders a benchmark runs under: all of them (what users get), those of
before the orders keeping one operand whole were added, or all with whole-a/-b tiles down to a
quarter of C's width, to compare them in one run."""

from __future__ import annotations

from bigmm.planner import search

ALL_ORDERS = search.ORDERS
#: The ``plans`` values benchmarks take: "all", "resident" (whole-a and whole-b not tried), or
#: "quarter" (all, whole-a/-b tiles as narrow as a quarter of C where they divide it).
PLANS = ("all", "resident", "quarter")
_LEFT_OUT = search._whole_left_out


def _quarter_left_out(order: str, bm: int, bn: int, m: int, n: int) -> bool:
    if order == "whole-b" and 2 * bn < n:
        return bn >= n or 4 * bn < n or n % bn != 0
    if order == "whole-a" and 2 * bn < n:
        return bm >= m or 4 * bn < n or n % bn != 0
    return _LEFT_OUT(order, bm, bn, m, n)


def use_orders(plans: str) -> None:
    """Plan the runs that follow with ``plans`` (see PLANS); cached plans are dropped."""
    if plans not in PLANS:
        raise SystemExit(f"Expected plans {' or '.join(PLANS)}. Got {plans!r}.")
    search.ORDERS = tuple(o for o in ALL_ORDERS
                          if plans != "resident" or o not in search.WHOLE_ORDERS)
    search._whole_left_out = _quarter_left_out if plans == "quarter" else _LEFT_OUT
    search.make_plan.cache_clear()
