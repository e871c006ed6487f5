"""``bench_e2e.py --parts verify,kernels``: what checksums cost a run, on the device and end
to end."""

from __future__ import annotations

import time

import numpy as np

import bigmm
from e2e_common import F32, log, read_all, time_gpu


def verify_overhead(spec_a, spec_b, a, b, n, memory, ref, d, repeat, res):
    """Median seconds with and without verify="checksum", on the files (warm) and on host
    arrays, runs alternating; overhead = checked / unchecked - 1."""
    c_spec = f"{d / 'c_verify.h5'}:/C"
    c_host = np.empty((n, n), F32)
    jobs = {"h5": lambda v: bigmm.matmul(spec_a, spec_b, c_spec, overwrite=True, stats=True,
                                         memory=memory, backend="cupy", verify=v),
            "host": lambda v: bigmm.matmul(a, b, c_host, overwrite=True, stats=True,
                                           memory=memory, backend="cupy", verify=v)}
    out = {}
    for where, job in jobs.items():
        times: dict = {None: [], "checksum": []}
        checks = {}
        for i in range(repeat + 1):  # the first round warms the page cache and the kernels
            # alternate which goes first, so that neither always follows the other
            for v in ((None, "checksum") if i % 2 == 0 else ("checksum", None)):
                t0 = time.perf_counter()
                _, stats = job(v)
                t = time.perf_counter() - t0
                if i == 0:
                    buf = c_host if where == "host" else np.empty((n, n), F32)
                    if where == "h5":
                        read_all(c_spec, buf)
                    ref.check(buf, f"bigmm {where} verify={v}")
                    checks[str(v)] = {"tiles_checked": stats.tiles_checked,
                                      "mismatches": stats.checksum_mismatches}
                else:
                    times[v].append(t)
        off, on = float(np.median(times[None])), float(np.median(times["checksum"]))
        best_off, best_on = min(times[None]), min(times["checksum"])
        # each round's two runs back to back: the median of their ratios, and a bootstrap
        # 90% interval of that median (rounds resampled)
        pairs = np.array(times["checksum"]) / np.array(times[None])
        rng = np.random.default_rng(0)
        boot = np.median(rng.choice(pairs, (2000, pairs.size)), axis=1)
        lo, hi = (float(x) for x in np.percentile(boot, [5, 95]))
        paired = float(np.median(pairs))
        out[where] = {"seconds_off": off, "seconds_on": on, "overhead_percent": 100 * (on / off - 1),
                      "best_off": best_off, "best_on": best_on,
                      "overhead_percent_best": 100 * (best_on / best_off - 1),
                      "overhead_percent_paired": 100 * (paired - 1),
                      "paired_interval_90": [100 * (lo - 1), 100 * (hi - 1)],
                      "runs_off": times[None], "runs_on": times["checksum"], "checks": checks}
        log(f"verify overhead, {where}: {off:.3f} s off, {on:.3f} s with checksums "
            f"(median of {repeat}): {100 * (on / off - 1):+.2f}%; median of the {repeat} "
            f"rounds' ratios {100 * (paired - 1):+.2f}% (90% interval {100 * (lo - 1):+.2f} to "
            f"{100 * (hi - 1):+.2f}%); best {best_off:.3f} and {best_on:.3f} s: "
            f"{100 * (best_on / best_off - 1):+.2f}%; {checks}")
    (d / "c_verify.h5").unlink(missing_ok=True)
    out["device"] = checksum_device_cost(spec_a, spec_b, memory, repeat)
    res["verify_overhead"] = out


def checksum_device_cost(spec_a, spec_b, memory, repeat) -> dict:
    """GPU time of the checksum work of the run's plan against its gemms (:func:`time_gpu`,
    median of ``repeat``): the overhead where the compute stream is the busiest stage, and the
    host's time to issue each part. Two figures:
    a step whose panels are both new (both panels' vectors, the step's sums) and the whole
    schedule (each panel's vectors as often as the plan loads it, every step's sums, every
    tile's finish)."""
    import cupy

    from bigmm.backends import get_backend
    from bigmm.checksum import TileChecksums

    be = get_backend("cupy")
    try:
        p = bigmm.plan(spec_a, spec_b, memory=memory, backend="cupy")
        rng = cupy.random.default_rng(0)
        a, b, c = (be.view(be.device_buffer(r * k, F32), (r, k))
                   for r, k in ((p.bm, p.bk), (p.bk, p.bn), (p.bm, p.bn)))
        for x in (a, b):
            x[...] = rng.standard_normal(x.shape, dtype=F32)
        ck = TileChecksums(be, p, 1.0, 0.0)
        st = next(iter(p.steps()))
        s = be.stream()
        fused = ck.step(st, a, b, c, s)  # the gemm's own updates, where it does them
        checked = {"checks": fused} if fused is not None else {}
        prepared = be.gemm_launcher(a, b, c, 1.0, 0.0, False, False, **checked)
        parts = {"gemm": lambda: be.gemm(a, b, c, 1.0, 0.0, False, False, s),
                 "gemm_checked": lambda: be.gemm(a, b, c, 1.0, 0.0, False, False, s, **checked),
                 "gemm_checked_prepared": lambda: prepared(s),
                 "landed_a": lambda: ck.landed("A", st.a_slot, a, s),
                 "landed_b": lambda: ck.landed("B", st.b_slot, b, s),
                 "step_sums": lambda: ck.step(st, a, b, c, s),
                 "finish_per_tile": lambda: ck.finish(st, c, s)}
        timed = {k: time_gpu(fn, s, repeat) for k, fn in parts.items()}
    finally:
        be.close()
    t = {k: v[0] for k, v in timed.items()}
    issue = {k: v[1] for k, v in timed.items()}
    steps = list(p.steps())
    loads_a, loads_b = sum(x.load_a for x in steps), sum(x.load_b for x in steps)
    t["fused"] = fused is not None
    # a step's own sums: separate launches, or what the updates add to the gemm
    t["step_sums"] += max(0.0, t["gemm_checked"] - t["gemm"]) if fused is not None else 0.0
    t["checks_per_step"] = t["landed_a"] + t["landed_b"] + t["step_sums"]
    per_k = len(p.k_panels())
    both_new = (per_k * t["checks_per_step"] + t["finish_per_tile"]) / (per_k * t["gemm"])
    schedule = (loads_a * t["landed_a"] + loads_b * t["landed_b"] + len(steps) * t["step_sums"]
                + p.n_tiles * t["finish_per_tile"]) / (len(steps) * t["gemm"])
    log("checksum host issue time: " + ", ".join(f"{k} {1e6 * v:.0f} us" for k, v in issue.items()))
    log(f"checksum device cost per {p.bm}x{p.bn}x{p.bk} step: gemm {1e3 * t['gemm']:.3f} ms "
        f"({1e3 * t['gemm_checked']:.3f} ms with the updates, fused: {t['fused']}); "
        f"A vectors {1e3 * t['landed_a']:.3f} ms, B vectors {1e3 * t['landed_b']:.3f} ms, "
        f"step sums {1e3 * t['step_sums']:.3f} ms, finish {1e3 * t['finish_per_tile']:.3f} ms "
        f"per tile: {100 * both_new:.2f}% of the compute with both panels new at every step, "
        f"{100 * schedule:.2f}% over the schedule ({loads_a} A and {loads_b} B loads in "
        f"{len(steps)} steps)")
    return {"tile": [p.bm, p.bn, p.bk], "steps_per_tile": per_k, "steps": len(steps),
            "loads_a": loads_a, "loads_b": loads_b, **t, "host_issue_seconds": issue,
            "overhead_percent_of_compute": 100 * both_new,
            "overhead_percent_of_compute_schedule": 100 * schedule}


def checksum_kernels(a, b, memory, repeat, res) -> None:
    """GB/s (bytes read / GPU time, :func:`time_gpu`) of the checksum kernels on panels of the
    run's plan, each way
    (column sums: columns contiguous; row sums: the transposed view, rows contiguous), the
    path the layout gets and the generic one, against a device-to-device copy of the panel
    (bytes read + written / time). Panels that fit in L2 (50 MB on an H100) may be served
    from it when timed back to back."""
    import cupy

    from bigmm.backends import cuda_checksums

    p = bigmm.plan(a, b, memory=memory, backend="cupy")
    s = cupy.cuda.Stream(non_blocking=True)
    rng = cupy.random.default_rng(0)
    rows: list = []
    out = {"plan_tile": [p.bm, p.bn, p.bk], "rows": rows}
    with s:
        for panel, shape in (("A", (p.bm, p.bk)), ("B", (p.bk, p.bn))):
            x = rng.standard_normal(shape, dtype=F32)
            dst = cupy.empty_like(x)
            copy = lambda x=x, dst=dst: cupy.cuda.runtime.memcpyAsync(  # noqa: E731
                dst.data.ptr, x.data.ptr, x.nbytes, 3, s.ptr)
            t, issue = time_gpu(copy, s, repeat)
            rows.append({"panel": panel, "shape": list(shape), "sums": "copy", "path": "copy",
                         "seconds": t, "issue_seconds": issue, "gb_per_s": 2 * x.nbytes / t / 1e9})
            log(f"checksum kernels, {panel} panel {shape[0]}x{shape[1]}: copy {1e6 * t:.1f} us, "
                f"{rows[-1]['gb_per_s']:.0f} GB/s (read + write)")
            for sums, v in (("column", x), ("row", x.T)):
                w = rng.standard_normal(v.shape[0], dtype=np.float64)
                wa = cupy.abs(w)
                want = w @ v.astype(np.float64), wa @ cupy.abs(v.astype(np.float64))
                for force in (None, "generic"):
                    o, o_abs = cupy.empty(v.shape[1]), cupy.empty(v.shape[1])
                    run = lambda v=v, w=w, wa=wa, o=o, o_abs=o_abs, force=force: (  # noqa: E731
                        cuda_checksums.weighted_sums(v, o, o_abs, weights=w, abs_weights=wa,
                                                   stream=s, path=force))
                    path = run()
                    s.synchronize()
                    for got, ref in zip((o, o_abs), want):
                        err = float(cupy.max(cupy.abs(got - ref)) / cupy.max(want[1]))
                        assert err < 1e-12, f"{panel} {sums} sums ({path}): error {err:.2e}"
                    t, issue = time_gpu(run, s, repeat)
                    rows.append({"panel": panel, "shape": list(v.shape), "sums": sums,
                                 "path": path, "seconds": t, "issue_seconds": issue,
                                 "gb_per_s": x.nbytes / t / 1e9})
                    log(f"checksum kernels, {panel} panel {sums} sums ({path}): "
                        f"{1e6 * t:.1f} us, {rows[-1]['gb_per_s']:.0f} GB/s; issued in "
                        f"{1e6 * issue:.0f} us")
                del want
            del x, dst
    cupy.get_default_memory_pool().free_all_blocks()
    res["checksum_kernels"] = out
