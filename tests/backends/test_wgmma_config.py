"""CPU tests of the wgmma (sm_90a) tile configs and their selection (bigmm/backends/kernel_configs.py,
kernels/gemm_wgmma.cu): no GPU needed."""

from __future__ import annotations

import pytest

from bigmm.backends import cuda_kernels as ck
from bigmm.backends import kernel_configs as kc
from bigmm.errors import KernelError


def _wgmma_configs():
    return {n: c for n, c in ck.tile_configs().items() if c.wgmma}


def test_table_has_wgmma_configs_of_both_precisions():
    precisions = {c.precision for c in _wgmma_configs().values()}
    assert precisions == {"tf32x3", "tf32"}


@pytest.mark.parametrize("name", sorted(_wgmma_configs()))
def test_wgmma_config_shape(name):
    cfg = ck.tile_configs()[name]
    cfg.check()
    assert cfg.source == "gemm_wgmma.cu" and cfg.arch == "sm_90a"
    assert cfg.threads == 256  # two warpgroups
    assert "-arch=sm_90a" in cfg.compile_options()
    assert {"wv", "ws"} <= set(cfg.entries) and set(kc._ENTRIES) <= set(cfg.entries)
    assert cfg.smem_bytes <= 232448  # an H100 block's shared-memory limit
    assert not any(d.startswith(("-DBIGMM_WM", "-DBIGMM_TM")) for d in cfg.defines())


# (arch, precision) -> the family the rule picks
@pytest.mark.parametrize("arch, precision, wgmma", [
    ("sm_90a", "tf32x3", True),  # Hopper: the warpgroup kernels
    ("sm_90a", "tf32", True),
    (None, "tf32x3", False),  # anything else: mma.sync
    (None, "tf32", False),
    ("sm_90a", "float32", False),  # no "float32@sm_90a" rules: the plain ones
])
def test_select_by_arch(arch, precision, wgmma):
    cfg = ck.select_config("float32", 8192, 8192, 8192, precision=precision, arch=arch)
    assert cfg.wgmma == wgmma and cfg.precision == precision


def test_without_a_gpu_select_uses_the_plain_rules():
    assert ck.device_arch() in (None, "sm_90a")
    if ck.device_arch() is None:
        assert not ck.select_config("float32", 4096, 4096, 4096, precision="tf32x3").wgmma


@pytest.mark.parametrize("change, rule", [
    (dict(bn=64, wn=64), "wgmma tile"),
    (dict(bk=16), "wgmma tile"),
    (dict(stages=2), "stages >= 3"),
    (dict(split_bufs=4, pipe=True), "split buffers"),
    (dict(split_bufs=3, pipe=False), "split buffers"),
    (dict(tf32=0), "TF32 or 3xTF32"),
])
def test_wgmma_config_rules(change, rule):
    import dataclasses

    cfg = dataclasses.replace(next(iter(_wgmma_configs().values())), **change)
    with pytest.raises(KernelError, match=rule):
        cfg.check()


def test_wide_tile_is_plain_tf32_only():
    import dataclasses

    wide = [c for c in _wgmma_configs().values() if c.bn == 256]
    assert wide and all(c.tf32 == 1 for c in wide)
    with pytest.raises(KernelError, match="wgmma tile"):
        dataclasses.replace(wide[0], tf32=3).check()


def test_shared_memory_rule():
    import dataclasses

    cfg = next(c for c in _wgmma_configs().values() if c.bn == 256)
    with pytest.raises(KernelError, match="227 KB"):
        dataclasses.replace(cfg, stages=4).check()  # 4 stages of 128x256 raw tiles do not fit


@pytest.mark.parametrize("name", sorted(_wgmma_configs()))
def test_wgmma_configs_compile_every_entry(name):
    cfg = ck.tile_configs()[name]
    assert set(cfg.entries) == set(kc._ENTRIES) | set(kc._W_ENTRIES)
    if cfg.pipe:
        assert "-DBIGMM_WG_PIPE=1" in cfg.defines()
        assert f"-DBIGMM_WG_SPLITS={cfg.split_bufs}" in cfg.defines()
