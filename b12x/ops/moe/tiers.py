"""Mixed K3/K4 expert tiers on the fused MoE (spec §4.1; R1, R11).

Layout
------
* **Combined namespace** (:func:`build_tiered_maps`): tier-0 experts get combined ids ``[0, E0)``
  and tier-1 experts ``[E0, E0 + E1)`` in the order of each tier's global id list;
  ``global_to_combined`` int32 ``[num_global]`` (−1 = unmapped: an inactive route) and
  ``descriptor_map`` int32 ``[E0 + E1]`` = ``(tier << 8) | local`` (≤ 256 experts per tier).
* :func:`combine_tier_rotations` concatenates the rotation tables tier 0 ‖ tier 1 (broadcast
  ``[1, H]`` rows expanded), so input rotation and the boundary run once, combined.
* :func:`plan_tiered_moe` plans one MoE over both tiers; the codebook is a required keyword and
  must be ``"mcg"`` (EXL3 tiers). :data:`TIER_CODEBOOK` is that value; :data:`TIER_BITS` the
  tier rates ``(tier 0, tier 1)`` b12x declares support for (K3/K4, spec §4.1).
* **Launch sequence**: :func:`b12x.ops.moe.run.tier_gemm_stage`, beside the uniform and paired
  stages it is chosen among (so ``run`` never imports this module): per phase, one grouped-GEMM
  launch per tier (and per projection for ``proj``) over the same route blocks; each launch
  computes only the blocks whose descriptor names its tier, with the tier's own payload and bit
  rate, through the shared body :func:`b12x.ops.moe.run.launch_grouped_gemm` by keyword with the
  codebook spelled out as ``"mcg"`` (pinned in ``fixtures/pinned_slots.json``).

Invariants
----------
* Nothing here has a default codebook or bit rate; plan-time helpers may allocate, the stage
  (in ``run``) only launches into bound buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from b12x.formats import resolve_format
from b12x.kernels.moe_gemm import TIER_SHIFT
from b12x.ops.moe.plan import MAX_TIER_EXPERTS, MoePlan, plan_moe
from b12x.runtime.validate import check_positive_int

__all__ = [
    "TIER_BITS",
    "TIER_CODEBOOK",
    "build_tiered_maps",
    "combine_tier_rotations",
    "plan_tiered_moe",
]

TIER_CODEBOOK = "mcg"
TIER_BITS = (3, 4)


def _ids(value: object, name: str) -> list[int]:
    if isinstance(value, torch.Tensor):
        if value.dtype not in (torch.int32, torch.int64) or value.dim() != 1:
            raise TypeError(f"{name}: expected a 1-d int32/int64 tensor, got {value.dtype}")
        return [int(v) for v in value.tolist()]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name}: expected a sequence of ints, got {type(value).__name__}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: expected ints, got {type(v).__name__}")
        out.append(v)
    return out


def build_tiered_maps(
    tier0_global_ids, tier1_global_ids, num_global_experts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(global_to_combined int32 [num_global], descriptor_map int32 [E0 + E1])`` (CPU)."""
    if isinstance(num_global_experts, bool) or not isinstance(num_global_experts, int):
        raise TypeError("num_global_experts: expected int")
    if num_global_experts < 1:
        raise ValueError(f"num_global_experts: expected a positive int, got {num_global_experts}")
    tiers = (_ids(tier0_global_ids, "tier0_global_ids"), _ids(tier1_global_ids, "tier1_global_ids"))
    g2c = [-1] * num_global_experts
    descriptors = []
    for tier, ids in enumerate(tiers):
        name = f"tier{tier}_global_ids"
        if len(ids) > MAX_TIER_EXPERTS:
            raise ValueError(f"{name}: a tier holds at most 256 experts, got {len(ids)}")
        for local, gid in enumerate(ids):
            if not 0 <= gid < num_global_experts:
                raise ValueError(f"{name}: id {gid} is outside [0, {num_global_experts})")
            if g2c[gid] != -1:
                raise ValueError(f"{name}: global id {gid} is listed twice")
            g2c[gid] = len(descriptors)
            descriptors.append((tier << TIER_SHIFT) | local)
    return torch.tensor(g2c, dtype=torch.int32), torch.tensor(descriptors, dtype=torch.int32)


def combine_tier_rotations(
    tier0: dict[str, torch.Tensor], tier1: dict[str, torch.Tensor], counts: tuple[int, int]
) -> dict[str, torch.Tensor]:
    """Concatenate each table tier 0 ‖ tier 1 (``[1, F]`` rows expanded to the tier's count)."""
    names = ("gate_suh", "up_suh", "intermediate_rotations", "down_svh")
    out = {}
    for name in names:
        parts = []
        for t, table in enumerate((tier0[name], tier1[name])):
            if not isinstance(table, torch.Tensor) or table.dim() != 2:
                raise ValueError(f"tier{t}.{name}: expected a 2-d tensor")
            parts.append(table.expand(counts[t], table.shape[1]))
        out[name] = torch.cat(parts, dim=0).contiguous()
    return out


def plan_tiered_moe(
    *,
    m: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    codebook: str,
    tier0_bits: int,
    tier1_bits: int,
    tier0_experts: int,
    tier1_experts: int,
    num_global_experts: int,
    w13_layout: str,
    x_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    shared_decode: str | None = None,
    device: Any = None,
) -> MoePlan:
    """Plan an MoE over two tiers (``codebook`` must be ``"mcg"``; no defaults anywhere).

    Both FC1 layouts (``"packed"``, ``"proj"``) and both compute dtypes are supported; every
    refusal names the argument (``tier0_bits``, ``tier1_experts``, ...) and what it accepts.
    ``shared_decode`` and ``device`` as in :func:`b12x.ops.moe.plan.plan_moe`."""
    fmt = resolve_format(codebook)
    if not fmt.tiered:
        raise ValueError(
            f"codebook: mixed tiers are EXL3 MCG tiers, expected {TIER_CODEBOOK!r}, got "
            f"{codebook!r}"
        )
    for name, value in (
        ("tier0_bits", tier0_bits),
        ("tier1_bits", tier1_bits),
        ("tier0_experts", tier0_experts),
        ("tier1_experts", tier1_experts),
    ):
        check_positive_int(name, value)
    for name, value in (("tier0_bits", tier0_bits), ("tier1_bits", tier1_bits)):
        try:
            fmt.check_bits(value)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    for name, value in (("tier0_experts", tier0_experts), ("tier1_experts", tier1_experts)):
        if value > MAX_TIER_EXPERTS:
            raise ValueError(
                f"{name}: a tier holds at most {MAX_TIER_EXPERTS} experts, got {value}"
            )
    return plan_moe(
        m=m,
        top_k=top_k,
        hidden=hidden,
        intermediate=intermediate,
        codebook=codebook,
        bits=(tier0_bits, tier1_bits),
        num_experts=(tier0_experts, tier1_experts),
        w13_layout=w13_layout,
        x_dtype=x_dtype,
        compute_dtype=compute_dtype,
        num_global_experts=num_global_experts,
        m_tiles=None,
        shared_decode=shared_decode,
        device=device,
    )
