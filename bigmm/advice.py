"""Advice on budgets: whether the budgets a job is given make its plan much slower than the
default budgets would, and the smallest budget that would help (one line for the CLI and
:func:`bigmm.api.budget_note`)."""

from __future__ import annotations

from .job import plan_job
from .planner import Plan
from .units import format_seconds

#: A plan predicted this many times slower than the default budgets', and by at least
#: NOTE_SECONDS, gets a note (:func:`budget_note`), which names the smallest budget within
#: NOTE_NEAR of the default's time, trying budgets NOTE_STEP times apart.
NOTE_SLOWER, NOTE_SECONDS, NOTE_NEAR, NOTE_STEP = 2.0, 1.0, 1.25, 4


def budget_note(A, B, out, be, p: Plan, *, memory, host_memory, **kw) -> str | None:
    """One line when the budgets given (``memory``, ``host_memory``: those not None) make
    ``p`` predicted NOTE_SLOWER times as slow as the default budgets' plan or slower (and
    NOTE_SECONDS slower at least): the
    two predicted times, and the smallest of the given budgets times NOTE_STEP, NOTE_STEP^2,
    ... (at most the defaults) whose plan comes within NOTE_NEAR of the default's time.
    None where no budget was given, a plan has no predicted time, or it is not that slow.
    ``kw``: the other arguments of :func:`plan_job` (a resumed schedule is not advised on)."""
    if (memory is None and host_memory is None) or kw.get("resume") or not p.predicted_seconds:
        return None
    within = min(p.device_budget, p.host_budget)  # the note measures within the budgets given
    kw = dict(kw, measure_within=within, timed={})  # and its plans under one timing
    default = plan_job(A, B, out, be, memory=None, host_memory=None, **kw)[0]
    t, best = p.predicted_seconds, default.predicted_seconds
    if not best or t < NOTE_SLOWER * best or t - best < NOTE_SECONDS:
        return None
    factor = NOTE_STEP
    tops = {"memory": default.device_budget, "host_memory": default.host_budget}
    while True:
        budgets = {name: min(given * factor, tops[name]) for name, asked, given in (
            ("memory", memory, p.device_budget), ("host_memory", host_memory, p.host_budget))
            if asked is not None}
        if all(v >= tops[name] for name, v in budgets.items()):
            q = default  # the default budgets: their plan, as predicted above
            break
        q = plan_job(A, B, out, be, **{"memory": None, "host_memory": None, **budgets}, **kw)[0]
        if q.predicted_seconds <= NOTE_NEAR * best:
            break
        factor *= NOTE_STEP
    given = " and ".join(f"{name}={size_arg(v)}" for name, v in (
        ("memory", p.device_budget), ("host_memory", p.host_budget))
        if (memory if name == "memory" else host_memory) is not None)
    helps = " ".join(f"{name}={size_arg(v)}" for name, v in budgets.items())
    return (f"note: {given} makes this plan about {t / best:.0f}x slower than the default "
            f"budgets would ({format_seconds(t)} predicted against {format_seconds(best)}); "
            f"{helps} is predicted to take {format_seconds(q.predicted_seconds)}")


def size_arg(nbytes: int) -> str:
    """A budget as ``memory=`` takes it, in the largest unit that writes it whole."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return str(nbytes)
