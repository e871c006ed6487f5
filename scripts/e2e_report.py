"""``bench_e2e.py``'s table: each part's figures against its target."""

from __future__ import annotations


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def storage_lines(res) -> list[str]:
    """The HDF5 job against the storage floor, dask.array + CuPy, and the bounded job."""
    lines = []
    fl, dk, bd = res.get("storage_floor"), res.get("dask"), res.get("bounded")
    if fl:
        for cache in ("cold", "warm"):
            vs = ", ".join(f"{k.split('_', 1)[1]} {v['seconds']:.2f}"
                           for k, v in fl["variants"].items() if k.startswith(cache))
            lines.append(f"storage floor {cache}: {fl[f'floor_{cache}_seconds']:.2f} s "
                         f"({fl[f'floor_{cache}_by']}; all: {vs} s)")
    for layout, bh5 in res.get("bigmm_h5", {}).items():
        for r in bh5["runs"]:
            note = ""
            if fl:
                f = fl[f"floor_{r['cache']}_seconds"]
                ratio = r["seconds"] / f
                note = f" -> {ratio:.2f}x the floor"
                if r["writes"] == "auto":
                    note += f" [<= 1.1: {_verdict(ratio <= 1.1)}]"
            busy = ", ".join(f"{k} {v:.2f}" for k, v in r["busy"].items() if v)
            lines.append(f"HDF5 {layout} {r['cache']} writes={r['writes']} "
                         f"({r.get('plan', '')}): bigmm "
                         f"{r['seconds']:.2f} s{note}; busy {busy} s")
        for cache in ("cold", "warm"):
            runs = {k: v for k, v in (dk or {}).items()
                    if k.startswith(cache + "_") and layout == res.get("dask_layout")}
            if runs and cache in bh5:
                kb, vb = min(runs.items(), key=lambda kv: kv[1]["seconds"])
                sp = vb["seconds"] / bh5[cache]["seconds"]
                lines.append(f"  {cache}: dask+CuPy best {vb['seconds']:.2f} s (chunks "
                             f"{kb.split('_')[1]}) -> bigmm {sp:.2f}x faster "
                             f"[>= 2: {_verdict(sp >= 2)}]")
    if bd and "result" in bd:
        r = bd["result"]
        note = ""
        if fl:
            ratio = r["child"]["seconds"] / fl["floor_cold_seconds"]
            note = f" -> {ratio:.2f}x the cold floor [<= 1.15: {_verdict(ratio <= 1.15)}]"
        lines.append(f"bounded job (memory.max {r['limit_text']}): {r['child']['seconds']:.2f} s"
                     f"{note}; peak {r['peak'] / 2**30:.2f} GiB (anon "
                     f"{r['peak_anon'] / 2**30:.2f}, page cache {r['peak_file'] / 2**30:.2f}), "
                     f"VmHWM {r['child']['vm_hwm']}")
        for kind, o in bd.get("plans", {}).items():
            if o.get("child"):
                lines.append(f"  plans {kind}: {o['child']['seconds']:.2f} s")
    elif bd:
        lines.append(f"bounded job: {bd.get('unavailable') or 'failed at every limit'}")
    return lines


def summary_table(res) -> str:
    n = res["n"]
    lines = [f"== bench_e2e n={n} float32, device budget {res['memory']}, {res['device']} =="]
    ic, bh, xt = res.get("in_core"), res.get("bigmm_host"), res.get("cublasxt")

    def row(label, d, note=""):
        lines.append(f"{label:22s} {d['tflops']:6.1f} TFLOP/s  {d['seconds']:8.3f} s  {note}")

    if ic and "bigmm" in ic:
        row("in-core bigmm kernel", ic["bigmm"], "device-resident operands")
    if ic:
        row("in-core cuBLAS", ic["cublas"], "device-resident operands")
    if xt:
        for mode in ("pageable", "pinned"):
            b = xt[mode + "_best"]
            row(f"cuBLASXt {mode}", b, f"best block {b['block']}")
    if bh and ic:
        own, cub = bh["bigmm"], bh["cublas"]
        r = own["tflops"] / ic["bigmm"]["tflops"]
        row("bigmm (own kernel)", own,
            f"{r:.3f} of in-core kernel [>= 0.95: {_verdict(r >= 0.95)}]")
        row("bigmm kernel=cublas", cub,
            f"{cub['tflops'] / ic['cublas']['tflops']:.3f} of in-core cuBLAS")
        if xt:
            rg = cub["tflops"] / xt["pageable_best"]["tflops"]
            rp = cub["tflops"] / xt["pinned_best"]["tflops"]
            lines.append(f"  kernel=cublas (pageable) vs cuBLASXt pageable {rg:.2f}x "
                         f"[>= 3: {_verdict(rg >= 3)}], vs cuBLASXt pinned {rp:.2f}x")
    if bh and ic and "cublas_pinned" in bh:
        own, cub = bh["bigmm_pinned"], bh["cublas_pinned"]
        row("bigmm pinned", own, f"{own['tflops'] / ic['bigmm']['tflops']:.3f} of in-core "
            f"kernel, {own['stats']['bytes_staged'] / 2**30:.2f} GiB staged")
        row("bigmm cublas pinned", cub, f"{cub['tflops'] / ic['cublas']['tflops']:.3f} of "
            f"in-core cuBLAS, {cub['stats']['bytes_staged'] / 2**30:.2f} GiB staged")
        if xt:
            rp = cub["tflops"] / xt["pinned_best"]["tflops"]
            lines.append(f"  kernel=cublas vs cuBLASXt, both from pinned arrays {rp:.2f}x "
                         f"[>= 1: {_verdict(rp >= 1)}]")
    if bh:
        for key, v in bh.items():
            if key not in ("bigmm", "cublas", "bigmm_pinned", "cublas_pinned"):
                row(f"bigmm {key}", v, f"C tile {v['plan']['bm']}x{v['plan']['bn']}")
    lines += storage_lines(res)
    for r in res.get("checksum_kernels", {}).get("rows", []):
        lines.append(f"checksum {r['panel']} panel {r['sums']:6s} {r['path']:8s} "
                     f"{1e6 * r['seconds']:8.1f} us {r['gb_per_s']:6.0f} GB/s")
    vo = res.get("verify_overhead", {})
    for where in ("h5", "host"):
        if where in vo:
            v = vo[where]
            lines.append(f"checksums, {where}: {v['seconds_off']:.3f} s off, {v['seconds_on']:.3f}"
                         f" s on: {v['overhead_percent']:+.2f}% (medians); median of the "
                         f"rounds' ratios {v['overhead_percent_paired']:+.2f}% (90% "
                         f"{v['paired_interval_90'][0]:+.2f} to {v['paired_interval_90'][1]:+.2f}%)"
                         f"; best of each {v['overhead_percent_best']:+.2f}%")
    if "device" in vo:
        dv = vo["device"]
        lines.append(f"checksums on the device: {dv['overhead_percent_of_compute']:.2f}% of the "
                     f"gemm time with both panels new, {dv['overhead_percent_of_compute_schedule']:.2f}%"
                     f" over the schedule")
    return "\n".join(lines)
