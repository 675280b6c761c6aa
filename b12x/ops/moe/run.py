"""``run`` of the fused trellis MoE: input checks, then the launch sequence of
:mod:`b12x.ops.moe.plan`.

Layout
------
* :class:`MoeInputs` (frozen): the per-call tensors (``x``, ``topk_weights``, ``topk_ids``) and
  the weights: ``w13``/``w2`` as one payload per tier, the rotation tables in the combined
  namespace, and for tiers ``global_to_combined`` / ``descriptor_map``. A paired phase (plan's
  ``fc1_pair``/``fc2_pair``) takes its pair payload (:func:`b12x.ops.moe.pairs.pair_payload_shape`)
  and, when dynamic, its int32 ``[E]`` mode table ``fc1_modes``/``fc2_modes``.
* :func:`check_moe_inputs` validates all of them against the plan before any launch (dtype,
  shape, contiguity, 16-byte alignment, device, ids dtype, expert counts); the payload shapes
  come from :func:`payload_shapes`, the rotation tables go through :func:`check_rotation_table`
  (both shared with the custom op's metadata check).
* :func:`launch_grouped_gemm` is a **shared body** (keyword-only, no defaults): one grouped-GEMM
  launch. Its ``codebook`` must be passed explicitly and must equal the compiled spec's codebook
  (R11: the codebook is never a default). The kernel's arguments are bound by name in a
  :class:`b12x.launch.records.GroupedGemmLaunch`, whose order is the kernel's own
  ``__call__``. The uniform stage and the tier stage (:func:`tier_gemm_stage`: K3/K4 tiers of
  :mod:`b12x.ops.moe.tiers`, codebook ``"mcg"``) both call it by keyword; a paired phase goes
  through :func:`b12x.ops.moe.pairs.launch_paired_gemm` (:func:`paired_gemm_stage`). Every stage
  lives here, so ``run`` imports no module that imports it (``tiers`` plans, ``run`` launches).
* :func:`run_moe` runs the sequence; nothing in it allocates (views, ``out=``, in-place ops).

Invariants
----------
* Route ids are read, never written; inactive ids are replaced by a drop bucket in a widened
  int64 copy before any use, so they never index a table or a payload (R7, R9).
"""

from __future__ import annotations

import dataclasses

import torch

from b12x.abi import shared_body
from b12x.formats import resolve_format
from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.launch import host as launchers
from b12x.launch.kinds import compiled
from b12x.launch.records import GroupedGemmLaunch
from b12x.ops.moe import boundary, pairs, routing
from b12x.ops.moe.plan import BoundMoe, MoeProblem
from b12x.runtime.scratch import live_rows
from b12x.runtime.validate import check_tensor

__all__ = [
    "LAUNCH_DEVICE_TYPES",
    "MoeInputs",
    "check_launch_device",
    "check_moe_inputs",
    "check_rotation_table",
    "payload_shapes",
    "launch_grouped_gemm",
    "resolve_kernels",
    "run_moe",
    "GemmContext",
]


#: Device types ``run`` launches on. Only CUDA runs the kernels; the CPU tier of the tests, which
#: replaces the grouped GEMM by an emulation, adds ``"cpu"`` (monkeypatch) and nothing else does.
LAUNCH_DEVICE_TYPES: tuple[str, ...] = ("cuda",)


def check_launch_device(name: str, device: torch.device, *, op: str) -> None:
    """Refuse, naming ``name``, a bound device the kernels of ``op`` cannot launch on (a CPU
    plan, say) before anything is packed or launched: a clear ``ValueError``, not a torch error
    from deep inside a launch."""
    if device.type not in LAUNCH_DEVICE_TYPES:
        raise ValueError(
            f"{name}: {op} launches CUDA kernels, but the plan is bound to {device} buffers; "
            f"bind buffers allocated on a CUDA device (accepted: {LAUNCH_DEVICE_TYPES})"
        )


@dataclasses.dataclass(frozen=True, eq=False)
class MoeInputs:
    x: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    w13: tuple[torch.Tensor, ...]
    w2: tuple[torch.Tensor, ...]
    gate_suh: torch.Tensor
    up_suh: torch.Tensor | None
    intermediate_rotations: torch.Tensor
    down_svh: torch.Tensor
    global_to_combined: torch.Tensor | None = None
    descriptor_map: torch.Tensor | None = None
    fc1_modes: torch.Tensor | None = None  # dynamic FC1 pairs: int32 [E], 0 = P33, 1 = P24
    fc2_modes: torch.Tensor | None = None  # dynamic FC2 pairs


@dataclasses.dataclass(frozen=True, eq=False)
class GemmContext:
    """What every grouped-GEMM launch of one run shares."""

    arch: str
    block_expert_ids: torch.Tensor
    route_count: torch.Tensor
    route_rows: torch.Tensor
    descriptors: torch.Tensor


def check_rotation_table(
    name: str, t: object, rows: int, width: int, device, *, broadcast: bool
) -> None:
    """An fp16 ``[rows, width]`` rotation table on ``device`` (``[1, width]`` too when it may
    broadcast over the experts); raises naming ``name``."""
    check_tensor(name, t, dtypes=(torch.float16,), ndim=2, device=device)
    if t.shape[1] != width or not (t.shape[0] == rows or (broadcast and t.shape[0] == 1)):
        want = f"[{rows}, {width}]" + (f" or [1, {width}]" if broadcast else "")
        raise ValueError(f"{name}: expected shape {want}, got {tuple(t.shape)}")


def payload_shapes(p: MoeProblem) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """Per tier, the exact int16 ``(w13, w2)`` payload shapes of problem ``p``: uniform
    ``packed`` ``[E, H/16, 2I/16, 16b]`` / ``proj`` ``[2, E, H/16, I/16, 16b]`` and
    ``[E, I/16, H/16, 16b]``, or a paired phase's :func:`b12x.ops.moe.pairs.pair_payload_shape`."""
    h, i = p.hidden, p.intermediate
    out = []
    for tier in p.tiers:
        words = 16 * tier.bits
        if p.w13_layout == "packed":
            want13 = (tier.num_experts, h // 16, 2 * i // 16, words)
        else:
            want13 = (2, tier.num_experts, h // 16, i // 16, words)
        want2 = (tier.num_experts, i // 16, h // 16, words)
        shape_of = dict(
            num_experts=tier.num_experts, hidden=h, intermediate=i, w13_layout=p.w13_layout
        )
        if p.fc1_pair is not None:
            want13 = pairs.pair_payload_shape("fc1", p.fc1_pair, **shape_of)
        if p.fc2_pair is not None:
            want2 = pairs.pair_payload_shape("fc2", p.fc2_pair, **shape_of)
        out.append((want13, want2))
    return tuple(out)


def check_moe_inputs(bound: BoundMoe, inputs: MoeInputs) -> int:
    """Validate ``inputs`` against the bound plan; return the live M."""
    if not isinstance(bound, BoundMoe):
        raise TypeError(f"bound: expected BoundMoe, got {type(bound).__name__}")
    if not isinstance(inputs, MoeInputs):
        raise TypeError(f"inputs: expected MoeInputs, got {type(inputs).__name__}")
    p, dev = bound.plan.problem, bound.device
    h, i = p.hidden, p.intermediate
    check_tensor("x", inputs.x, dtypes=(p.x_dtype,), ndim=2, device=dev)
    m = inputs.x.shape[0]
    if inputs.x.shape[1] != h or not 1 <= m <= p.m:
        raise ValueError(f"x: expected [M <= {p.m}, {h}], got {tuple(inputs.x.shape)}")
    routing.check_route_ids(inputs.topk_ids, top_k=p.top_k, device=dev)
    if inputs.topk_ids.shape[0] != m:
        raise ValueError(f"topk_ids: {inputs.topk_ids.shape[0]} rows, but x has {m}")
    w = inputs.topk_weights
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        got = w.dtype if isinstance(w, torch.Tensor) else type(w).__name__
        raise TypeError(f"topk_weights: expected a floating tensor, got {got}")
    check_tensor(
        "topk_weights", w, dtypes=(w.dtype,), shape=(m, p.top_k), device=dev, aligned=False
    )
    for name in ("w13", "w2"):
        value = getattr(inputs, name)
        if not isinstance(value, tuple) or len(value) != len(p.tiers):
            raise ValueError(f"{name}: expected a tuple of {len(p.tiers)} payload(s)")
    for t, (want13, want2) in enumerate(payload_shapes(p)):
        check_tensor(f"w13[{t}]", inputs.w13[t], dtypes=(torch.int16,), shape=want13, device=dev)
        check_tensor(f"w2[{t}]", inputs.w2[t], dtypes=(torch.int16,), shape=want2, device=dev)
    for phase, choice in (("fc1", p.fc1_pair), ("fc2", p.fc2_pair)):
        name, modes = f"{phase}_modes", getattr(inputs, f"{phase}_modes")
        if choice == pairs.DYNAMIC:
            pairs.check_pair_modes(name, modes, p.num_experts, dev)
        elif modes is not None:
            raise ValueError(f"{name}: only a dynamic {phase} pair layout takes a mode table")
    e = p.num_experts
    check_rotation_table("gate_suh", inputs.gate_suh, e, h, dev, broadcast=True)
    if p.w13_layout == "proj":
        if inputs.up_suh is None:
            raise ValueError("up_suh: the proj layout needs the up projection's input rotation")
        check_rotation_table("up_suh", inputs.up_suh, e, h, dev, broadcast=True)
    check_rotation_table(
        "intermediate_rotations", inputs.intermediate_rotations, e, 3 * i, dev, broadcast=False
    )
    check_rotation_table("down_svh", inputs.down_svh, e, h, dev, broadcast=True)
    if len(p.tiers) > 1:
        check_tensor(
            "global_to_combined",
            inputs.global_to_combined,
            dtypes=(torch.int32,),
            shape=(p.num_global_experts,),
            device=dev,
        )
        check_tensor(
            "descriptor_map", inputs.descriptor_map, dtypes=(torch.int32,), shape=(e,), device=dev
        )
    elif inputs.global_to_combined is not None or inputs.descriptor_map is not None:
        raise ValueError("global_to_combined: only a tiered plan takes tier maps")
    return m


def _lut_addr(spec: MoeGemmSpec, device: torch.device) -> int:
    table = launchers.lut_tensor(resolve_format(spec.codebook, spec.bits), device)
    return 0 if table is None else table.data_ptr()


@shared_body
def launch_grouped_gemm(
    *,
    spec: MoeGemmSpec,
    codebook: str,
    ctx: GemmContext,
    tier: int,
    a: torch.Tensor,
    payload: torch.Tensor,
    num_payload_experts: int,
    out: torch.Tensor,
    expert_base: int,
    out_col: int,
) -> None:
    """One grouped-GEMM launch: ``out[r, out_col : out_col + N] = A[r] @ W[expert_base + local]``
    for every route ``r`` of a live block of ``tier`` (A and out in route order; payload int16
    ``[.., K/16, N/16, 16b]`` stacked experts)."""
    if codebook != spec.codebook:
        raise ValueError(f"codebook: {codebook!r} differs from the compiled {spec.codebook!r}")
    spec.check_k(a.shape[1])
    k16, n16 = payload.shape[-3], payload.shape[-2]
    flat = payload.view(torch.int32).reshape(num_payload_experts * k16, n16, 8 * spec.bits)
    fn = compiled(spec, ctx.arch)
    launch = GroupedGemmLaunch(
        a=a.view(torch.int32),
        payload=flat,
        out=out.view(torch.int32),
        block_expert_ids=ctx.block_expert_ids,
        route_count=ctx.route_count,
        route_rows=ctx.route_rows,
        descriptors=ctx.descriptors,
        lut_addr=_lut_addr(spec, a.device),
        tier=tier,
        expert_base=expert_base,
        out_col_word=out_col // 2,
    )
    fn(*launch.args())


def paired_gemm_stage(bound, inputs, ctx, *, phase, a_gate, a_up, a2, fc1, fc2) -> None:
    """FC1 (N-axis pairs) or FC2 (K-axis pairs) launches of a paired uniform stack."""
    p = bound.plan.problem
    e, i = p.tiers[0].num_experts, p.intermediate
    if phase == "fc2":
        pairs.launch_paired_gemm(
            spec=bound.plan.fc2_spec[0], codebook=p.codebook, ctx=ctx, a=a2,
            payload=inputs.w2[0], num_payload_experts=e, modes=inputs.fc2_modes, out=fc2,
            n=p.hidden, expert_base=0, out_col=0,
        )  # fmt: skip
        return
    if p.w13_layout == "packed":
        launches = ((0, a_gate, e, 2 * i),)
    else:
        launches = ((0, a_gate, 2 * e, i), (1, a_up, 2 * e, i))
    for proj, a, experts, n in launches:
        pairs.launch_paired_gemm(
            spec=bound.plan.fc1_spec[0], codebook=p.codebook, ctx=ctx, a=a,
            payload=inputs.w13[0], num_payload_experts=experts, modes=inputs.fc1_modes,
            out=fc1, n=n, expert_base=proj * e, out_col=proj * i,
        )  # fmt: skip


def uniform_gemm_stage(bound, inputs, ctx, *, phase, a_gate, a_up, a2, fc1, fc2) -> None:
    """FC1 or FC2 launches of a uniform stack (tier 0, identity descriptors)."""
    p = bound.plan.problem
    e = p.tiers[0].num_experts
    if getattr(p, f"{phase}_pair") is not None:
        paired_gemm_stage(
            bound, inputs, ctx, phase=phase, a_gate=a_gate, a_up=a_up, a2=a2, fc1=fc1, fc2=fc2
        )
        return
    if phase == "fc1":
        spec = bound.plan.fc1_spec[0]
        if p.w13_layout == "packed":
            launch_grouped_gemm(
                spec=spec, codebook=p.codebook, ctx=ctx, tier=0, a=a_gate, payload=inputs.w13[0],
                num_payload_experts=e, out=fc1, expert_base=0, out_col=0,
            )  # fmt: skip
            return
        for proj, a in ((0, a_gate), (1, a_up)):
            launch_grouped_gemm(
                spec=spec, codebook=p.codebook, ctx=ctx, tier=0, a=a, payload=inputs.w13[0],
                num_payload_experts=2 * e, out=fc1, expert_base=proj * e,
                out_col=proj * p.intermediate,
            )  # fmt: skip
        return
    launch_grouped_gemm(
        spec=bound.plan.fc2_spec[0], codebook=p.codebook, ctx=ctx, tier=0, a=a2,
        payload=inputs.w2[0], num_payload_experts=e, out=fc2, expert_base=0, out_col=0,
    )  # fmt: skip


def tier_gemm_stage(bound, inputs, ctx, *, phase, a_gate, a_up, a2, fc1, fc2) -> None:
    """FC1 or FC2 of both tiers: one launch per (tier, projection), codebook ``"mcg"``."""
    p = bound.plan.problem
    for tier, spec_tier in enumerate(p.tiers):
        e = spec_tier.num_experts
        if phase == "fc2":
            launch_grouped_gemm(
                spec=bound.plan.fc2_spec[tier],
                codebook="mcg",
                ctx=ctx,
                tier=tier,
                a=a2,
                payload=inputs.w2[tier],
                num_payload_experts=e,
                out=fc2,
                expert_base=0,
                out_col=0,
            )
            continue
        projections = ((0, a_gate),) if p.w13_layout == "packed" else ((0, a_gate), (1, a_up))
        for proj, a in projections:
            launch_grouped_gemm(
                spec=bound.plan.fc1_spec[tier],
                codebook="mcg",
                ctx=ctx,
                tier=tier,
                a=a,
                payload=inputs.w13[tier],
                num_payload_experts=e if p.w13_layout == "packed" else 2 * e,
                out=fc1,
                expert_base=proj * e,
                out_col=proj * p.intermediate,
            )


def _combined_ids(bound: BoundMoe, inputs: MoeInputs, n: int) -> torch.Tensor:
    """Global router ids -> combined ids (int64, −1 where inactive or unmapped), no narrowing."""
    buf, p = bound.buffers, bound.plan.problem
    gid = live_rows(buf, "global_ids", n)
    inactive = live_rows(buf, "global_inactive", n)
    beyond = live_rows(buf, "global_lt", n)
    gid.copy_(inputs.topk_ids.reshape(n))
    torch.lt(gid, 0, out=inactive)
    torch.ge(gid, p.num_global_experts, out=beyond)
    torch.logical_or(inactive, beyond, out=inactive)
    gid.masked_fill_(inactive, 0)
    c32 = live_rows(buf, "combined_ids32", n)
    torch.index_select(inputs.global_to_combined, 0, gid, out=c32)
    cid = live_rows(buf, "combined_ids", n)
    cid.copy_(c32)
    cid.masked_fill_(inactive, -1)
    return cid.view(-1, p.top_k)


def resolve_kernels(bound: BoundMoe) -> None:
    """Look up every compiled kernel one step launches (the grouped GEMMs of the plan and the
    three boundary kernels) before the first launch. While the compile cache is frozen, or a
    graph is being captured, a kernel that was never compiled raises
    :class:`~b12x.runtime.compile_cache.KernelResolutionFrozen` here, with nothing launched or
    captured yet (R5); a warm cache makes this a few dictionary hits."""
    arch = launchers.device_arch(bound.device)
    for spec in bound.plan.kernel_specs:
        compiled(spec, arch)
    for spec in boundary.boundary_specs(bound.plan.problem):
        compiled(spec, arch)


def run_moe(bound: BoundMoe, inputs: MoeInputs) -> torch.Tensor:
    """The launch sequence of :mod:`b12x.ops.moe.plan`; returns the bound ``output`` rows ``[M,
    H]``."""
    m = check_moe_inputs(bound, inputs)
    check_launch_device("bound", bound.device, op="run_moe")
    kernels = bound.device.type == "cuda"  # a CPU-bound plan (emulated GEMMs) takes torch ops
    if kernels:
        resolve_kernels(bound)
    plan, p, buf = bound.plan, bound.plan.problem, bound.buffers
    e, k = p.num_experts, p.top_k
    tiered = len(p.tiers) > 1
    if tiered:
        ids = _combined_ids(bound, inputs, m * k)
        descriptors = inputs.descriptor_map
    else:
        ids = inputs.topk_ids
        descriptors = buf["expert_descriptors"]
        torch.arange(e, out=descriptors)
    arch = launchers.device_arch(bound.device)
    packer_arch = arch if kernels else None  # a CPU-bound plan packs with the torch packer
    live = boundary.pack(arch=packer_arch, plan=plan.routes, topk_ids=ids, buffers=buf)
    n, nb = live.routes, live.num_blocks

    def rows(name: str, count: int) -> torch.Tensor:
        return live_rows(buf, name, count)

    route_expert, route_inactive = rows("route_expert", n), rows("route_inactive", n)
    tables = dict(n=n, top_k=k, num_experts=e)
    a_gate = rows("rotation_gate", n)
    a_up = rows("rotation_up", n) if p.w13_layout == "proj" else None
    rotation = dict(x=inputs.x, gate_suh=inputs.gate_suh, out_gate=a_gate, out_up=a_up)
    rotation["up_suh"] = inputs.up_suh if a_up is not None else None
    if kernels:
        boundary.rotate_inputs(
            arch=arch, route_expert=route_expert, top_k=k, num_experts=e, **rotation
        )
    else:
        boundary.reference_rotate_inputs(buf, **rotation, **tables)

    fc1, a2, fc2 = rows("fc1", n), rows("activated", n), rows("fc2", n)
    ctx = GemmContext(
        arch=arch,
        block_expert_ids=rows("block_expert_ids", nb),
        route_count=buf["route_count"],
        route_rows=routing.packed_route_indices(live, buf),
        descriptors=descriptors,
    )
    stage = tier_gemm_stage if tiered else uniform_gemm_stage
    gemms = dict(a_gate=a_gate, a_up=a_up, a2=a2, fc1=fc1, fc2=fc2)
    stage(bound, inputs, ctx, phase="fc1", **gemms)

    if kernels:
        boundary.activate(
            arch=arch, fc1=fc1, rotations=inputs.intermediate_rotations,
            route_expert=route_expert, out=a2, num_experts=e,
        )  # fmt: skip
    else:
        boundary.reference_activate(
            buf, fc1=fc1, rotations=inputs.intermediate_rotations, out=a2, **tables
        )
    stage(bound, inputs, ctx, phase="fc2", **gemms)

    output = rows("output", m)
    weights = inputs.topk_weights.reshape(n)
    if not kernels:
        boundary.reference_reduce_output(
            buf, fc2=fc2, svh=inputs.down_svh, weights=weights, out=output, **tables
        )
        return output
    if weights.dtype != torch.float32:
        fp32 = rows("route_weights", n)
        fp32.copy_(weights)
        weights = fp32
    boundary.reduce_output(
        arch=arch, fc2=fc2, svh=inputs.down_svh, route_expert=route_expert,
        route_inactive=route_inactive, weights=weights, out=output, top_k=k, num_experts=e,
    )  # fmt: skip
    return output
