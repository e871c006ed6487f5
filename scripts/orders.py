"""The planner's loop orders a benchmark runs under: all of them (what users get), or those of
before the orders keeping one operand whole were added, to compare the two in one run."""

from __future__ import annotations

from bigmm.planner import search

ALL_ORDERS = search.ORDERS
#: The ``plans`` values benchmarks take: "all", or "resident" (whole-a and whole-b not tried).
PLANS = ("all", "resident")


def use_orders(plans: str) -> None:
    """Plan the runs that follow with ``plans`` (see PLANS); cached plans are dropped."""
    if plans not in PLANS:
        raise SystemExit(f"Expected plans {' or '.join(PLANS)}. Got {plans!r}.")
    search.ORDERS = tuple(o for o in ALL_ORDERS
                          if plans == "all" or o not in search.WHOLE_ORDERS)
    search.make_plan.cache_clear()
