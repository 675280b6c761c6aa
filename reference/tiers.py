"""Mixed K3/K4 expert tiers in one combined expert namespace (spec §4.1).

A **tier** is a set of whole experts sharing one native bit rate: FC1 and FC2 of an expert are both
at its tier's rate, and each tier is an ordinary :class:`reference.moe.TrellisExperts` stack with
its own payloads and rotation tables. Two tiers (tier 0, tier 1) are served together:

* **Global ids** are the router's expert ids, ``[0, num_global_experts)``.
* **Combined ids**: tier-0 experts get ``[0, E0)`` and tier-1 experts ``[E0, E0 + E1)``, each in the
  order of the id list given for the tier (position ``j`` of a tier list is local id ``j``).
* ``global_to_combined`` int32 ``[num_global_experts]``: the combined id of each global expert,
  ``-1`` for a global expert in neither tier (an **unmapped** expert: its routes are inactive and
  contribute exactly zero, like any other inactive id).
* ``descriptor_map`` int32 ``[E0 + E1]``: ``(tier << 8) | local_id``. A tier holds at most 256
  experts so the local id fits the low byte; more raises. A global id listed twice (within a tier or
  across tiers) raises.
* :func:`combine_rotations` concatenates the rotation tables tier 0 || tier 1
  (``intermediate_rotations``, ``gate_suh``, ``up_suh``, ``down_svh``), expanding a broadcast ``[1,
  H]`` table to ``[E_t, H]`` first, so the combined tables are always ``[E0 + E1, ...]`` and input
  rotation and activation run once in the combined namespace.

:func:`mixed_moe_forward` maps global ids to combined ids (unmapped and out-of-range ids become
inactive; int64 ids are range-checked before any narrowing), groups routes by combined id, takes
each combined expert's rotations from the combined tables and its payload from its own tier through
``descriptor_map``, and finishes with the §3.4 top-k sum (:func:`reference.moe.weighted_route_sum`).
Its result therefore equals the sum of two single-tier :func:`reference.moe.moe_forward` calls with
the routes split by tier (up to the fp summation order of the final sum).

Nothing has a default codebook or bit rate: :class:`MixedTierExperts` takes ``tier0_bits``,
``tier1_bits`` and ``codebook`` explicitly and checks them against both payloads (R11).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from reference._checks import check_dtype, check_int
from reference.moe import (
    ExpertRotations,
    TrellisExperts,
    route_outputs_from_source,
    validate_moe_inputs,
    validate_topk_weights,
    weighted_route_sum,
)
from reference.routing import active_mask

MAX_EXPERTS_PER_TIER = 256
TIER_SHIFT = 8


def _id_list(ids: object, name: str) -> list[int]:
    """A tier's global ids as a list of ints, from a sequence of ints or an int32/int64 tensor."""
    if isinstance(ids, torch.Tensor):
        ids = check_dtype(ids, (torch.int32, torch.int64), name)
        if ids.dim() != 1:
            raise ValueError(f"{name}: expected a 1-d tensor of ids, got {tuple(ids.shape)}")
        return [int(v) for v in ids.tolist()]
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"{name}: expected a sequence of ints or an int tensor, got {type(ids)}")
    return [check_int(v, name) for v in ids]


def build_tiered_maps(
    tier0_global_ids: Sequence[int] | torch.Tensor,
    tier1_global_ids: Sequence[int] | torch.Tensor,
    num_global_experts: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(global_to_combined int32 [num_global], descriptor_map int32 [E0 + E1])``.

    See the module docstring. Raises ValueError for a tier of more than 256 experts, an id
    outside ``[0, num_global_experts)`` and an id listed twice.
    """
    num_global_experts = check_int(num_global_experts, "num_global_experts")
    if num_global_experts < 1:
        raise ValueError(f"num_global_experts: expected a positive int, got {num_global_experts}")
    tiers = (
        _id_list(tier0_global_ids, "tier0_global_ids"),
        _id_list(tier1_global_ids, "tier1_global_ids"),
    )
    seen: dict[int, str] = {}
    for tier, ids in enumerate(tiers):
        name = f"tier{tier}_global_ids"
        if len(ids) > MAX_EXPERTS_PER_TIER:
            raise ValueError(
                f"{name}: a tier holds at most {MAX_EXPERTS_PER_TIER} experts, got {len(ids)}"
            )
        for global_id in ids:
            if not 0 <= global_id < num_global_experts:
                raise ValueError(
                    f"{name}: id {global_id} is outside [0, {num_global_experts}) "
                    "(num_global_experts)"
                )
            if global_id in seen:
                raise ValueError(
                    f"{name}: global id {global_id} is already listed in {seen[global_id]}"
                )
            seen[global_id] = name
    global_to_combined = torch.full((num_global_experts,), -1, dtype=torch.int32)
    descriptors = []
    combined = 0
    for tier, ids in enumerate(tiers):
        for local, global_id in enumerate(ids):
            global_to_combined[global_id] = combined
            descriptors.append((tier << TIER_SHIFT) | local)
            combined += 1
    return global_to_combined, torch.tensor(descriptors, dtype=torch.int32)


@dataclass(frozen=True, eq=False)
class CombinedRotations:
    """Rotation tables of both tiers in the combined namespace, rows ``[0, E0)`` then tier 1."""

    intermediate_rotations: torch.Tensor  # fp16 [E0 + E1, 3I]
    gate_suh: torch.Tensor  # fp16 [E0 + E1, H]
    up_suh: torch.Tensor  # fp16 [E0 + E1, H]
    down_svh: torch.Tensor  # fp16 [E0 + E1, H]

    def expert(self, combined_id: int) -> ExpertRotations:
        inter = self.intermediate_rotations.shape[1] // 3
        row = self.intermediate_rotations[combined_id]
        return ExpertRotations(
            gate_suh=self.gate_suh[combined_id],
            up_suh=self.up_suh[combined_id],
            gate_svh=row[:inter],
            up_svh=row[inter : 2 * inter],
            down_suh=row[2 * inter :],
            down_svh=self.down_svh[combined_id],
        )


def combine_rotations(tier0: TrellisExperts, tier1: TrellisExperts) -> CombinedRotations:
    """Concatenate tier 0 || tier 1 rotation tables (broadcast ``[1, H]`` rows expanded)."""
    for name, tier in (("tier0", tier0), ("tier1", tier1)):
        if not isinstance(tier, TrellisExperts):
            raise TypeError(f"{name}: expected TrellisExperts, got {type(tier).__name__}")
    _check_same_geometry(tier0, tier1)

    def cat(field_name: str) -> torch.Tensor:
        parts = []
        for tier in (tier0, tier1):
            table = getattr(tier, field_name)
            parts.append(table.expand(tier.num_experts, table.shape[1]))
        return torch.cat(parts, dim=0)

    return CombinedRotations(
        intermediate_rotations=cat("intermediate_rotations"),
        gate_suh=cat("gate_suh"),
        up_suh=cat("up_suh"),
        down_svh=cat("down_svh"),
    )


def _check_same_geometry(tier0: TrellisExperts, tier1: TrellisExperts) -> None:
    for what in ("hidden_size", "intermediate_size"):
        if getattr(tier0, what) != getattr(tier1, what):
            raise ValueError(
                f"tier1: {what} {getattr(tier1, what)} differs from tier0's {getattr(tier0, what)}"
            )
    if tier0.w13.device != tier1.w13.device:
        raise ValueError(
            f"tier1: device {tier1.w13.device} differs from tier0's {tier0.w13.device}"
        )


@dataclass(frozen=True, eq=False)
class MixedTierExperts:
    """Two whole-expert tiers (for example K3 and K4) behind one global expert namespace.

    ``tier0_bits``, ``tier1_bits`` and ``codebook`` are explicit and must match the payloads of
    ``tier0`` / ``tier1`` (both tiers use ``codebook``). ``tier{t}_global_ids`` lists the global
    id of each local expert of tier ``t`` (its length must equal that tier's expert count); it is
    stored as a tuple of ints. ``global_to_combined``, ``descriptor_map`` and ``rotations``
    (:func:`combine_rotations`) are derived on construction.
    """

    tier0: TrellisExperts
    tier1: TrellisExperts
    tier0_bits: int
    tier1_bits: int
    codebook: str
    tier0_global_ids: Sequence[int] | torch.Tensor
    tier1_global_ids: Sequence[int] | torch.Tensor
    num_global_experts: int
    global_to_combined: torch.Tensor = field(init=False)
    descriptor_map: torch.Tensor = field(init=False)
    rotations: CombinedRotations = field(init=False)

    def __post_init__(self) -> None:
        for tier in (0, 1):
            name = f"tier{tier}"
            experts = getattr(self, name)
            if not isinstance(experts, TrellisExperts):
                raise TypeError(f"{name}: expected TrellisExperts, got {type(experts).__name__}")
            bits = check_int(getattr(self, f"{name}_bits"), f"{name}_bits")
            if bits != experts.bits:
                raise ValueError(
                    f"{name}_bits: declared {bits}, but the {name} payloads are {experts.bits}-bit"
                )
        if not isinstance(self.codebook, str):
            raise TypeError(f"codebook: expected a str, got {type(self.codebook).__name__}")
        for tier in (0, 1):
            experts = getattr(self, f"tier{tier}")
            if experts.codebook != self.codebook:
                raise ValueError(
                    f"codebook: declared {self.codebook!r}, but tier{tier} uses "
                    f"{experts.codebook!r}"
                )
        g2c, descriptors = build_tiered_maps(
            self.tier0_global_ids, self.tier1_global_ids, self.num_global_experts
        )
        for tier in (0, 1):  # freeze the id lists so they cannot drift from the maps
            name = f"tier{tier}_global_ids"
            object.__setattr__(self, name, tuple(_id_list(getattr(self, name), name)))
        for tier in (0, 1):
            count = int(((descriptors >> TIER_SHIFT) == tier).sum())
            experts = getattr(self, f"tier{tier}")
            if count != experts.num_experts:
                raise ValueError(
                    f"tier{tier}_global_ids: lists {count} experts, but tier{tier} holds "
                    f"{experts.num_experts}"
                )
        object.__setattr__(self, "global_to_combined", g2c.to(self.tier0.w13.device))
        object.__setattr__(self, "descriptor_map", descriptors.to(self.tier0.w13.device))
        object.__setattr__(self, "rotations", combine_rotations(self.tier0, self.tier1))

    @property
    def num_combined_experts(self) -> int:
        return self.tier0.num_experts + self.tier1.num_experts

    @property
    def hidden_size(self) -> int:
        return self.tier0.hidden_size

    def combined_ids(self, topk_global_ids: torch.Tensor) -> torch.Tensor:
        """int64 combined ids shaped like ``topk_global_ids``; ``-1`` where inactive/unmapped."""
        active = active_mask(topk_global_ids, self.num_global_experts)
        safe = torch.where(active, topk_global_ids, torch.zeros_like(topk_global_ids))
        mapped = self.global_to_combined.to(torch.int64)[safe.to(torch.int64)]
        return torch.where(active, mapped, torch.full_like(mapped, -1))

    def tier_of(self, combined_id: int) -> tuple[int, int]:
        """``(tier, local_id)`` of a combined expert, decoded from ``descriptor_map``."""
        descriptor = int(self.descriptor_map[combined_id])
        return descriptor >> TIER_SHIFT, descriptor & (MAX_EXPERTS_PER_TIER - 1)

    def combined_expert(self, combined_id: int):
        """``(decoded weights, rotations, shared_input)`` of combined expert ``combined_id``: the
        payload from its tier, the rotations from the combined tables (the per-expert source of
        :func:`mixed_moe_forward`, and of the oracle's MoE judge)."""
        tier, local = self.tier_of(combined_id)
        experts = self.tier0 if tier == 0 else self.tier1
        shared = experts.w13_layout == "packed"
        return experts.decode_expert(local), self.rotations.expert(combined_id), shared


def mixed_moe_forward(
    x: torch.Tensor,
    mixed: MixedTierExperts,
    topk_weights: torch.Tensor,
    topk_global_ids: torch.Tensor,
    *,
    precision: str = "exact",
    compute_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """§3.4 MoE over two tiers, routed by global ids; float64 (exact) or float32 (faithful)."""
    if not isinstance(mixed, MixedTierExperts):
        raise TypeError(f"mixed: expected MixedTierExperts, got {type(mixed).__name__}")
    validate_moe_inputs(
        x, mixed.hidden_size, topk_global_ids, precision, compute_dtype, mixed.tier0.w13.device
    )
    validate_topk_weights(topk_weights, topk_global_ids, x)
    combined = mixed.combined_ids(topk_global_ids)

    outputs, active = route_outputs_from_source(
        x,
        combined,
        mixed.num_combined_experts,
        mixed.combined_expert,
        precision=precision,
        compute_dtype=compute_dtype,
    )
    return weighted_route_sum(outputs, active, topk_weights)
