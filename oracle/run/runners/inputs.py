"""Seeded inputs of one grid case, generated on the CPU and moved to the run's device.

Layout
------
Everything derives from ``case.seed`` through one ``torch.Generator``, so a case id alone
reproduces its inputs (and a saved case can be checked against them). Payloads are uniform
random 16-bit words: every trellis tile is a valid tile (spec §1.3).

* :func:`dense_inputs`: ``x [M, K]`` (scale :data:`X_SCALE`), ``trellis [K/16, N/16, 16·b]``,
  and for rotation ``full`` the scales ``suh [K]``, ``svh [N]`` (random signs × [0.5, 1.5));
  rotation ``none`` uses all-ones scales (the raw GEMM through an identity H128 callback).
* :func:`moe_choices`: the execution choices a MoE case makes inside its variant (``w13``
  layout, the x dtype, the route-id dtype, which phases are paired and whether a pair phase is
  dynamic), cycled over the case's position in its variant's M buckets so that every variant
  meets each choice across its cases.
* :func:`moe_inputs`: experts as a reference stack (:class:`reference.moe.TrellisExperts`,
  :class:`reference.tiers.MixedTierExperts` or :class:`reference.moe_pairs.PairedExperts`) plus
  the routed batch. About one route in eight is made inactive with an id b12x must never use
  (−1, E, 2^31 − 1 for int32, 2^31 and 2^32 for int64), carrying a NaN router weight; with four
  tokens or more one token has every route inactive. Tier cases route by global id over a
  namespace with two unmapped ids (also inactive).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from oracle.cases.grids import M_BUCKETS
from reference.moe import TrellisExperts
from reference.moe_pairs import PairedExperts
from reference.pairs import PAIR_KINDS
from reference.tiers import MixedTierExperts

__all__ = [
    "WINDOW_REGIMES",
    "MoeChoices",
    "X_SCALE",
    "dense_inputs",
    "moe_choices",
    "moe_inputs",
    "moved",
    "paired_experts",
    "payload",
    "random_scales",
    "stack_to",
    "trellis_experts",
]

#: One (codebook, bits) per lane-window regime of the decode (rates 1-8, each with its own ring
#: geometry) plus the two LUT decoders: the sample the kernel identity tests parametrise over.
WINDOW_REGIMES = (
    ("mcg", 1),
    ("mcg", 2),
    ("3inst", 3),
    ("mcg", 4),
    ("mul1", 5),
    ("mcg", 6),
    ("3inst", 7),
    ("mul1", 8),
    ("sqg_e4m3", 3),
    ("sqg_fp16", 5),
)

X_SCALE = 0.1
MOE_X_SCALE = 0.1
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def generator(case: Any) -> torch.Generator:
    return torch.Generator().manual_seed(int(case.seed))


def payload(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Uniform random int16 words (every tile valid)."""
    return torch.randint(-(1 << 15), 1 << 15, shape, generator=gen, dtype=torch.int32).to(
        torch.int16
    )


def random_scales(gen: torch.Generator, *shape: int, low: float = 0.5) -> torch.Tensor:
    """fp16 scales: random sign × uniform [low, low + 1)."""
    sign = torch.where(torch.rand(*shape, generator=gen) < 0.5, -1.0, 1.0)
    return (sign * (low + torch.rand(*shape, generator=gen))).half()


def compute_dtype(case: Any) -> torch.dtype:
    return _DTYPES[case.variant.compute_dtype]


def dense_inputs(case: Any, device: str | torch.device) -> dict[str, torch.Tensor]:
    """``x``, ``trellis``, ``suh``, ``svh`` of a dense case (module docstring)."""
    v = case.variant
    gen = generator(case)
    trellis = payload(gen, case.k // 16, case.n // 16, 16 * v.bits)
    x = (torch.randn(case.m, case.k, generator=gen) * X_SCALE).to(compute_dtype(case))
    if v.rotation == "full":
        suh, svh = random_scales(gen, case.k), random_scales(gen, case.n)
    else:
        suh = torch.ones(case.k, dtype=torch.float16)
        svh = torch.ones(case.n, dtype=torch.float16)
    out = {"x": x, "trellis": trellis, "suh": suh, "svh": svh}
    return {k: t.to(device) for k, t in out.items()}


@dataclasses.dataclass(frozen=True)
class MoeChoices:
    """Execution choices of one MoE case inside its variant (module docstring)."""

    layout: str
    x_dtype: torch.dtype
    ids_dtype: torch.dtype
    fc1_pair: str | None = None
    fc2_pair: str | None = None

    def describe(self) -> str:
        parts = [self.layout, str(self.x_dtype).removeprefix("torch."),
                 str(self.ids_dtype).removeprefix("torch.")]  # fmt: skip
        if self.fc1_pair or self.fc2_pair:
            parts.append(f"fc1={self.fc1_pair},fc2={self.fc2_pair}")
        return "/".join(parts)


def _position(case: Any) -> int:
    """The case's index among its variant's M buckets (stable across grid changes elsewhere)."""
    return M_BUCKETS.index(case.m) if case.m in M_BUCKETS else case.m


def moe_choices(case: Any) -> MoeChoices:
    """Cycle layout, x dtype, id dtype and the pair phases over the case's M position."""
    v, i = case.variant, _position(case)
    layout = ("packed", "proj")[i % 2]
    x_dtype = (torch.float16, torch.bfloat16)[(i // 2) % 2]
    ids_dtype = (torch.int64, torch.int32)[(i // 4) % 2]
    if v.pair_kind is None:
        return MoeChoices(layout, x_dtype, ids_dtype)
    kind = v.pair_kind
    dynamic = kind in ("P33", "P24") and (i // 3) % 2 == 1
    choice = "dynamic" if dynamic else kind
    phases = ((choice, choice), (choice, None), (None, choice))[i % 3]
    return MoeChoices(layout, x_dtype, ids_dtype, *phases)


def _routes(gen: torch.Generator, case: Any, num_ids: int, ids_dtype: torch.dtype, inactive):
    m, top_k = case.m, case.top_k
    ids = torch.stack([torch.randperm(num_ids, generator=gen)[:top_k] for _ in range(m)])
    weights = torch.rand(m, top_k, generator=gen)
    flat_ids, flat_w = ids.view(-1), weights.view(-1)
    routes = m * top_k
    picks = torch.randperm(routes, generator=gen)[: max(1, routes // 8)] if routes > 1 else []
    for j, r in enumerate(picks):
        flat_ids[int(r)] = inactive[j % len(inactive)]
        flat_w[int(r)] = float("nan")
    if m >= 4:
        ids[-1] = inactive[0]
        weights[-1] = float("nan")
    return ids.to(ids_dtype), weights


def _inactive_ids(num_ids: int, ids_dtype: torch.dtype) -> list[int]:
    if ids_dtype == torch.int32:
        return [-1, num_ids, (1 << 31) - 1]
    return [-1, num_ids, 1 << 31, 1 << 32]


def trellis_experts(gen, e, h, i, bits, layout, codebook):
    """A uniform reference stack (``reference.moe.TrellisExperts``, on the CPU) of ``e`` experts
    of hidden ``h`` and intermediate ``i``: random payloads of ``bits`` and rotation scales of
    magnitude 0.8..1.8 with random signs, from ``gen``."""
    words = 16 * bits
    if layout == "packed":
        w13 = payload(gen, e, h // 16, 2 * i // 16, words)
    else:
        w13 = payload(gen, 2, e, h // 16, i // 16, words)
    gate = random_scales(gen, e, h, low=0.8)
    up = gate if layout == "packed" else random_scales(gen, e, h, low=0.8)
    return TrellisExperts(
        w13, payload(gen, e, i // 16, h // 16, words), gate, up,
        random_scales(gen, e, 3 * i, low=0.8), random_scales(gen, 1, h, low=0.8), codebook, layout,
    )  # fmt: skip


def paired_experts(gen, e, h, i, choices: MoeChoices, codebook):
    """A paired reference stack (``reference.moe_pairs.PairedExperts``, on the CPU): random
    payloads of the phases' pair choices (uniform K3 words for an unpaired phase), scales as
    :func:`trellis_experts`, a random mode table per dynamic phase with both kinds present."""

    def rate_sum(choice):
        return 6 if choice == "dynamic" else sum(PAIR_KINDS[choice])

    def words(choice):
        return (h // 16) * (i // 256) * 128 * rate_sum(choice)

    fc1, fc2, layout = choices.fc1_pair, choices.fc2_pair, choices.layout
    if fc1 is None:
        shape = (2, e, h // 16, i // 16, 48) if layout == "proj" else (e, h // 16, 2 * i // 16, 48)
        w13 = payload(gen, *shape)
    else:
        shape = (2, e, words(fc1)) if layout == "proj" else (e, 2 * words(fc1))
        w13 = payload(gen, *shape)
    w2 = payload(gen, e, i // 16, h // 16, 48) if fc2 is None else payload(gen, e, words(fc2))
    gate = random_scales(gen, e, h, low=0.8)
    up = gate if layout == "packed" else random_scales(gen, e, h, low=0.8)

    def modes(choice):
        if choice != "dynamic":
            return None
        table = torch.randint(0, 2, (e,), generator=gen, dtype=torch.int32)
        table[0] = 0
        table[min(1, e - 1)] = 1  # both kinds present
        return table

    return PairedExperts(
        w13, w2, gate, up, random_scales(gen, e, 3 * i, low=0.8), random_scales(gen, 1, h, low=0.8),
        codebook, layout, fc1, fc2, modes(fc1), modes(fc2),
    )  # fmt: skip


def stack_to(obj: Any, device) -> Any:
    """A copy of a frozen reference stack with every tensor field on ``device``."""
    changes = {
        f.name: getattr(obj, f.name).to(device)
        for f in dataclasses.fields(obj)
        if f.init and isinstance(getattr(obj, f.name), torch.Tensor)
    }
    nested = {
        f.name: stack_to(getattr(obj, f.name), device)
        for f in dataclasses.fields(obj)
        if f.init and dataclasses.is_dataclass(getattr(obj, f.name))
    }
    return dataclasses.replace(obj, **changes, **nested)


def moe_inputs(case: Any, device: str | torch.device) -> dict[str, Any]:
    """``experts`` (a reference stack on ``device``), ``x``, ``topk_weights``, ``topk_ids``,
    ``choices`` and, for tiers, the global id namespace (module docstring)."""
    v, choices = case.variant, moe_choices(case)
    gen = generator(case)
    h, i, e = case.k, case.n, case.experts
    x = (torch.randn(case.m, h, generator=gen) * MOE_X_SCALE).to(choices.x_dtype)
    if v.tier_layout is not None:
        bits0, bits1 = v.record_bits
        e0, e1 = max(1, (e + 1) // 2), max(1, e // 2)
        num_global = e0 + e1 + 2  # two global ids map to no tier: inactive routes
        order = torch.randperm(num_global, generator=gen).tolist()
        t0 = trellis_experts(gen, e0, h, i, bits0, choices.layout, v.codebook)
        t1 = trellis_experts(gen, e1, h, i, bits1, choices.layout, v.codebook)
        experts = MixedTierExperts(
            t0, t1, bits0, bits1, v.codebook, order[:e0], order[e0 : e0 + e1], num_global
        )
        num_ids = num_global
    elif v.pair_kind is not None:
        experts = paired_experts(gen, e, h, i, choices, v.codebook)
        num_ids = e
    else:
        experts = trellis_experts(gen, e, h, i, v.bits, choices.layout, v.codebook)
        num_ids = e
    ids, weights = _routes(
        gen, case, num_ids, choices.ids_dtype, _inactive_ids(num_ids, choices.ids_dtype)
    )
    host = {"experts": experts, "x": x, "topk_weights": weights, "topk_ids": ids}
    return moved(dict(host, choices=choices), device)


def moved(inputs: dict[str, Any], device: str | torch.device) -> dict[str, Any]:
    """A MoE case's inputs (:func:`moe_inputs`) with the experts stack and every tensor on
    ``device``; other entries (``choices``) kept as they are."""
    return {
        name: stack_to(value, device)
        if name == "experts"
        else value.to(device)
        if isinstance(value, torch.Tensor)
        else value
        for name, value in inputs.items()
    }
