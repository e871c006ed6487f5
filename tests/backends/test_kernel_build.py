"""CI check without a GPU: every CUDA kernel compiles with nvcc for sm_80 and sm_90 with no
register spills, no local memory and its occupancy target met (scripts/check_kernels.py, started
by conftest.py in the background while the other tests run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import check_kernels  # noqa: E402


def test_ptxas_report_is_parsed():
    # A spilling kernel's report must register as a problem.
    log = (
        "ptxas info    : Compiling entry function 'gemm_kv' for 'sm_90'\n"
        "ptxas info    : Function properties for gemm_kv\n"
        "    8 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads\n"
        "ptxas info    : Used 128 registers, used 1 barriers, 2048 bytes smem\n"
    )
    fn = check_kernels.parse_ptxas(log)["gemm_kv"]
    assert (fn["regs"], fn["stack"], fn["spill_st"], fn["spill_ld"], fn["smem"]) == (128, 8, 24, 16, 2048)
    job = {"name": "x", "threads": 256, "dynamic_smem": 0, "min_blocks": 2}
    problems = check_kernels.judge(job, {"ok": True, "arch": "sm_90", "functions": {"gemm_kv": fn}})
    assert any("local memory" in p for p in problems)


# (regs, threads, smem bytes, arch, blocks per SM expected)
OCCUPANCY = [
    (128, 256, 50688, "sm_90", 2),  # the float32 128x128 tile: two blocks
    (129, 256, 0, "sm_90", 1),  # one register over 128: register file fits one block
    (32, 256, 0, "sm_80", 8),  # thread limit: 2048 / 256
    (64, 256, 120000, "sm_80", 1),  # shared memory: one block of 120 KB on an A100
    (64, 256, 240000, "sm_90", 0),  # over the per-block shared-memory limit
]


@pytest.mark.parametrize("regs, threads, smem, arch, expected", OCCUPANCY)
def test_blocks_per_sm(regs, threads, smem, arch, expected):
    assert check_kernels.blocks_per_sm(regs, threads, smem, arch) == expected


@pytest.mark.skipif(check_kernels.find_nvcc() is None, reason="nvcc not installed")
def test_every_kernel_compiles_without_spills(kernel_check):
    # the script's run that conftest.py started in the background when collection ended (this
    # test runs last); run here where none was started
    if kernel_check is not None:
        rc, out, err = kernel_check(timeout=1800)
    else:
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_kernels.py")],
                              capture_output=True, text=True, timeout=1800)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    assert rc == 0, out[-4000:] + err[-4000:]
    assert "OK: " in out and "no spills" in out, out[-4000:]


def test_every_float32_config_is_built_with_its_checks_too():
    # the fused checksum variant is compiled and held to its own occupancy target (at most
    # CHECKS_MAX_BLOCKS blocks an SM), so that a config whose plain kernel fits four blocks an
    # SM cannot ship a checks kernel that spills
    jobs = {j["name"]: j for j in check_kernels.jobs_from_table()}
    float32 = [n for n, j in jobs.items() if "-DBIGMM_DTYPE=float" in j["defines"]
               and not any(d.startswith(("-DBIGMM_TF32", "-DBIGMM_WG")) for d in j["defines"])
               and "+" not in n]
    assert float32
    for name in float32:
        checks = jobs[name + "+checks"]
        assert "-DBIGMM_CHECKS=1" in checks["defines"]
        assert checks["min_blocks"] == min(jobs[name]["min_blocks"], 3)
        assert f"-DBIGMM_MIN_BLOCKS={checks['min_blocks']}" in checks["defines"]
