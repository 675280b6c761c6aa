"""GPU: the MoE boundary kernels (:mod:`b12x.kernels.moe_boundary`) against the torch path of
:mod:`b12x.ops.moe.boundary` on the same inputs and plan buffers.

* Rotation and output reduce: **bit-identical** (every op is an IEEE add/sub/mul/cvt in the same
  order), for fp16/bf16 inputs and compute dtypes, packed/proj, broadcast and per-expert tables,
  inactive routes (drop bucket ``E``) whose ``fc2`` rows and weights hold NaN, M = 1, 7, 130.
* Intermediate boundary: the only op whose rounding is not fixed by IEEE is silu's ``exp``
  (the kernel's libdevice ``expf``; torch's ``expf`` may fuse its last multiply with ``1 + ·``), so
  the bound is: at least 99% of elements bit-identical, and every element within one rounding
  step of the compute dtype of the torch value plus ``1e-5 ×`` the row's largest magnitude.
* ``run_moe`` on CUDA launches the boundary kernels (three launches per call, checked by
  counting calls through the wrappers), and its output is judged by
  :func:`oracle.judge.tolerance.judge_moe` against :mod:`reference.moe`.
"""

from __future__ import annotations

import pytest
import torch

from b12x.launch import host as launchers
from b12x.ops.moe import boundary
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe
from oracle.judge.tolerance import judge_moe
from reference.moe import TrellisExperts

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda")
F16, BF16 = torch.float16, torch.bfloat16
H, I, E, TOP_K = 256, 256, 8, 4
CASES = [
    (F16, F16, "packed"),
    (BF16, BF16, "proj"),
    (F16, BF16, "proj"),
    (BF16, F16, "packed"),
]
MS = (1, 7, 130)


def _case_id(case):
    x_dtype, cd, layout = case
    return f"x{str(x_dtype)[-4:]}-cd{str(cd)[-4:]}-{layout}"


def _setup(x_dtype, cd, layout, m, *, seed=0, broadcast=False):
    """Plan buffers twice (kernel / torch path) and route tables with inactive routes."""
    plan = plan_moe(
        m=m, top_k=TOP_K, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=E,
        w13_layout=layout, x_dtype=x_dtype, compute_dtype=cd,
    )  # fmt: skip
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = m * TOP_K
    expert = torch.randint(0, E, (n,), generator=g)
    inactive = torch.rand(n, generator=g) < 0.2
    if m > 1:
        inactive[:TOP_K] = True  # token 0: every route inactive
    expert[inactive] = E  # the route packer's drop bucket
    bufs = []
    for _ in range(2):
        buf = allocate_moe_buffers(plan, DEV)
        for t in buf.values():  # stale scratch: NaN / all-ones bytes / True
            if t.is_floating_point():
                t.fill_(float("nan"))
            elif t.dtype == torch.bool:
                t.fill_(True)
            else:
                t.view(torch.uint8).fill_(0xFF)
        buf["route_expert"].narrow(0, 0, n).copy_(expert)
        buf["route_inactive"].narrow(0, 0, n).copy_(inactive)
        bufs.append(buf)
    rows = 1 if broadcast else E

    def table(r, f):
        return (torch.randn(r, f, generator=g) * 1.5).to(F16).to(DEV)

    tables = dict(
        gate_suh=table(rows, H),
        up_suh=table(rows, H) if layout == "proj" else None,
        rotations=table(E, 3 * I),
        down_svh=table(rows, H),
    )
    return plan, bufs, tables, n, inactive.to(DEV), g


def _bits16(t):
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("broadcast", [False, True])
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_rotation_is_bit_identical_to_the_torch_path(case, m, broadcast):
    x_dtype, cd, layout = case
    plan, (kb, tb), tables, n, _, g = _setup(x_dtype, cd, layout, m, seed=m, broadcast=broadcast)
    x = (torch.randn(m, H, generator=g) * 3).to(x_dtype).to(DEV)
    x[0, :3] = torch.tensor([1000.0, -0.0, 1e-7], dtype=x_dtype)  # large, -0, fp16 subnormal
    proj = layout == "proj"
    outs = {}
    for name, buf in (("kernel", kb), ("torch", tb)):
        gate = buf["rotation_gate"].narrow(0, 0, n)
        up = buf["rotation_up"].narrow(0, 0, n) if proj else None
        common = dict(x=x, gate_suh=tables["gate_suh"], up_suh=tables["up_suh"], out_gate=gate,
                      out_up=up)  # fmt: skip
        if name == "kernel":
            boundary.rotate_inputs(
                arch=launchers.device_arch(DEV),
                route_expert=buf["route_expert"].narrow(0, 0, n), top_k=TOP_K, num_experts=E,
                **common,
            )  # fmt: skip
        else:
            boundary.reference_rotate_inputs(buf, n=n, top_k=TOP_K, num_experts=E, **common)
        outs[name] = (buf["rotation_gate"].clone(), buf["rotation_up"].clone() if proj else None)
    torch.cuda.synchronize()
    for got, want in zip(outs["kernel"], outs["torch"], strict=True):
        if got is None:
            continue
        assert got.dtype == cd
        assert torch.equal(_bits16(got[:n]), _bits16(want[:n]))
        assert torch.equal(_bits16(got[n:]), _bits16(want[n:]))  # tails untouched by both


def _close_within_one_step(got, want, cd):
    eps = 2.0**-10 if cd == F16 else 2.0**-7
    g, w = got.float(), want.float()
    row_max = w.abs().amax(dim=1, keepdim=True)
    bound = eps * w.abs() + 1e-5 * row_max
    return bool(((g - w).abs() <= bound).all()), float((g == w).float().mean())


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_activation_matches_the_torch_path(case, m):
    _, cd, layout = case
    plan, (kb, tb), tables, n, _, g = _setup(*case, m, seed=100 + m)
    fc1 = (torch.randn(n, 2 * I, generator=g) * 2).to(cd).to(DEV)
    outs = {}
    for name, buf in (("kernel", kb), ("torch", tb)):
        out = buf["activated"].narrow(0, 0, n)
        if name == "kernel":
            boundary.activate(
                arch=launchers.device_arch(DEV), fc1=fc1, rotations=tables["rotations"],
                route_expert=buf["route_expert"].narrow(0, 0, n), out=out, num_experts=E,
            )  # fmt: skip
        else:
            boundary.reference_activate(
                buf, fc1=fc1, rotations=tables["rotations"], out=out, n=n, top_k=TOP_K,
                num_experts=E,
            )  # fmt: skip
        outs[name] = buf["activated"].clone()
    torch.cuda.synchronize()
    got, want = outs["kernel"], outs["torch"]
    assert got.dtype == cd and bool(torch.isfinite(got[:n].float()).all())
    ok, identical = _close_within_one_step(got[:n], want[:n], cd)
    assert ok and identical >= 0.99, identical
    assert torch.equal(_bits16(got[n:]), _bits16(want[n:]))


@pytest.mark.parametrize("broadcast", [False, True])
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_output_reduce_is_bit_identical_to_the_torch_path(case, m, broadcast):
    x_dtype, cd, layout = case
    plan, (kb, tb), tables, n, inactive, g = _setup(*case, m, seed=200 + m, broadcast=broadcast)
    fc2 = (torch.randn(n, H, generator=g) * 4).to(cd).to(DEV)
    fc2[inactive] = float("nan")  # stale rows of inactive routes
    weights = torch.rand(n, generator=g).to(DEV)
    weights[inactive] = float("nan")
    outs = {}
    for name, buf in (("kernel", kb), ("torch", tb)):
        out = buf["output"].narrow(0, 0, m)
        if name == "kernel":
            boundary.reduce_output(
                arch=launchers.device_arch(DEV), fc2=fc2, svh=tables["down_svh"],
                route_expert=buf["route_expert"].narrow(0, 0, n),
                route_inactive=buf["route_inactive"].narrow(0, 0, n), weights=weights, out=out,
                top_k=TOP_K, num_experts=E,
            )  # fmt: skip
        else:
            boundary.reference_reduce_output(
                buf, fc2=fc2, svh=tables["down_svh"], weights=weights, out=out, n=n,
                top_k=TOP_K, num_experts=E,
            )  # fmt: skip
        outs[name] = buf["output"].clone()
    torch.cuda.synchronize()
    got, want = outs["kernel"], outs["torch"]
    assert got.dtype == x_dtype
    assert bool(torch.isfinite(got.float()).all())
    assert torch.equal(_bits16(got), _bits16(want))
    if m > 1:  # token 0 routes nowhere: exactly +0
        assert torch.equal(_bits16(got[0]), torch.zeros(H, dtype=torch.int16, device=DEV))


def _experts(layout, x_dtype, cd, m, seed):
    """Random MCG K3 experts and routes (with inactive ids) for an end-to-end ``run_moe``."""
    g = torch.Generator().manual_seed(seed)

    def payload(*shape):
        data = torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32)
        return data.to(torch.int16).to(DEV)

    def scales(rows, width):
        sign = torch.where(torch.rand(rows, width, generator=g) < 0.5, -1.0, 1.0)
        return (sign * (0.8 + 0.4 * torch.rand(rows, width, generator=g))).half().to(DEV)

    w13 = payload(E, H // 16, 2 * I // 16, 48) if layout == "packed" else payload(
        2, E, H // 16, I // 16, 48)  # fmt: skip
    x = (0.5 * torch.randn(m, H, generator=g)).to(x_dtype).to(DEV)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(m)])
    ids[0, 1], ids[-1, 0] = -1, E  # inactive routes
    w = torch.rand(m, TOP_K, generator=g).to(DEV)
    inputs = MoeInputs(
        x, w, ids.to(DEV), (w13,), (payload(E, I // 16, H // 16, 48),), scales(E, H),
        scales(E, H) if layout == "proj" else None, scales(E, 3 * I), scales(1, H),
    )  # fmt: skip
    plan = plan_moe(
        m=m, top_k=TOP_K, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=E,
        w13_layout=layout, x_dtype=x_dtype, compute_dtype=cd,
    )  # fmt: skip
    return plan, inputs


def _torch_path(monkeypatch, buf, calls):
    """Route the three kernel wrappers to the torch path on the same bound buffers."""

    def rotate_inputs(*, arch, route_expert, **kw):
        calls["torch"] += 1
        boundary.reference_rotate_inputs(buf, n=route_expert.shape[0], **kw)

    def activate(*, arch, route_expert, num_experts, **kw):
        calls["torch"] += 1
        boundary.reference_activate(
            buf, n=route_expert.shape[0], top_k=TOP_K, num_experts=num_experts, **kw
        )

    def reduce_output(*, arch, route_expert, route_inactive, **kw):
        calls["torch"] += 1
        boundary.reference_reduce_output(buf, n=route_expert.shape[0], **kw)

    for name, fn in (("rotate_inputs", rotate_inputs), ("activate", activate),
                     ("reduce_output", reduce_output)):  # fmt: skip
        monkeypatch.setattr(boundary, name, fn)


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_run_moe_launches_the_boundary_kernels(case, m, monkeypatch):
    """run_moe on CUDA: one call per boundary stage, and the result (as the torch path's) judged
    by the oracle's MoE judge against the reference (:mod:`reference.moe`)."""
    x_dtype, cd, layout = case
    plan, inputs = _experts(layout, x_dtype, cd, m, seed=300 + m)
    bound = bind_moe(plan, **allocate_moe_buffers(plan, DEV))
    calls = {"rotate_inputs": 0, "activate": 0, "reduce_output": 0, "torch": 0}
    with monkeypatch.context() as patch:
        for name in ("rotate_inputs", "activate", "reduce_output"):
            original = getattr(boundary, name)

            def counted(*args, _name=name, _original=original, **kwargs):
                calls[_name] += 1
                return _original(*args, **kwargs)

            patch.setattr(boundary, name, counted)
        for name in ("reference_rotate_inputs", "reference_activate", "reference_reduce_output"):
            patch.setattr(boundary, name, lambda *a, **k: pytest.fail("torch path on CUDA"))
        got = run_moe(bound, inputs).clone()
    assert calls == {"rotate_inputs": 1, "activate": 1, "reduce_output": 1, "torch": 0}
    again = run_moe(bound, inputs).clone()
    with monkeypatch.context() as patch:
        _torch_path(patch, bound.buffers, calls)
        want = run_moe(bound, inputs).clone()
    torch.cuda.synchronize()
    assert calls["torch"] == 3
    assert torch.equal(_bits16(got), _bits16(again))  # deterministic
    assert got.dtype == x_dtype and bool(torch.isfinite(got.float()).all())
    experts = TrellisExperts(
        w13=inputs.w13[0], w2=inputs.w2[0], gate_suh=inputs.gate_suh,
        up_suh=inputs.gate_suh if inputs.up_suh is None else inputs.up_suh,
        intermediate_rotations=inputs.intermediate_rotations, down_svh=inputs.down_svh,
        codebook="mcg", w13_layout=layout,
    )  # fmt: skip
    for y in (got, want):  # the kernels and the torch path, each against the reference
        verdict = judge_moe(
            y, x=inputs.x, experts=experts, topk_weights=inputs.topk_weights,
            topk_ids=inputs.topk_ids, compute_dtype=cd,
        )  # fmt: skip
        assert verdict.passed, verdict.reason
