"""The MoE's boundaries around the grouped GEMMs (spec §3.1, §3.4): the CuTe DSL launches and
the allocation-free torch path that defines their rounding points.

Layout:
* Kernel launches (keyword-only; :mod:`b12x.kernels.moe_boundary`, one launch per stage, its
  arguments bound by name in a launch record of :mod:`b12x.launch.records`):
  :func:`rotate_inputs` (the gate and, for ``proj``, the up rotation in one launch),
  :func:`activate` (the intermediate boundary FC1 → FC2 input) and :func:`reduce_output`
  (H128 of FC2, ``down_svh``, top-k weights, the slot-ordered fp32 sum, ``x.dtype``). Each reads
  the route packer's ``route_expert`` (int64, drop bucket ``E``) and clamps it in the kernel.
* Route packing (:func:`pack_routes`): the one-launch packer :class:`b12x.kernels.moe_pack.
  MoePackKernel` writes the consumer buffers of :func:`b12x.ops.moe.routing.pack_routes_into`
  (the torch packer, about thirty launches) bit for bit; :func:`device_packs` says whether a
  routing plan is within its bounds (decided on the planned sizes, so a captured graph never
  changes packer), and :func:`pack` picks one of the two.
* The torch path (:func:`reference_rotate_inputs`, :func:`reference_activate`,
  :func:`reference_reduce_output`): the same stages as torch ops on the plan's scratch buffers.
  ``run_moe`` takes it where no kernel can run (a CPU-bound plan: the CPU suite's emulated
  GEMMs); the GPU tests compare the kernels against it. Its rounding points are the contract:
* :func:`h128_fp32_` — blockwise H128 over the last dim with the boundary kernels' fp32 butterfly
  (:func:`b12x.kernels.moe_boundary._h128`, the same add/sub order, so bit-identical): per
  128-block, stages over index bits 0..6 in that order (bits 0–1 are the in-thread H4, bits 2–6
  the xor-shuffles with lane offsets 1..16), the lower element keeping ``lo + hi`` and the upper
  ``lo − hi``, then ``× 0.088388347648`` in fp32 (§3.1). It ping-pongs between two caller
  buffers and returns the one holding the result.
* :func:`gather_rows_` — per-slot rows of a per-expert table (``[E, F]`` or broadcast ``[1, F]``).

Invariants: everything writes into caller buffers (no allocation, no host synchronisation), so
the MoE ``run`` that calls these is CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from b12x.kernels.moe_boundary import MoeBoundarySpec
from b12x.kernels.moe_pack import PACK_MAX_EXPERTS, PACK_MAX_ROUTES
from b12x.launch.kinds import compiled
from b12x.launch.records import (
    MoeActivateLaunch,
    MoePackLaunch,
    MoeReduceLaunch,
    MoeRotateLaunch,
)
from b12x.ops.moe import routing
from b12x.runtime.scratch import live_rows, live_view

__all__ = [
    "H128_SCALE_FP32",
    "activate",
    "boundary_specs",
    "device_packs",
    "pack",
    "pack_routes",
    "gather_rows_",
    "h128_fp32_",
    "reduce_output",
    "reference_activate",
    "reference_reduce_output",
    "reference_rotate_inputs",
    "rotate_inputs",
]

BLOCK = 128
H128_SCALE_FP32 = 0.088388347648


def h128_fp32_(src: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """H128 of fp32 ``src [R, F]`` (F % 128 == 0) using ``tmp`` (same shape); returns the result.

    Both buffers are overwritten; the result is ``src`` or ``tmp`` (whichever holds stage 7).
    """
    rows, features = src.shape
    cur, nxt = src, tmp
    span = 1
    while span < BLOCK:
        shape = (rows, features // (2 * span), 2, span)
        x, y = cur.view(shape), nxt.view(shape)
        torch.add(x[:, :, 0], x[:, :, 1], out=y[:, :, 0])
        torch.sub(x[:, :, 0], x[:, :, 1], out=y[:, :, 1])
        cur, nxt = nxt, cur
        span *= 2
    cur.mul_(H128_SCALE_FP32)
    return cur


def gather_rows_(table: torch.Tensor, slot_expert: torch.Tensor, out: torch.Tensor) -> None:
    """``out[s] = table[slot_expert[s]]`` (``table`` ``[E, F]``) or ``table[0]`` for ``[1, F]``."""
    if table.shape[0] == 1:
        out.copy_(table.expand(out.shape[0], table.shape[1]))
    else:
        torch.index_select(table, 0, slot_expert, out=out)


# ---------------------------------------------------------------------------- kernel launches


PACK_SPEC = MoeBoundarySpec("pack", False, False)


def _within_packer(routes: int, experts: int) -> bool:
    return routes <= PACK_MAX_ROUTES and experts <= PACK_MAX_EXPERTS


def device_packs(routes: routing.RoutePlan) -> bool:
    """Whether the one-launch packer takes the routing plan ``routes`` (its planned sizes: at
    most :data:`~b12x.kernels.moe_pack.PACK_MAX_ROUTES` routes and
    :data:`~b12x.kernels.moe_pack.PACK_MAX_EXPERTS` experts)."""
    return _within_packer(routes.routes, routes.num_experts)


def boundary_specs(problem) -> tuple[MoeBoundarySpec, ...]:
    """The boundary specialisations ``run_moe`` launches for a plan's ``problem``
    (:class:`b12x.ops.moe.plan.MoeProblem`): rotate, activate, reduce, and the route packer
    when the problem's routes are within its bounds; the warm-up set next to
    ``MoePlan.kernel_specs``."""
    x_bf16 = problem.x_dtype == torch.bfloat16
    cd_bf16 = problem.compute_dtype == torch.bfloat16
    specs = (
        MoeBoundarySpec("rotate", x_bf16, cd_bf16, proj=problem.w13_layout == "proj"),
        MoeBoundarySpec("activate", cd_bf16, cd_bf16),
        MoeBoundarySpec("reduce", cd_bf16, x_bf16, top_k=problem.top_k),
    )
    if _within_packer(problem.m * problem.top_k, problem.num_experts):  # as device_packs
        specs += (PACK_SPEC,)
    return specs


def _words(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def rotate_inputs(
    *,
    arch: str,
    x: torch.Tensor,
    gate_suh: torch.Tensor,
    up_suh: torch.Tensor | None,
    route_expert: torch.Tensor,
    out_gate: torch.Tensor,
    out_up: torch.Tensor | None,
    top_k: int,
    num_experts: int,
) -> None:
    """One launch: ``out_*[r] = cd(fp16(H128(fp16(fp16(x[r // top_k]) · suh[e_r]))))``.

    ``x`` ``[M, H]`` fp16/bf16; ``*_suh`` fp16 ``[E, H]`` or ``[1, H]``; ``route_expert`` int64
    ``[n]`` (clamped to ``E − 1`` in the kernel); ``out_*`` ``[n, H]`` in the compute dtype.
    ``up_suh``/``out_up`` are both given (``proj``) or both None (``packed``).
    """
    proj = up_suh is not None
    if proj != (out_up is not None):
        raise ValueError("up_suh/out_up: give both (proj layout) or neither (packed)")
    spec = MoeBoundarySpec(
        "rotate", x.dtype == torch.bfloat16, out_gate.dtype == torch.bfloat16, proj=proj
    )
    fn = compiled(spec, arch)
    gate_w, out_w = _words(gate_suh), _words(out_gate)
    launch = MoeRotateLaunch(
        x=_words(x),
        gate_suh=gate_w,
        up_suh=_words(up_suh) if proj else gate_w,
        route_expert=route_expert,
        out_gate=out_w,
        out_up=_words(out_up) if proj else out_w,
        top_k=top_k,
        num_experts=num_experts,
    )
    fn(*launch.args())


def activate(
    *,
    arch: str,
    fc1: torch.Tensor,
    rotations: torch.Tensor,
    route_expert: torch.Tensor,
    out: torch.Tensor,
    num_experts: int,
) -> None:
    """One launch: ``out[r] = cd(H128(silu(H128(g)·s1) · H128(u)·s2 · s3))``.

    ``fc1`` ``[n, 2I]`` (gate ``[0, I)``, up ``[I, 2I)``) and ``out`` ``[n, I]`` in the compute
    dtype; ``rotations`` fp16 ``[E, 3I]`` (``s1 | s2 | s3``); ``route_expert`` int64 ``[n]``.
    """
    spec = MoeBoundarySpec("activate", fc1.dtype == torch.bfloat16, out.dtype == torch.bfloat16)
    fn = compiled(spec, arch)
    launch = MoeActivateLaunch(
        fc1=_words(fc1),
        rotations=_words(rotations),
        route_expert=route_expert,
        out=_words(out),
        num_experts=num_experts,
    )
    fn(*launch.args())


def reduce_output(
    *,
    arch: str,
    fc2: torch.Tensor,
    svh: torch.Tensor,
    route_expert: torch.Tensor,
    route_inactive: torch.Tensor,
    weights: torch.Tensor,
    out: torch.Tensor,
    top_k: int,
    num_experts: int,
) -> None:
    """One launch: ``out[t] = x_dtype(Σ_{s<k} active_r · (H128(fc2[r])·svh[e_r])·w[r])``,
    ``r = t·k + s``, summed in fp32 from +0 in slot order.

    ``fc2`` ``[n, H]`` (compute dtype); ``svh`` fp16 ``[E, H]`` or ``[1, H]``; ``route_expert``
    int64 ``[n]``; ``route_inactive`` bool ``[n]``; ``weights`` fp32 ``[n]``; ``out`` ``[M, H]``
    (``M·k = n``) fp16/bf16. Inactive routes add exactly +0 (their rows and weights are unread
    as values: a select drops them).
    """
    if weights.dtype != torch.float32:
        raise TypeError(f"weights: expected dtype torch.float32, got {weights.dtype}")
    spec = MoeBoundarySpec(
        "reduce", fc2.dtype == torch.bfloat16, out.dtype == torch.bfloat16, top_k=top_k
    )
    fn = compiled(spec, arch)
    launch = MoeReduceLaunch(
        fc2=_words(fc2),
        svh=_words(svh),
        route_expert=route_expert,
        route_inactive=route_inactive.view(torch.uint8),
        weights=weights,
        out=_words(out),
        num_experts=num_experts,
    )
    fn(*launch.args())


def pack_routes(
    *, arch: str, plan: routing.RoutePlan, topk_ids: torch.Tensor, buffers
) -> routing.RoutePlan:
    """Pack ``topk_ids`` with one launch of the device packer (after the widening ``copy_`` of
    the ids into ``route_expert``); returns the live plan, as
    :func:`b12x.ops.moe.routing.pack_routes_into` does. The ids are validated and the plan's
    bounds checked before anything is written or launched."""
    routing.check_route_ids(topk_ids, top_k=plan.top_k)
    if not device_packs(plan):
        raise ValueError(
            f"topk_ids: {plan.routes} planned routes over {plan.num_experts} experts exceed the "
            f"device packer's bounds ({PACK_MAX_ROUTES} routes, {PACK_MAX_EXPERTS} experts); "
            "pack with b12x.ops.moe.routing.pack_routes_into"
        )
    live = plan.live(topk_ids.shape[0])
    n, cap = live.routes, live.capacity
    expert = live_rows(buffers, "route_expert", n)
    expert.copy_(topk_ids.reshape(n))  # widening copy; int64 ids are never narrowed
    fn = compiled(PACK_SPEC, arch)
    launch = MoePackLaunch(
        route_expert=expert,
        route_active=live_rows(buffers, "route_active", n).view(torch.uint8),
        route_inactive=live_rows(buffers, "route_inactive", n).view(torch.uint8),
        packed_route_slots=live_rows(buffers, "packed_route_slots", cap + n),
        route_slot=live_rows(buffers, "route_slot", n),
        route_gather=live_rows(buffers, "route_gather", n),
        block_expert_ids=live_rows(buffers, "block_expert_ids", live.num_blocks),
        route_count=buffers["route_count"],
        expert_counts=buffers["expert_counts"],
        expert_offsets=buffers["expert_offsets"],
        block_size=live.block_size,
    )
    fn(*launch.args())
    return live


def pack(
    *, arch: str | None, plan: routing.RoutePlan, topk_ids: torch.Tensor, buffers
) -> routing.RoutePlan:
    """Route packing for ``run_moe``: the device packer when kernels launch (``arch`` given)
    and :func:`device_packs` admits the plan, else the torch packer."""
    if arch is not None and device_packs(plan):
        return pack_routes(arch=arch, plan=plan, topk_ids=topk_ids, buffers=buffers)
    return routing.pack_routes_into(plan, topk_ids, buffers)


# ---------------------------------------------------------------------------- the torch path


def _route_tables(buf, n: int, top_k: int, num_experts: int):
    """(route_token, route_expert_safe) of the first ``n`` routes, into their buffers."""
    route_token = live_rows(buf, "route_token", n)
    torch.arange(n, out=route_token)
    route_token.floor_divide_(top_k)
    route_expert = live_rows(buf, "route_expert_safe", n)
    route_expert.copy_(live_rows(buf, "route_expert", n))
    route_expert.clamp_(max=num_experts - 1)  # the drop bucket E never indexes a table
    return route_token, route_expert


def reference_rotate_inputs(
    buf, *, x, gate_suh, up_suh, out_gate, out_up, n: int, top_k: int, num_experts: int
) -> None:
    """Torch path of :func:`rotate_inputs` on the plan's scratch (``input_f16``, ``route_x``,
    ``route_scale``, ``route_prod``, ``h128_a``/``h128_b``, ``rotation_f16``)."""
    m, h = x.shape
    route_token, route_expert = _route_tables(buf, n, top_k, num_experts)
    x16 = x
    if x.dtype != torch.float16:
        x16 = live_rows(buf, "input_f16", m)
        x16.copy_(x)
    route_x = live_rows(buf, "route_x", n)
    torch.index_select(x16, 0, route_token, out=route_x)
    ping, pong = live_view(buf, "h128_a", n, h), live_view(buf, "h128_b", n, h)
    scale16 = live_view(buf, "route_scale", n, h)
    for suh, dest in ((gate_suh, out_gate), (up_suh, out_up)):
        if suh is None:
            continue
        gather_rows_(suh, route_expert, scale16)
        prod = live_rows(buf, "route_prod", n)
        torch.mul(route_x, scale16, out=prod)  # fp16(x16 · suh): one rounding
        ping.copy_(prod)
        rotated = live_rows(buf, "rotation_f16", n)
        rotated.copy_(h128_fp32_(ping, pong))
        dest.copy_(rotated)


def reference_activate(buf, *, fc1, rotations, out, n: int, top_k: int, num_experts: int) -> None:
    """Torch path of :func:`activate` on the plan's scratch (``route_scale``,
    ``route_scale_f32``, ``h128_a``/``h128_b``, ``gate_f32``)."""
    i = out.shape[1]
    _, route_expert = _route_tables(buf, n, top_k, num_experts)
    inter16 = live_view(buf, "route_scale", n, 3 * i)
    gather_rows_(rotations, route_expert, inter16)
    inter = live_view(buf, "route_scale_f32", n, 3 * i)
    inter.copy_(inter16)
    ping, pong = live_view(buf, "h128_a", n, i), live_view(buf, "h128_b", n, i)
    gate = live_rows(buf, "gate_f32", n)
    ping.copy_(fc1[:, :i])
    gate.copy_(h128_fp32_(ping, pong))
    gate.mul_(inter[:, :i])
    ping.copy_(fc1[:, i:])
    up = h128_fp32_(ping, pong)
    up.mul_(inter[:, i : 2 * i])
    F.silu(gate, inplace=True)
    gate.mul_(up)
    gate.mul_(inter[:, 2 * i :])
    ping.copy_(gate)
    out.copy_(h128_fp32_(ping, pong))


def reference_reduce_output(
    buf, *, fc2, svh, weights, out, n: int, top_k: int, num_experts: int
) -> None:
    """Torch path of :func:`reduce_output` on the plan's scratch (``route_scale``,
    ``route_scale_f32``, ``h128_a``/``h128_b``, ``route_terms``, ``route_weights``, ``term``,
    ``accum``); ``weights`` any floating dtype ``[n]``."""
    m, h = out.shape
    _, route_expert = _route_tables(buf, n, top_k, num_experts)
    ping, pong = live_view(buf, "h128_a", n, h), live_view(buf, "h128_b", n, h)
    ping.copy_(fc2)
    y = h128_fp32_(ping, pong)
    scale16 = live_view(buf, "route_scale", n, h)
    gather_rows_(svh, route_expert, scale16)
    svh32 = live_view(buf, "route_scale_f32", n, h)
    svh32.copy_(scale16)
    terms = live_rows(buf, "route_terms", n)
    torch.mul(y, svh32, out=terms)
    inactive = live_rows(buf, "route_inactive", n)
    terms.masked_fill_(inactive.view(n, 1), 0.0)  # stale rows of inactive routes -> exact 0
    route_weights = live_rows(buf, "route_weights", n)
    route_weights.copy_(weights)
    route_weights.masked_fill_(inactive, 0.0)
    acc, term = live_rows(buf, "accum", m), live_rows(buf, "term", m)
    acc.zero_()
    terms3, weights2 = terms.view(m, top_k, h), route_weights.view(m, top_k)
    for s in range(top_k):
        torch.mul(terms3[:, s], weights2[:, s : s + 1], out=term)
        acc.add_(term)
    out.copy_(acc)
