"""Fixtures the b12x tests share.

* ``moe_judge`` — ``moe_judge(got, x, experts, w, ids, compute_dtype)``: the oracle's MoE judge
  (:func:`oracle.judge.tolerance.judge_moe`: element-wise stage envelope + exact-reference gates) as
  an assertion, the same verdict ``python -m oracle`` gives, so a dropped route or a scaled row
  fails the test. ``experts`` are uniform (``reference.moe.TrellisExperts``) or paired
  (``reference.moe_pairs.PairedExperts``); the GPU MoE tests (uniform, pairs, K split) judge
  with it.
* ``tensor_core_gemm_judge`` — ``judge(launch, m=, split_k=)``: random bf16 activations
  (M x 1024) against a 64-K16-row, 512-column MCG K4 payload through ``launch(a, payload,
  split_k)`` (a GPU GEMM); every element within half a bf16 ulp plus the fp32 accumulation
  bound of the float64 product, and bit-identical to the mma.sync shared decode. The ``wgmma``
  and swap-AB GPU tests judge their geometries with it.
* ``fake_kernels`` — the dense linear's host launches (``b12x.launch.host``'s ``launch_*`` as
  seen by ``b12x.ops.dense.plan``) replaced by in-place CPU stand-ins that record every launch
  (:class:`FakeKernels`), so plan / bind / run orchestration is checked without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def moe_judge() -> Callable[..., None]:
    """``moe_judge(got, x, experts, w, ids, compute_dtype)`` asserts the oracle's MoE verdict."""
    from oracle.judge.tolerance import (
        judge_moe,  # lazy: the root conftest pins GPUs before torch loads
    )

    def judge(got, x, experts, w, ids, compute_dtype) -> None:
        verdict = judge_moe(
            got, x=x, experts=experts, topk_weights=w, topk_ids=ids, compute_dtype=compute_dtype
        )
        assert verdict.passed, verdict.reason

    return judge


class FakeKernels:
    """In-place CPU stand-ins for ``b12x.launch.host``'s unvalidated launches (what ``run_dense``
    walks) that record what each launch touched: ``("rotate_input", x, out)``, ``("gemm", a,
    out, scratch, step, flags)``, ``("rotate_output", y, out)``, ``("decode_weight", payload,
    out)``."""

    def __init__(self):
        self.calls = []

    def launch_rotation(self, spec, x, scale, out):
        import torch  # lazy: the root conftest pins GPUs before torch loads

        out_dtype = torch.bfloat16 if spec.out_bf16 else torch.float16
        assert out.dtype == out_dtype  # no allocation here: out is the scratch
        if spec.kind == "rotate_in":
            self.calls.append(("rotate_input", x, out))
            out.copy_(x)
            out.mul_(scale)
            return
        self.calls.append(("rotate_output", x, out))
        if out.dtype == scale.dtype:
            out.copy_(x)
            out.mul_(scale)
        else:  # fp16(y · svh) cast to out's dtype; allocation-free, so y (scratch) is scaled
            x.mul_(scale)
            out.copy_(x)

    def launch_gemm(self, step, *, a, payload, out, scratch, flags):
        self.calls.append(("gemm", a, out, scratch, step, flags))
        out.copy_(a[:, : out.shape[1]])
        if scratch is not None:
            scratch.fill_(0.5)

    def launch_decode(self, spec, payload, out):
        self.calls.append(("decode_weight", payload, out))
        out.fill_(0.25)


@pytest.fixture
def tensor_core_gemm_judge() -> Callable[..., None]:
    """``judge(launch, m=, split_k=)`` (module docstring)."""
    import torch

    from b12x.launch import host
    from oracle.run.runners import inputs as case_inputs
    from reference import trellis as ref_trellis

    def judge(launch, *, m: int, split_k: int) -> None:
        k_rows, n = 64, 512
        k = 16 * k_rows
        payload = case_inputs.payload(torch.Generator().manual_seed(7), k_rows, n // 16, 64)
        gen = torch.Generator().manual_seed(m)
        a = (torch.randn(m, k, generator=gen) * 0.5).to(torch.bfloat16)
        # bf16 activations multiply the decode rounded to bf16 (the kernel's to_bf16 decode)
        w = ref_trellis.decode(payload, "mcg").to(torch.bfloat16).double()
        exact = a.double() @ w
        got = launch(a.cuda(), payload.cuda(), split_k).cpu()
        ulp = torch.finfo(torch.bfloat16).eps * exact.abs()  # one bf16 ulp at the result, at most
        bound = 0.5 * ulp + k * 2.0**-23 * (a.double().abs() @ w.abs()) + 1e-30
        err = (got.double() - exact).abs()
        assert (err <= bound).all(), f"max err/bound {(err / bound).max().item():.3f}"
        sync = host.trellis_matmul(
            a.cuda(), payload.cuda(), "mcg", split_k=split_k, tiles=(2, 1), warps=8, m_warps=4,
            shared_rows=2, smem_stages=3,
        ).cpu()  # fmt: skip
        assert torch.equal(got, sync)

    return judge


@pytest.fixture
def fake_kernels(monkeypatch) -> FakeKernels:
    from b12x.ops.dense import plan as plan_mod

    fake = FakeKernels()
    for name in ("launch_rotation", "launch_gemm", "launch_decode"):
        monkeypatch.setattr(plan_mod.launchers, name, getattr(fake, name))
    return fake


@pytest.fixture
def smem_allocations(monkeypatch) -> list:
    """The byte sizes of every shared-memory allocation the kernels trace from now on, in order
    (``cutlass.memory.SmemAllocator.allocate`` counted, then called)."""
    import cutlass.memory

    real = cutlass.memory.SmemAllocator.allocate
    sizes: list = []

    def counting(self, size, *args, **kwargs):
        sizes.append(size)
        return real(self, size, *args, **kwargs)

    monkeypatch.setattr(cutlass.memory.SmemAllocator, "allocate", counting)
    return sizes
