"""plan / bind / run of the fused trellis MoE: uniform rate, two K3/K4 tiers, or QSRT pairs per
phase on the uniform (K3-base) stack (spec §3.4, §4.1, §4.2).

The launch sequence of :func:`run_moe` (every step writes a caller buffer; no allocation, no
host synchronisation, so one call is CUDA-graph capturable; R4):

1. **Route packing** (:mod:`b12x.moe.routing`, torch ops) of the combined expert ids into
   blocks of ``B = 16·m_tiles`` slots. For tiers, global ids go through ``global_to_combined``
   first (int64 range check before any narrowing; unmapped experts are inactive).
2. **Input rotation per route** (route order, ``n = M·top_k`` rows, not the padded capacity):
   ``A = fp16(H128(fp16(fp16(x_t) · suh[e])))`` in the compute dtype (bf16 is rounded from that
   fp16), ``proj`` with separate gate/up rotations.
3. **FC1**: the grouped trellis GEMM (:mod:`b12x.kernels.moe_gemm`, CuTe DSL, fp32 accumulate)
   over the route blocks: each slot gathers its route's A row and scatters its result back to
   the route's row, one launch per projection and tier, into the ``fc1`` buffer (gate at
   columns ``[0, I)``, up at ``[I, 2I)``). Rows of inactive routes are never written.
4. **Boundary** (§3.4 step 3, fp32): ``g = H128(gate)·gate_svh``, ``u = H128(up)·up_svh``,
   ``a = silu(g)·u·down_suh``, ``A2 = elem(H128(a))``.
5. **FC2**: the grouped GEMM into ``fc2``.
6. **Top-k sum** (fp32): ``out_t = Σ_active w · H128(y)·down_svh`` in top-k order from a zero
   accumulator; inactive routes' rows are zeroed and their weights set to zero, so they add
   exactly +0 whatever the stale row or the weight held (NaN included), and their ids are never
   used as indices (the drop bucket is clamped before any table gather). Stored in ``x.dtype``.

Padding slots load a clamped A row and store nothing. Every route's output depends
only on its own row (no split-K across CTAs; the intra-CTA K split's factor is chosen from the
weight geometry alone, :func:`choose_k_split`, and reduces in a fixed order), so the op is
**batch invariant**: a token's output at batch M equals its batch-1 output bit for bit, given
the same routes.

Buffers: :func:`moe_buffer_specs` (exact shapes for the planned ``M``; see each name there).
Plans are frozen; ``run`` reads the plan and never re-decides anything (R15). A paired phase
(``fc1_pair``/``fc2_pair``) plans one :class:`~b12x.kernels.moe_gemm.MoeGemmSpec` with ``pair``
and ``rate_axis`` set (:func:`b12x.moe.pairs.pair_gemm_spec`) in place of the uniform spec; the
buffers are the same.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

import torch

from b12x.dense import tiles as dense_tiles
from b12x.formats import resolve_format
from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.moe import routing
from b12x.moe.pairs import (
    PAIR_BASE_BITS,
    PAIR_CHANNELS,
    check_pair_choice,
    check_pair_codebook,
    pair_gemm_spec,
)
from b12x.runtime.scratch import (
    BufferSpec,
    allocate_buffers,
    check_known_names,
    require_buffer,
)
from b12x.runtime.validate import (
    HALF_DTYPES,
    check_choice,
    check_dtype_choice,
    check_positive_int,
)

__all__ = [
    "BoundMoe",
    "MoePlan",
    "MoeProblem",
    "W13_LAYOUTS",
    "allocate_moe_buffers",
    "bind_moe",
    "check_moe_problem",
    "moe_buffer_specs",
    "plan_moe",
]

W13_LAYOUTS = ("packed", "proj")
MAX_TIER_EXPERTS = 256
MAX_GRID_Y = 65535  # route blocks are the grid's y dimension


@dataclasses.dataclass(frozen=True)
class TierSpec:
    """One tier: its bit rate and expert count (a uniform stack is a single tier 0)."""

    bits: int
    num_experts: int


@dataclasses.dataclass(frozen=True)
class MoeProblem:
    m: int
    top_k: int
    hidden: int
    intermediate: int
    codebook: str
    tiers: tuple[TierSpec, ...]
    w13_layout: str
    x_dtype: torch.dtype
    compute_dtype: torch.dtype
    num_global_experts: int | None  # tiers only: the router's namespace
    fc1_pair: str | None = None  # QSRT pairs on FC1's N axis: None, a kind or "dynamic"
    fc2_pair: str | None = None  # QSRT pairs on FC2's K axis

    @property
    def paired(self) -> bool:
        return self.fc1_pair is not None or self.fc2_pair is not None

    @property
    def num_experts(self) -> int:
        """Experts of the combined namespace (the route packer's E)."""
        return sum(t.num_experts for t in self.tiers)


@dataclasses.dataclass(frozen=True)
class MoePlan:
    problem: MoeProblem
    routes: routing.RoutePlan
    fc1_spec: tuple[MoeGemmSpec, ...]
    fc2_spec: tuple[MoeGemmSpec, ...]
    buffers: tuple[BufferSpec, ...]

    @property
    def buffer_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.buffers)

    @property
    def kernel_specs(self) -> tuple[MoeGemmSpec, ...]:
        """The grouped-GEMM specialisations ``run`` launches (the warm-up set)."""
        return tuple(dict.fromkeys(self.fc1_spec + self.fc2_spec))


def choose_m_tiles(m: int, top_k: int, num_experts: int) -> int:
    """M16 blocks per route block: 1 while an expert sees ≤ 24 routes on average, else 2 / 4."""
    per_expert = m * top_k / num_experts
    return 1 if per_expert <= 24 else 2 if per_expert <= 48 else 4


#: The intra-CTA K split never leaves a warp group fewer K elements than this (32 K16 rows).
MIN_K_SLICE = 512
#: Largest planned K split (the kernel compiles 8 too; 4 already halves FC1's chain twice).
MAX_K_SPLIT = 4
#: Warps of a CTA at m_tiles ≥ 2 (all groups together): the register budget of 255 per thread
#: that the wide accumulators need holds only for 128-thread CTAs on sm_90.
WIDE_CTA_WARPS = 4


def choose_k_split(k: int, n: int) -> int:
    """Intra-CTA K split of a grouped GEMM with reduction length ``k`` and ``n`` output columns.

    **Weight geometry only** (never M, m_tiles or the routing): the split fixes each output's
    fp32 summation order (slice sums, then group 0 + 1 + 2 + … in index order), so a route's
    result at batch M must equal its batch-1 result bit for bit. The rule: the largest of 4, 2, 1
    with ``k % (128·k_split) == 0`` (whole 8-row units per group, any ``depth`` divides them)
    and ``k / k_split >= MIN_K_SLICE`` (32 K16 rows per warp, so the slice loop stays deep).
    GLM-like shapes: FC1 K = 5120 → 4 (80 rows per warp instead of 320), FC2 K = 1536 → 2.
    ``n`` is deliberately unused: the serial load→decode→mma chain per warp, which bounds small
    M latency, is a K property; N only changes how many CTAs run it side by side.
    """
    del n
    for k_split in (MAX_K_SPLIT, 2):
        if k % (128 * k_split) == 0 and k // k_split >= MIN_K_SLICE:
            return k_split
    return 1


def gemm_geometry(
    m_tiles: int, n: int, k_split: int = 1, *, family: str | None = None
) -> tuple[int, int, int]:
    """(n_tiles, warps, depth) of the grouped GEMM; ``warps`` per K group (CTA: warps·k_split).

    Single M16 blocks (≤ 64 live registers on sm_90): 4 warps × 2 tiles per group, deep load
    batches, ``128·k_split`` threads (≤ 512). Wider blocks need up to ~250 registers, which
    ptxas grants only to 128-thread CTAs, so the groups share :data:`WIDE_CTA_WARPS` warps
    (``warps = 4 / k_split``, narrower CTAs, more of them) and 4 tiles when N allows.
    ``k_split`` (:func:`choose_k_split`) does not change any route's summation order here:
    n_tiles, warps and depth only pick which warp computes a tile and how many rows are in
    flight, each lane still adds its slice's K16 rows in ascending order. ``family`` (the
    decoder family of :mod:`b12x.formats`): the D3L decoder (``"sqg_d3l"``) keeps more values
    live, so its 4-block CTAs take 2 tiles (4 × 4 spills 440 B on sm_90, split or not).
    """
    if m_tiles == 1:
        return 2, 4, 8
    warps = max(1, WIDE_CTA_WARPS // k_split)
    wide = n % (64 * warps) == 0 and not (m_tiles == 4 and family == "sqg_d3l")
    return (4 if wide else 2), warps, 2


def _gemm_specs(codebook, tiers, compute_bf16, m_tiles, fc1_n, fc2_n, pairs=(None, None), *,
                fc1_k, fc2_k):  # fmt: skip
    def spec(bits, n, k):
        k_split = choose_k_split(k, n)
        family = resolve_format(codebook, bits).family
        n_tiles, warps, depth = gemm_geometry(m_tiles, n, k_split, family=family)
        return MoeGemmSpec(
            codebook, bits, compute_bf16, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps,
            depth=depth, k_split=k_split,
        )  # fmt: skip

    def phase_specs(phase, choice, n, k):
        if choice is None:
            return tuple(spec(t.bits, n, k) for t in tiers)
        return (
            pair_gemm_spec(
                codebook=codebook, bf16=compute_bf16, m_tiles=m_tiles, choice=choice,
                phase=phase, n=n,
            ),
        )  # fmt: skip

    return (
        phase_specs("fc1", pairs[0], fc1_n, fc1_k),
        phase_specs("fc2", pairs[1], fc2_n, fc2_k),
    )


def _check_pairs(fc1_pair, fc2_pair, *, codebook, tiers, intermediate) -> tuple:
    """Validate the per-phase pair choices (before anything is launched)."""
    choices = (check_pair_choice("fc1_pair", fc1_pair), check_pair_choice("fc2_pair", fc2_pair))
    if choices == (None, None):
        return choices
    if len(tiers) != 1:
        raise ValueError("fc1_pair/fc2_pair: QSRT pairs run on a uniform stack, not on tiers")
    if tiers[0].bits != PAIR_BASE_BITS:
        raise ValueError(
            f"bits: pair layouts compile on the trellis_bits = {PAIR_BASE_BITS} base (spec "
            f"§4.2), got {tiers[0].bits}"
        )
    if intermediate % PAIR_CHANNELS:
        raise ValueError(
            f"intermediate: I={intermediate} is not a whole number of {PAIR_CHANNELS}-channel "
            f"pairs (QSRT pairs need I % {PAIR_CHANNELS} == 0)"
        )
    for name, choice in zip(("fc1_pair", "fc2_pair"), choices, strict=True):
        if choice is not None:
            check_pair_codebook(name, codebook, choice)
    return choices


def moe_buffer_specs(problem: MoeProblem, routes: routing.RoutePlan) -> tuple[BufferSpec, ...]:
    """Every buffer ``run`` uses, exact shapes for the planned M (``n = M·top_k`` routes)."""
    m, h, i = problem.m, problem.hidden, problem.intermediate
    n, e = routes.routes, problem.num_experts
    f16, f32, i64, cd = torch.float16, torch.float32, torch.int64, problem.compute_dtype
    specs = [BufferSpec("output", (m, h), problem.x_dtype, role="output")]
    specs += routing.route_buffer_specs(routes)
    if problem.x_dtype != f16:
        specs.append(BufferSpec("input_f16", (m, h), f16))  # fp16(x) (bf16 inputs)
    if len(problem.tiers) > 1:
        specs += [
            BufferSpec("global_ids", (n,), i64),  # router ids widened, inactive -> 0
            BufferSpec("global_inactive", (n,), torch.bool),
            BufferSpec("global_lt", (n,), torch.bool),
            BufferSpec("combined_ids32", (n,), torch.int32),
            BufferSpec("combined_ids", (n,), i64),
        ]
    else:
        specs.append(BufferSpec("expert_descriptors", (e,), torch.int32))  # identity (tier 0)
    specs += [
        BufferSpec("route_token", (n,), i64),  # token of each route (r // top_k)
        BufferSpec("route_expert_safe", (n,), i64),  # combined expert, clamped to [0, E)
        BufferSpec("route_x", (n, h), f16),  # fp16(x) gathered per route
        BufferSpec("route_prod", (n, h), f16),  # fp16(x · suh)
        BufferSpec("route_scale", (n, max(h, 3 * i)), f16),  # per-route rotation rows
        BufferSpec("route_scale_f32", (n, max(h, 3 * i)), f32),
        BufferSpec("h128_a", (n, max(h, i)), f32),  # butterfly ping-pong
        BufferSpec("h128_b", (n, max(h, i)), f32),
        BufferSpec("rotation_f16", (n, h), f16),
        BufferSpec("rotation_gate", (n, h), cd),
    ]
    if problem.w13_layout == "proj":
        specs.append(BufferSpec("rotation_up", (n, h), cd))
    specs += [
        BufferSpec("fc1", (n, 2 * i), cd),  # GEMM output, route order (inactive rows unwritten)
        BufferSpec("gate_f32", (n, i), f32),
        BufferSpec("activated", (n, i), cd),
        BufferSpec("fc2", (n, h), cd),
        BufferSpec("route_terms", (n, h), f32),  # H128(y)·down_svh, inactive rows zeroed
        BufferSpec("route_weights", (n,), f32),
        BufferSpec("term", (m, h), f32),
        BufferSpec("accum", (m, h), f32),
    ]
    return tuple(specs)


def _per_tier(name: str, value: Any) -> tuple:
    """An int (one uniform tier) or a tuple/list with one value per tier."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, tuple | list):
        return tuple(value)
    raise TypeError(
        f"{name}: expected an int (uniform) or one int per tier, got {type(value).__name__}"
    )


def check_moe_problem(
    *,
    m: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    codebook: str,
    bits: int | tuple[int, ...],
    num_experts: int | tuple[int, ...],
    w13_layout: str,
    x_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    num_global_experts: int | None,
    m_tiles: int | None,
    fc1_pair: str | None,
    fc2_pair: str | None,
) -> MoeProblem:
    """THE metadata-only validator of an MoE problem (every :func:`plan_moe` keyword but the
    device); returns the :class:`MoeProblem`. :func:`plan_moe` calls it first; the custom op's
    real and fake implementations call it through
    :func:`b12x.moe.ops.check_moe_op_args`, so tracing rejects what planning rejects."""
    for name, value in (
        ("m", m),
        ("top_k", top_k),
        ("hidden", hidden),
        ("intermediate", intermediate),
    ):
        check_positive_int(name, value)
    if hidden % 128 or intermediate % 128:
        raise ValueError(
            f"hidden/intermediate: H={hidden} and I={intermediate} must be multiples of 128"
        )
    if not isinstance(codebook, str):
        raise TypeError(f"codebook: expected str, got {type(codebook).__name__}")
    check_choice("w13_layout", w13_layout, W13_LAYOUTS)
    check_dtype_choice("x_dtype", x_dtype, HALF_DTYPES)
    check_dtype_choice("compute_dtype", compute_dtype, HALF_DTYPES)
    bits_t = _per_tier("bits", bits)
    experts_t = _per_tier("num_experts", num_experts)
    if len(bits_t) != len(experts_t) or len(bits_t) not in (1, 2):
        raise ValueError(
            f"bits/num_experts: expected one value each (uniform) or two each (tiers), got "
            f"{bits!r} and {num_experts!r}"
        )
    tiers = []
    for t, (b, e) in enumerate(zip(bits_t, experts_t, strict=True)):
        if isinstance(b, bool) or not isinstance(b, int):
            raise TypeError(f"bits: expected int, got {type(b).__name__}")
        resolve_format(codebook, b)
        check_positive_int("num_experts", e)
        if len(bits_t) == 2 and e > MAX_TIER_EXPERTS:
            raise ValueError(f"num_experts: tier {t} holds {e} experts (at most 256 per tier)")
        tiers.append(TierSpec(b, e))
    if len(tiers) == 2:
        if codebook != "mcg":
            raise ValueError(f"codebook: mixed K3/K4 tiers are EXL3 MCG tiers, got {codebook!r}")
        if num_global_experts is None:
            raise ValueError("num_global_experts: tiers route by global id; give the id space")
        check_positive_int("num_global_experts", num_global_experts)
    elif num_global_experts is not None:
        raise ValueError("num_global_experts: only a tiered plan takes a global id space")
    pairs = _check_pairs(
        fc1_pair, fc2_pair, codebook=codebook, tiers=tiers, intermediate=intermediate
    )
    problem = MoeProblem(
        m, top_k, hidden, intermediate, codebook, tuple(tiers), w13_layout, x_dtype,
        compute_dtype, num_global_experts, *pairs,
    )  # fmt: skip
    if top_k > problem.num_experts and len(tiers) == 1:
        raise ValueError(f"top_k: {top_k} exceeds the number of experts {problem.num_experts}")
    if m_tiles is not None and (
        isinstance(m_tiles, bool) or not isinstance(m_tiles, int) or m_tiles not in (1, 2, 4)
    ):
        raise ValueError(f"m_tiles: expected None, 1, 2 or 4, got {m_tiles!r}")
    return problem


def plan_moe(
    *,
    m: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    codebook: str,
    bits: int | tuple[int, ...],
    num_experts: int | tuple[int, ...],
    w13_layout: str,
    x_dtype: torch.dtype,
    compute_dtype: torch.dtype = torch.float16,
    num_global_experts: int | None = None,
    m_tiles: int | None = None,
    fc1_pair: str | None = None,
    fc2_pair: str | None = None,
    device: Any = None,
) -> MoePlan:
    """Plan one MoE call of ``m`` tokens (the capacity). ``bits``/``num_experts`` are ints for a
    uniform stack, or one per tier (two tiers: ``num_global_experts`` names the router's id
    space). ``fc1_pair``/``fc2_pair`` choose QSRT pairs per phase (:mod:`b12x.moe.pairs`: None,
    a kind, or ``"dynamic"``; ``bits`` is then the base 3). ``device`` (a CUDA device or a
    simulated one, optional) lets an unpaired FC2 take the wave-balanced tile
    (:func:`wave_balanced_fc2`). Every argument is validated here, before anything is launched."""
    problem = check_moe_problem(
        m=m, top_k=top_k, hidden=hidden, intermediate=intermediate, codebook=codebook,
        bits=bits, num_experts=num_experts, w13_layout=w13_layout, x_dtype=x_dtype,
        compute_dtype=compute_dtype, num_global_experts=num_global_experts, m_tiles=m_tiles,
        fc1_pair=fc1_pair, fc2_pair=fc2_pair,
    )  # fmt: skip
    pairs = (problem.fc1_pair, problem.fc2_pair)
    if device is not None:  # validated up front, whether or not a phase reads it
        from b12x.dense.plan import device_limits

        device_limits(device)
    if m_tiles is None:
        m_tiles = choose_m_tiles(m, top_k, problem.num_experts)
    routes = routing.plan_routes(
        m=m, top_k=top_k, num_experts=problem.num_experts, block_size=16 * m_tiles
    )
    if routes.num_blocks > MAX_GRID_Y:
        raise ValueError(
            f"m: {m} tokens give {routes.num_blocks} route blocks of {routes.block_size}, more "
            f"than the {MAX_GRID_Y} a launch grid can hold; use a larger m_tiles or split the batch"
        )
    fc1_n = 2 * intermediate if w13_layout == "packed" else intermediate
    fc1, fc2 = _gemm_specs(
        codebook, problem.tiers, compute_dtype == torch.bfloat16, m_tiles, fc1_n, hidden, pairs,
        fc1_k=hidden, fc2_k=intermediate,
    )  # fmt: skip
    if device is not None:
        fc2 = tuple(
            _wave_balanced(spec) if spec.pair is None and wave_balanced_fc2(
                problem, routes, spec, device) else spec
            for spec in fc2
        )  # fmt: skip
    return MoePlan(problem, routes, fc1, fc2, moe_buffer_specs(problem, routes))


def wave_balanced_fc2(problem: MoeProblem, routes, spec: MoeGemmSpec, device: Any) -> bool:
    """Does FC2 take :data:`b12x.dense.tiles.WAVE_BALANCED_FC2` (512 columns per CTA, 256
    threads)? Only when THE tile predicate (:func:`b12x.dense.tiles.qualify`, phase ``"fc2"``;
    it rejects the tile for any other phase) accepts it for this FC2 (K = I, N = H) on
    ``device``, and the planned FC2 launch can have more live CTAs than the device has SMs
    (at most ``min(blocks, M·top_k)`` live route blocks: a second wave that 4× wider CTAs
    shorten). Opt-in (``plan_moe(device=...)``); not yet measured against the default."""
    from b12x.dense.plan import device_limits

    limits = device_limits(device)
    tile_problem = dense_tiles.TileProblem(
        "fc2", routes.capacity, problem.intermediate, problem.hidden, spec.bits,
        cta_m_blocks=spec.m_tiles,
    )  # fmt: skip
    ok, _ = dense_tiles.qualify(dense_tiles.WAVE_BALANCED_FC2, tile_problem, limits)
    live_blocks = min(routes.num_blocks, problem.m * problem.top_k)
    ctas = live_blocks * (problem.hidden // spec.n_group)
    return ok and ctas > limits.sm_count


def _wave_balanced(spec: MoeGemmSpec) -> MoeGemmSpec:
    warps, n_tiles = dense_tiles.kernel_geometry(dense_tiles.WAVE_BALANCED_FC2)
    if spec.k_split > 1 and spec.m_tiles > 1:
        return spec  # 256·k_split threads cannot keep wide accumulators (see gemm_geometry)
    return dataclasses.replace(spec, n_tiles=n_tiles, warps=warps, depth=2)


def allocate_moe_buffers(plan: MoePlan, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Plan-time allocation of exactly the plan's buffers (never during capture)."""
    if not isinstance(plan, MoePlan):
        raise TypeError(f"plan: expected MoePlan, got {type(plan).__name__}")
    return allocate_buffers(plan.buffers, device)


def _all_buffer_names() -> tuple[str, ...]:
    """Every name any plan can use (tiered and uniform, bf16 input, proj layout)."""
    cases = (
        ((TierSpec(3, 1), TierSpec(4, 1)), 2),
        ((TierSpec(3, 1),), None),
    )
    names: dict[str, None] = {}
    for tiers, num_global in cases:
        problem = MoeProblem(
            1, 1, 128, 128, "mcg", tiers, "proj", torch.bfloat16, torch.float16, num_global
        )
        routes = routing.RoutePlan(1, 1, problem.num_experts, 16)
        names.update(dict.fromkeys(s.name for s in moe_buffer_specs(problem, routes)))
    return tuple(names)


ALL_BUFFER_NAMES = _all_buffer_names()


@dataclasses.dataclass(frozen=True)
class BoundMoe:
    """A plan and the caller's buffers, kept by identity."""

    plan: MoePlan
    buffers: Mapping[str, torch.Tensor]
    device: torch.device


def bind_moe(plan: MoePlan, **buffers: torch.Tensor | None) -> BoundMoe:
    """Check every planned buffer (exact shape/dtype/device/contiguity/alignment), keep by id."""
    if not isinstance(plan, MoePlan):
        raise TypeError(f"plan: expected MoePlan, got {type(plan).__name__}")
    check_known_names(ALL_BUFFER_NAMES, buffers)
    output = buffers.get("output")
    device = output.device if isinstance(output, torch.Tensor) else None
    kept = {}
    for spec in plan.buffers:
        kept[spec.name] = require_buffer(spec, buffers.get(spec.name), device=device)
    return BoundMoe(plan, types.MappingProxyType(kept), kept["output"].device)


def describe(plan: MoePlan) -> dict[str, Any]:
    """A plain summary of the plan (tests and reports)."""
    p = plan.problem
    return {
        "tiers": [(t.bits, t.num_experts) for t in p.tiers],
        "pairs": {"fc1": p.fc1_pair, "fc2": p.fc2_pair},
        "block_size": plan.routes.block_size,
        "capacity": plan.routes.capacity,
        "kernels": [dataclasses.asdict(s) for s in plan.kernel_specs],
        "buffer_bytes": sum(b.nbytes for b in plan.buffers),
    }
