"""How a Plan prints: the table ``str(plan)`` shows (see :mod:`.schedule`)."""

from __future__ import annotations

from ..units import format_bytes, format_seconds
from .decode import decoded_passes, host_total


def table(p) -> str:
    """A plan as printed: one line per fact, names aligned."""
    ta, tb = ("A^T" if p.trans_a else "A"), ("B^T" if p.trans_b else "B")
    if p.symmetric:
        tb = "A" if p.trans_a else "A^T"
    rows = [
        ("product", f"C[{p.m} x {p.n}] = {ta} @ {tb}, depth {p.k}, {p.dtype}"
                    + (f" (C in {p.written_dtype})" if p.written_dtype != p.dtype else "")
                    + (", Gram (symmetric)" if p.symmetric else "")),
        *([("arithmetic", p.arithmetic)] if p.arithmetic else []),
        ("loop order", p.order),
        ("C tiles", f"{p.ni} x {p.nj} = {p.n_tiles} tiles of {p.bm} x {p.bn}"
                    if not p.symmetric else
                    f"{p.n_tiles} of {p.ni} x {p.nj} tiles of {p.bm} x {p.bn}"
                    f" (on and above the diagonal; "
                    + ("zeros below)" if p.upper else "mirrored below)")),
        ("K panels", f"{p.nk} per tile, depth {p.bk}"
                     + (f"; the last {p.tail} tile by tile" if p.order == "resident-c"
                        else "")
                     + (f"; A loaded {p.a_span} at a time" if p.a_span > 1 else "")),
        ("device memory", f"{format_bytes(p.device_bytes)} of {format_bytes(p.device_budget)}"
                          f" (C {p.c_slots}, A {p.a_slots}, B {p.b_slots} slots"
                          + (", the split panels' workspace)" if p.splits_ahead
                             else f", the rounded {'B' if p.trans_a else 'A'} panel's copy)"
                             if p.rounds_one_ahead else ")")),
        ("host staging", f"{format_bytes(p.host_bytes)} of {format_bytes(p.host_budget)}"
                         + _host_notes(p)
                         + (f"; {format_bytes(host_total(p))} with the decode "
                            f"buffers" if p.decoding else "")),
        *([("decode buffers", _decoding(p))] if p.decoding else []),
        ("read", f"{format_bytes(p.bytes_read)} (A x{_times(p.a_passes)}{_stored(p, 'A')}, "
                 f"B x{_times(p.b_passes)}{_stored(p, 'B')}"
                 + (f", C x1{_stored(p, 'C')})" if p.reads_c else ")")),
        ("written", format_bytes(p.bytes_written)),
        ("lower bound", f"{format_bytes(p.lower_bound_bytes)}; plan moves "
                        f"{p.bound_ratio:.2f}x the bound"),
        ("flops", f"{p.flops:.3e}" + (f" (the upper triangle: the general product "
                                      f"does {2 * p.m * p.n * p.k:.3e})"
                                      if p.symmetric else "")),
    ]
    if p.a_chunks or p.b_chunks:
        def chunks(c) -> str:
            return f"{c[0]} x {c[1]}" if c else "none (contiguous)"

        rows.append(("input chunks", f"A {chunks(p.a_chunks)}, B {chunks(p.b_chunks)}"))
    t = p.predicted_seconds
    if t is not None and p.files:
        rows.append(("files", p.files))
    if t is not None:
        from .model import Rates  # (the model imports the schedule, which prints)

        timed = (p.rates.shape_flops(p.bm, p.bn, p.bk) if isinstance(p.rates, Rates)
                 else None)  # a plan may be timed by any model of time
        rows.append(("predicted time", format_seconds(t) + (
            f" (its steps timed at their shape: {timed / 1e12:.1f} TFLOP/s)" if timed else "")))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _host_notes(p) -> str:
    """What the host bytes are, for the printed plan: shared with compute (no staging), the
    user's arrays copied in place, the bytes converting C."""
    notes = [] if p.staging else ["shared with compute"]
    if p.staging and p.in_place:
        notes.append(f"{', '.join(p.in_place)} copied in place")
        reg = ", ".join(op for op in p.in_place if op in p.registered)
        notes += [f"{reg} page-locked for the run"] if reg else []
    if p.convert_bytes:
        notes.append(f"{format_bytes(p.convert_bytes)} converting C's {p.written_dtype}")
    return f" ({'; '.join(notes)})" if notes else ""


def _stored(p, op: str) -> str:
    """" in float16", where operand ``op`` is read in another dtype than it is multiplied in
    (C: than the tiles')."""
    name = p.written_dtype if op == "C" else p.a_dtype if op == "A" else p.b_dtype
    return f" in {name}" if name not in (None, p.c_dtype if op == "C" else p.dtype) else ""


def _decoding(p) -> str:
    """The decode buffers of compressed inputs, and how often panels that cut their chunks
    decode them."""
    d = p.decoding
    parts = [f"{op} {t} reader{'s' if t > 1 else ''} x {format_bytes(per)}"
             + (f" (a {c[0]} x {c[1]} chunk and its stored bytes)" if c else "")
             for op, per, t, c in zip("AB", d.per, d.threads, (p.a_chunks, p.b_chunks)) if per]
    cut = [f"; {op}'s chunks decoded up to {x:.2f}x a pass"
           for op, x, per in zip("AB", decoded_passes(p), d.per) if per and x > 1]
    return f"{format_bytes(d.bytes)}: {', '.join(parts)}" + "".join(cut)


def _times(passes: float) -> str:
    """A count of passes as printed: whole counts as integers."""
    return str(int(passes)) if float(passes).is_integer() else f"{passes:.2f}"
