"""The planner's choices kept between the processes of one machine.

With a GPU's rates the planner searches tiles, loop orders and resident-c's tails by its
pipeline model, which for a large job takes a sizeable share of a warm CLI run (see
BENCHMARKS.md). The planner is pure: the same arguments (shapes, dtypes, budgets, chunks, the
machine's rates) give the same plan. So the schedule it chose is kept in the store of
calibrations (:mod:`.calibration`: this machine, this boot, this code and Python; nothing
where ``BIGMM_CALIBRATION=off``) under a digest of the arguments, and a later process
rebuilds the plan from it through the planner's fixed path (``make_plan`` with the tiles,
order, tail and A span given), which checks it against the budgets again. A kept choice
that does not rebuild is searched again.

A later call in a process plans with the page-locked staging blocks earlier calls kept
(``Rates.kept_pinned``), which its arguments spell: they differ from a first call's. Where
nothing is kept under them, the schedule kept for the same arguments without those blocks
(the first call's, or an earlier process's) is taken: against a new search it can lose at
most the time pinning those blocks would take (the most any other plan saves by them)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from . import calibration
from .errors import BigmmError
from .planner import Plan, make_plan

#: The store's kind of figure for kept plans.
KIND = "plan"
#: Plans kept at most (the newest).
LIMIT = 64


def plan(m: int, n: int, k: int, dtype: str, **kw) -> Plan:
    """``make_plan(m, n, k, dtype, **kw)``, the schedule a search by time (``rates`` given)
    chose kept for later processes, and taken from there where an earlier one kept it (a
    search by bytes, without rates, is quick: not kept)."""
    if (kw.get("tile") is not None or kw.get("rates") is None
            or calibration.mode() == "off"):
        return make_plan(m, n, k, dtype, **kw)
    key = digest(m, n, k, dtype, kw)
    kept = calibration.recall(KIND, key, note=False)
    if kept is None and kw["rates"].kept_pinned:  # a later call: as without the blocks
        kept = calibration.recall(KIND, digest(m, n, k, dtype, dict(
            kw, rates=replace(kw["rates"], kept_pinned=()))), note=False)
    if kept is not None:
        try:
            return make_plan(m, n, k, dtype, **kw, **schedule(kept))
        except (BigmmError, KeyError, TypeError, ValueError):  # of another form: searched
            pass
    p = make_plan(m, n, k, dtype, **kw)
    calibration.keep(KIND, key, choice(p), limit=LIMIT)
    return p


def choice(p: Plan) -> dict:
    """What identifies the schedule a search chose (JSON)."""
    return {"tile": [p.bm, p.bn, p.bk], "order": p.order, "tail": p.tail,
            "a_span": p.a_span}


def schedule(kept: dict) -> dict:
    """``make_plan``'s arguments fixing the schedule of a kept :func:`choice`."""
    order, span = str(kept["order"]), int(kept["a_span"])
    return {"tile": tuple(int(x) for x in kept["tile"]), "order": order,
            "tail": int(kept["tail"]) if order == "resident-c" else None,
            "a_span": span if span > 1 else None}


def digest(m: int, n: int, k: int, dtype: str, kw: dict) -> str:
    """A digest of the planner's arguments (rates and decode buffers by their reprs, which
    spell every field; floats exactly)."""
    text = json.dumps([m, n, k, dtype, kw], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
