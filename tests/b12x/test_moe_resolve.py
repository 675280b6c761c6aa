"""``run_moe`` resolves every kernel of the step before its first launch (R5).

While the compile cache is frozen (or a graph is capturing), a step whose kernels were never
compiled must fail at :func:`b12x.ops.moe.run.resolve_kernels`, naming a key, before any route
packing, rotation or GEMM is launched or captured. CPU-only: the arch lookup is stubbed and the
cache is emptied for the test, so nothing compiles.
"""

from __future__ import annotations

import pytest
import torch

from b12x.launch import host
from b12x.ops.moe import run as run_mod
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.runtime import compile_cache


def _bound():
    plan = plan_moe(
        m=4, top_k=2, hidden=256, intermediate=256, codebook="mcg", bits=3, num_experts=8,
        w13_layout="packed", x_dtype=torch.float16, compute_dtype=torch.float16,
    )  # fmt: skip
    return bind_moe(plan, **allocate_moe_buffers(plan, "cpu"))


def test_frozen_cold_step_raises_before_any_launch(monkeypatch):
    monkeypatch.setattr(host, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(compile_cache, "CACHE", compile_cache.CompileCache())
    with compile_cache.frozen(), pytest.raises(compile_cache.KernelResolutionFrozen) as err:
        run_mod.resolve_kernels(_bound())
    assert "moe_gemm" in str(err.value)
    assert not compile_cache.CACHE.compiled_keys()  # nothing was built


def test_every_kernel_of_the_step_is_looked_up(monkeypatch):
    bound = _bound()
    seen = []
    monkeypatch.setattr(host, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(run_mod, "compiled", lambda spec, arch: seen.append(spec))
    run_mod.resolve_kernels(bound)
    gemms = [s for s in seen if s in bound.plan.kernel_specs]
    assert set(gemms) == set(bound.plan.kernel_specs)
    # 8 routes: the route packer is part of the step too
    assert {s.kind for s in seen if s not in gemms} == {"rotate", "activate", "reduce", "pack"}
