#!/usr/bin/env python3
"""CI check of bigmm's CUDA kernels without a GPU.

Compiles every kernel (each tile config of bigmm/backends/kernel_table.json for the GEMM
families: gemm_regblock.cu, and gemm_tf32.cu for the TF32 and 3xTF32 configs; for one config
of each family and arithmetic also the Gram variant, -DBIGMM_UPPER=1; for each float32 config
the variant with the fused checksum updates, -DBIGMM_CHECKS=1; plus kernel 01, the FMA
probes, the split-K reduction and the ABFT checksums) with
``nvcc -cubin -Xptxas -v`` for sm_80 and sm_90 (the wgmma configs, gemm_wgmma.cu, for sm_90a
only, in place of sm_90) and fails when any kernel:

* spills or uses local memory (stack frame, spill stores or spill loads above 0 bytes), or
* misses its occupancy target: the ``min_blocks`` blocks per SM its config declares (at least
  one block of its threads), counting registers (64K per SM, allocated per warp in units of
  256) and shared memory (dynamic + static + 1 KB reserved per block, against the SM's limit), or
* (sm_90a) has its wgmma serialized by ptxas (warnings C7510-C7520 "Potential Performance
  Loss") or shows no HGMMA in its SASS (when cuobjdump is found), or
* (arch-specific configs, when libnvrtc is found) does not compile through NVRTC with the
  launcher's own options (bigmm/backends/cuda_kernels.py): NVRTC rejects some code that nvcc
  accepts, such as a declared-only template referenced from a branch that is dead for one
  instantiation.

Exit status: 0 pass, 1 a kernel failed, 2 nvcc missing or a compile error.
Usage: scripts/check_kernels.py [--arch sm_80 sm_90] [--jobs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels"
sys.path.insert(0, str(ROOT))
from bigmm.backends.cuda_direct import SMEM_BYTES as DIRECT_SMEM  # noqa: E402  (no GPU needed)
from bigmm.backends.kernel_configs import TileConfig  # noqa: E402  (no GPU needed to import)

TABLE = ROOT / "bigmm" / "backends" / "kernel_table.json"

# Per-SM limits: register file (32-bit registers) and shared memory usable by blocks (bytes).
SM_LIMITS = {
    "sm_80": {"regs": 65536, "smem": 167936, "smem_block": 166912, "threads": 2048},
    "sm_90": {"regs": 65536, "smem": 233472, "smem_block": 232448, "threads": 2048},
}
SM_LIMITS["sm_90a"] = SM_LIMITS["sm_90"]
RESERVED_SMEM = 1024  # per block, by the driver


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def find_cuobjdump(nvcc: str | None) -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    if nvcc and (Path(nvcc).parent / "cuobjdump").is_file():
        return str(Path(nvcc).parent / "cuobjdump")
    return None


def jobs_from_table() -> list[dict]:
    """One compile job per source variant: (file, defines, threads, smem, min_blocks)."""
    table = json.loads(TABLE.read_text())
    jobs = []
    upper = set()  # the Gram variant (-DBIGMM_UPPER=1): one config per family and arithmetic
    for name, c in table["configs"].items():
        cfg = TileConfig.from_dict(name, c)
        job = {
            "name": name, "file": cfg.source, "defines": list(cfg.defines()),
            "threads": cfg.threads, "dynamic_smem": cfg.smem_bytes, "min_blocks": cfg.min_blocks,
            "arch": cfg.arch, "entries": ["gemm_" + e for e in cfg.entries],
        }
        jobs.append(job)
        if cfg.precision == "float32":  # the fused checksum updates (float64's spill a little)
            jobs.append(dict(job, name=name + "+checks", defines=list(cfg.defines(checks=True)),
                             min_blocks=cfg.checks_blocks))
        kind = (cfg.source, cfg.dtype, cfg.precision)
        if kind not in upper:
            upper.add(kind)
            jobs.append(dict(job, name=name + "+upper",
                             defines=job["defines"] + ["-DBIGMM_UPPER=1"]))
    jobs.append({"name": "sgemm_01_naive_tiled", "file": "sgemm_01_naive_tiled.cu", "defines": [],
                 "threads": 256, "dynamic_smem": 0, "min_blocks": 1})
    jobs.append({"name": "peak_fma", "file": "peak_fma.cu", "defines": [],
                 "threads": 256, "dynamic_smem": 0, "min_blocks": 1})
    jobs.append({"name": "splitk_reduce", "file": "splitk_reduce.cu", "defines": [],
                 "threads": 256, "dynamic_smem": 0, "min_blocks": 1})
    jobs.append({"name": "abft_checksum", "file": "abft_checksum.cu", "defines": [],
                 "threads": 256, "dynamic_smem": 0, "min_blocks": 1})
    # TF32 and 3xTF32 from operands split ahead (sm_90a): the products (both 193 KB of shared
    # memory) and the split and rounding kernels
    jobs.append({"name": "gemm_wgmma_split", "file": "gemm_wgmma_split.cu", "defines": [],
                 "threads": 256, "dynamic_smem": 3 * 65536 + 1024, "min_blocks": 1,
                 "arch": "sm_90a", "entries": ["gemm_split", "gemm_round", "split_k", "split_r",
                                               "round_k", "round_r"],
                 "whole": True})
    # plain TF32 reading one operand as stored (sm_90a): the products (three warpgroups, 197
    # KB of shared memory) and the rounding of the other operand
    jobs.append({"name": "gemm_wgmma_direct", "file": "gemm_wgmma_direct.cu", "defines": [],
                 "threads": 384, "dynamic_smem": DIRECT_SMEM, "min_blocks": 1,
                 "arch": "sm_90a", "entries": ["gemm_direct_nn", "gemm_direct_tt", "round_tiles"],
                 "whole": True})
    return jobs


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_LMEM = re.compile(r"(\d+) bytes lmem")


def parse_ptxas(text: str) -> dict[str, dict]:
    """Per entry function: registers, stack frame, spills, static smem, lmem."""
    out: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = out.setdefault(m.group(1), {"regs": 0, "stack": 0, "spill_st": 0, "spill_ld": 0,
                                                  "smem": 0, "lmem": 0})
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            current["stack"], current["spill_st"], current["spill_ld"] = map(int, m.groups())
        m = _USED.search(line)
        if m:
            current["regs"] = int(m.group(1))
            s = _SMEM.search(line)
            current["smem"] = int(s.group(1)) if s else 0
            lm = _LMEM.search(line)
            current["lmem"] = int(lm.group(1)) if lm else 0
    return out


def blocks_per_sm(regs: int, threads: int, smem: int, arch: str) -> int:
    lim = SM_LIMITS[arch]
    warps = -(-threads // 32)
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = lim["regs"] // (warps * regs_per_warp)
    by_threads = lim["threads"] // threads
    if smem + RESERVED_SMEM > lim["smem_block"] + RESERVED_SMEM:
        return 0
    by_smem = lim["smem"] // (smem + RESERVED_SMEM) if smem else by_threads
    return min(by_regs, by_threads, by_smem)


_SERIALIZED = re.compile(r"\(C75\d\d\) Potential Performance Loss[^\n]*")


def compile_job(nvcc: str, job: dict, arch: str, cuobjdump: str | None = None) -> dict:
    # an arch-specific target (sm_90a) only through -gencode: -arch=sm_90a also runs a plain pass
    target = (f"-gencode=arch=compute_{arch[3:]},code={arch}" if arch.endswith("a")
              else f"-arch={arch}")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cmd = [nvcc, target, "-cubin", "-std=c++17", "-Xptxas", "-v", "-I", str(KERNELS),
               *job["defines"], "-o", str(cubin), str(KERNELS / job["file"])]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sass = None
        if proc.returncode == 0 and job.get("arch") and cuobjdump:
            sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True,
                                  text=True).stdout
    log = proc.stdout + proc.stderr
    result = {"job": job["name"], "arch": arch, "cmd": " ".join(cmd), "ok": proc.returncode == 0,
              "log": log, "functions": {}, "serialized": _SERIALIZED.findall(log),
              "hgmma": None if sass is None else sass.count("HGMMA")}
    if proc.returncode == 0:
        result["functions"] = parse_ptxas(log)
    return result


def find_nvrtc(nvcc: str | None) -> str | None:
    """libnvrtc: $BIGMM_NVRTC, beside nvcc's toolkit, or on the loader's path."""
    import ctypes.util

    if os.environ.get("BIGMM_NVRTC"):
        return os.environ["BIGMM_NVRTC"]
    homes = [Path(nvcc).resolve().parent.parent] if nvcc else []
    homes += [Path(h) for h in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if h]
    for home in homes:
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
            found = sorted((home / sub).glob("libnvrtc.so*")) if (home / sub).is_dir() else []
            if found:
                return str(found[0])
    return ctypes.util.find_library("nvrtc")


def nvrtc_compile(lib_path: str, job: dict, entry: str) -> str | None:
    """Compile one entry of an arch-specific job as cuda_kernels does (the source with the header
    inlined, its options); None when it compiles, else NVRTC's log."""
    import ctypes

    from bigmm.backends import cuda_kernels as ck

    lib = ctypes.CDLL(lib_path)
    src = ck.kernel_source(job["file"]).encode()
    opts = [*ck._COMPILE_OPTIONS, *job["defines"], f"-arch={job['arch']}", "-ftz=true"]
    if not job.get("whole"):  # a GEMM family's entry, compiled alone as the launcher does
        modes = entry[len("gemm_"):]
        opts += ["-DBIGMM_ONLY=1", f"-DBIGMM_ONLY_NAME={entry}",
                 f"-DBIGMM_ONLY_A={ck._LOADERS[modes[0]]}", f"-DBIGMM_ONLY_B={ck._LOADERS[modes[1]]}"]
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"bigmm_kernel.cu", 0, None, None):
        return "nvrtcCreateProgram failed"
    try:
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        if lib.nvrtcCompileProgram(prog, len(opts), argv) == 0:
            return None
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        return log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def judge(job: dict, res: dict) -> list[str]:
    problems = []
    if not res["ok"]:
        return [f"{job['name']} [{res['arch']}]: compile failed:\n{res['log']}"]
    if not res["functions"]:
        return [f"{job['name']} [{res['arch']}]: no ptxas report parsed"]
    for warning in res.get("serialized") or ():
        problems.append(f"{job['name']} [{res['arch']}]: {warning}")
    if res.get("hgmma") == 0:
        problems.append(f"{job['name']} [{res['arch']}]: no HGMMA in the SASS")
    for fn, r in res["functions"].items():
        if job.get("entries") and fn not in job["entries"]:
            continue  # compiled with the file, never launched for this config
        where = f"{job['name']}:{fn} [{res['arch']}]"
        if r["stack"] or r["spill_st"] or r["spill_ld"] or r["lmem"]:
            problems.append(f"{where}: local memory: stack {r['stack']} B, spill stores {r['spill_st']} B, "
                            f"spill loads {r['spill_ld']} B, lmem {r['lmem']} B")
        blocks = blocks_per_sm(r["regs"], job["threads"], job["dynamic_smem"] + r["smem"], res["arch"])
        r["blocks_per_sm"] = blocks
        if blocks < max(1, job["min_blocks"]):
            problems.append(f"{where}: {blocks} blocks/SM of {job['threads']} threads "
                            f"({r['regs']} regs, {job['dynamic_smem'] + r['smem']} B smem); "
                            f"target {job['min_blocks']}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", nargs="+", default=["sm_80", "sm_90"])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", help="write the per-kernel report here")
    args = ap.parse_args(argv)

    nvcc = find_nvcc()
    if nvcc is None:
        print("check_kernels: nvcc not found (PATH, CUDA_HOME, /usr/local/cuda)", file=sys.stderr)
        return 2
    jobs = jobs_from_table()
    # an arch-specific job builds for its own target, where its base arch was asked for
    work = [(job, job["arch"] if job.get("arch") else arch) for arch in args.arch for job in jobs
            if not job.get("arch") or job["arch"].rstrip("a") == arch]
    cuobjdump = find_cuobjdump(nvcc)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda ja: compile_job(nvcc, *ja, cuobjdump), work))

    problems, compile_failed = [], False
    nvrtc = find_nvrtc(nvcc)
    nvrtc_work = [(job, e) for job in jobs if nvrtc and job.get("arch")
                  and job["arch"].rstrip("a") in args.arch for e in job["entries"]]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        logs = list(pool.map(lambda je: nvrtc_compile(nvrtc, *je), nvrtc_work))
    for (job, entry), log in zip(nvrtc_work, logs):
        if log is not None:
            compile_failed = True
            problems.append(f"{job['name']}:{entry} [NVRTC {job['arch']}]: compile failed:\n{log}")
    print(f"NVRTC: {len(nvrtc_work)} entries of arch-specific configs" if nvrtc
          else "NVRTC: libnvrtc not found (set BIGMM_NVRTC), not checked")
    print(f"{'kernel':42s} {'arch':6s} {'regs':>4s} {'smem':>7s} {'blk/SM':>6s} {'target':>6s}  spills")
    for (job, _arch), res in zip(work, results):
        found = judge(job, res)
        compile_failed |= not res["ok"]
        problems += found
        for fn, r in res["functions"].items():
            print(f"{job['name'] + ':' + fn:42s} {res['arch']:6s} {r['regs']:4d} "
                  f"{job['dynamic_smem'] + r['smem']:7d} {r.get('blocks_per_sm', 0):6d} {job['min_blocks']:6d}  "
                  f"{r['stack']}/{r['spill_st']}/{r['spill_ld']}")
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "log"} for r in results], indent=1))
    n_fn = sum(len(r["functions"]) for r in results)
    if problems:
        print(f"\nFAIL: {len(problems)} problem(s) in {n_fn} kernels:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 2 if compile_failed else 1
    print(f"\nOK: {n_fn} kernels for {', '.join(args.arch)}: no spills, no local memory, occupancy targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
