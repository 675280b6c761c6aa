"""plan / bind / run of the fused trellis MoE: uniform rate, two K3/K4 tiers, or QSRT pairs per
phase on the uniform (K3-base) stack (spec §3.4, §4.1, §4.2).

The launch sequence of :func:`run_moe` (every step writes a caller buffer; no allocation, no host
synchronisation, so one call is CUDA-graph capturable; R4):

1. **Route packing** (:mod:`b12x.ops.moe.routing`) into blocks of ``16·m_tiles`` slots (tiers:
   global ids through ``global_to_combined`` first, range-checked before any narrowing).
2. **Input rotation per route**: ``A = fp16(H128(fp16(fp16(x_t) · suh[e])))`` in the compute dtype.
3. **FC1**: the grouped trellis GEMM (:mod:`b12x.kernels.moe_gemm`) gathers each slot's A row and
   scatters its result to the route's row of ``fc1`` (gate ``[0, I)``, up ``[I, 2I)``), one launch
   per projection and tier; inactive routes' rows are never written.
4. **Boundary** (§3.4 step 3, fp32): ``a = silu(H128(gate)·gate_svh)·H128(up)·up_svh·down_suh``,
   ``A2 = elem(H128(a))``.
5. **FC2**: the grouped GEMM into ``fc2``.
6. **Top-k sum** (fp32, top-k order, from zero): inactive routes add exactly +0 (rows zeroed,
   weights zero, ids never used as indices); stored in ``x.dtype``.

Every route's output depends only on its own row (no split-K across CTAs; the intra-CTA K split
is chosen from the weight geometry alone, :func:`choose_k_split`, and reduces in a fixed order),
so the op is **batch invariant**: a token's output at batch M equals its batch-1 output bit for
bit. Buffers: :func:`moe_buffer_specs`. Plans are frozen; ``run`` never re-decides (R15). A
paired phase plans one ``MoeGemmSpec`` with ``pair`` and ``rate_axis`` set
(:func:`b12x.ops.moe.pairs.pair_gemm_spec`). The full notes: docs/notes/b12x.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from b12x.formats import DecodeFormat, resolve_format
from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.kernels.shared_layout import WGMMA_CAPABILITY, fitting_slots
from b12x.ops.moe import routing
from b12x.ops.moe.dispatch import (
    FC2_TILE,
    GEMM_GEOMETRY,
    K_SPLIT,
    MAX_K_SPLIT,
    MIN_K_SLICE,
    PAIR_GEOMETRY,
    ROUTE_BLOCK,
    WIDE_CTA_WARPS,
    DecisionTable,
)
from b12x.ops.moe.mainloop import MAINLOOP, SharedGeometry
from b12x.ops.moe.pairs import (
    PAIR_BASE_BITS,
    PAIR_CHANNELS,
    check_pair_choice,
    check_pair_codebook,
    pair_rate_sum,
    pair_spec,
)
from b12x.runtime.scratch import BoundBuffers, BufferSpec, OpBuffers, PlannedBuffers
from b12x.runtime.validate import (
    HALF_DTYPES,
    check_dtype_choice,
    check_extent,
    check_positive_int,
)

__all__ = [
    "BIND_DEVICE_TYPES",
    "BUFFERS",
    "BoundMoe",
    "Decision",
    "MAX_K_SPLIT",
    "MIN_K_SLICE",
    "MoePlan",
    "MoeProblem",
    "W13_LAYOUTS",
    "WIDE_CTA_WARPS",
    "allocate_moe_buffers",
    "bind_moe",
    "check_moe_problem",
    "moe_buffer_specs",
    "plan_moe",
]

W13_LAYOUTS = ("packed", "proj")
#: Devices a plan's buffers may live on: CUDA (the kernels), and CPU only for the CPU tier's
#: emulated grouped GEMM (``run`` refuses it otherwise:
# :data:`b12x.ops.moe.run.LAUNCH_DEVICE_TYPES`).
#: Meta tensors are refused at bind: nothing can run on them.
BIND_DEVICE_TYPES = ("cuda", "cpu")
MAX_TIER_EXPERTS = 256
MAX_GRID_Y = 65535  # route blocks are the grid's y dimension


def device_limits(device: Any):
    """:func:`b12x.ops.dense.plan.device_limits` (imported late: the dense planner imports torch
    CUDA helpers); a CUDA device or a simulated one (``name, sm_count, max_shared_mem,
    capability``)."""
    from b12x.ops.dense.plan import device_limits as limits_of

    return limits_of(device)


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
    #: The codebook's format, resolved once from the validated name (specs are planned from it).
    fmt: DecodeFormat = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "fmt", resolve_format(self.codebook))

    @property
    def paired(self) -> bool:
        return self.fc1_pair is not None or self.fc2_pair is not None

    @property
    def num_experts(self) -> int:
        """Experts of the combined namespace (the route packer's E)."""
        return sum(t.num_experts for t in self.tiers)


@dataclasses.dataclass(frozen=True)
class Decision:
    """One consultation of a :mod:`b12x.ops.moe.dispatch` table by a planner: the launch it decided
    (``role``, e.g. ``"route_block"``, ``"fc1[0].k_split"``, ``"fc2[0].fc2_tile"``), the table's
    name, the normalised case as ``(field, value)`` pairs, the chosen path and its value."""

    role: str
    table: str
    case: tuple[tuple[str, Any], ...]
    path: str
    value: Any


def decide(
    decisions: list[Decision], role: str, table: DecisionTable, case: Mapping[str, Any]
) -> Any:
    """``table``'s answer for ``case``, recorded in ``decisions`` (the planners' only way to
    take a host decision: nothing is re-decided outside a table)."""
    explanation = table.explain(case)
    norm = tuple(table.normalize_case(case).items())
    decisions.append(Decision(role, table.name, norm, explanation.path, explanation.value))
    return explanation.value


@dataclasses.dataclass(frozen=True)
class MoePlan(PlannedBuffers):
    problem: MoeProblem
    routes: routing.RoutePlan
    fc1_spec: tuple[MoeGemmSpec, ...]
    fc2_spec: tuple[MoeGemmSpec, ...]
    buffers: tuple[BufferSpec, ...]
    #: every table consultation that produced the fields above (:class:`Decision`)
    decisions: tuple[Decision, ...]

    @property
    def kernel_specs(self) -> tuple[MoeGemmSpec, ...]:
        """The grouped-GEMM specialisations ``run`` launches (the warm-up set)."""
        return tuple(dict.fromkeys(self.fc1_spec + self.fc2_spec))


def choose_m_tiles(m: int, top_k: int, num_experts: int) -> int:
    """M16 blocks per route block: the :data:`~b12x.ops.moe.dispatch.ROUTE_BLOCK` table's answer (1
    while an expert sees ≤ 24 routes on average, 2 up to 48, else 4)."""
    return ROUTE_BLOCK.decide({"m": m, "top_k": top_k, "num_experts": num_experts})


def choose_k_split(k: int, n: int) -> int:
    """Intra-CTA K split of a grouped GEMM with reduction length ``k``: the
    :data:`~b12x.ops.moe.dispatch.K_SPLIT` table's answer.

    **Weight geometry only** (never M, m_tiles or the routing): the split fixes each output's
    fp32 summation order (slice sums, then group 0 + 1 + 2 + … in index order), so a route's
    result at batch M must equal its batch-1 result bit for bit. The rule: the largest of 8, 4,
    2, 1 with ``k % (128·k_split) == 0`` (whole 8-row units per group, any ``depth`` divides
    them) and ``k / k_split >= MIN_K_SLICE`` (32 K16 rows per warp, so the slice loop stays
    deep; ``MIN_K_SLICE_FOUR_GROUPS`` = 384 with four groups). GLM-like shapes: FC1 K = 5120 → 8
    (40 rows per warp instead of 320), FC2 K = 1536 → 4.
    ``n`` is deliberately unused: the serial load→decode→mma chain per warp, which bounds small
    M latency, is a K property; N only changes how many CTAs run it side by side.
    """
    del n
    return K_SPLIT.decide({"k": k})


def gemm_geometry(
    m_tiles: int, n: int, k_split: int = 1, *, wide_tile_cap: int = 4
) -> tuple[int, int, int]:
    """(n_tiles, warps, depth) of the grouped GEMM; ``warps`` per K group (CTA: warps·k_split):
    the :data:`~b12x.ops.moe.dispatch.GEMM_GEOMETRY` table's answer.

    Single M16 blocks (≤ 64 live registers on sm_90): 4 warps × 2 tiles per group, deep load
    batches, ``128·k_split`` threads (≤ 512). Wider blocks need up to ~250 registers, which
    ptxas grants only to 128-thread CTAs, so the groups share :data:`WIDE_CTA_WARPS` warps
    (``warps = 4 / k_split``, narrower CTAs, more of them) and 4 tiles when N allows.
    ``k_split`` does not change any route's summation order here: n_tiles, warps and depth only
    pick which warp computes a tile and how many rows are in flight, each lane still adds its
    slice's K16 rows in ascending order. ``wide_tile_cap`` (the format's tile hint,
    :attr:`b12x.formats.DecodeFormat.wide_tile_cap`): the D3L decoder keeps more values live, so
    its 4-block CTAs take 2 tiles (4 × 4 spills 440 B on sm_90, split or not).
    """
    case = {"m_tiles": m_tiles, "n": n, "k_split": k_split, "wide_tile_cap": wide_tile_cap}
    return GEMM_GEOMETRY.decide(case)


def plan_gemm_spec(
    *,
    decisions: list[Decision],
    role: str,
    fmt: DecodeFormat,
    bits: int,
    compute_dtype: torch.dtype,
    m_tiles: int,
    phase: str,
    choice: str | None,
    k: int,
    n: int,
    shared: SharedGeometry | None = None,
) -> MoeGemmSpec:
    """The compile-time spec of one grouped-GEMM launch (``k``: reduction, ``n``: output
    columns), every geometry taken from the tables: unpaired → :data:`K_SPLIT` then
    :data:`GEMM_GEOMETRY` (by m_tiles, N, k_split and the format's tile hint); paired (``choice``
    a kind or ``"dynamic"``) → :data:`PAIR_GEOMETRY` by phase. The compute dtype only becomes
    ``MoeGemmSpec.bf16``. ``shared`` (the :data:`MAINLOOP` table's answer): the shared-decode
    geometry, its slots fitted to ``bits``, with the same :data:`K_SPLIT` (its fold order)."""
    bf16 = compute_dtype == torch.bfloat16
    if choice is not None:
        case = {"phase": phase, "m_tiles": m_tiles, "n": n, "compute_dtype": compute_dtype}
        geometry = decide(decisions, f"{role}.pair_geometry", PAIR_GEOMETRY, case)
        return pair_spec(
            codebook=fmt.name,
            bf16=bf16,
            m_tiles=m_tiles,
            choice=choice,
            geometry=geometry,
            shared=shared,
        )
    k_split = decide(decisions, f"{role}.k_split", K_SPLIT, {"k": k})
    if shared is not None:
        rows, stages = shared.slots or fitting_slots(
            bits=bits, m_tiles=shared.m_tiles, n_tiles=shared.n_tiles, warps=shared.warps,
            m_warps=shared.m_warps,
        )  # fmt: skip
        return MoeGemmSpec(
            fmt.name, bits, bf16, m_tiles=shared.m_tiles, n_tiles=shared.n_tiles,
            warps=shared.warps, k_split=k_split, m_warps=shared.m_warps, shared_rows=rows,
            smem_stages=stages, wgmma=shared.wgmma,
        )  # fmt: skip
    case = {
        "m_tiles": m_tiles,
        "n": n,
        "k_split": k_split,
        "wide_tile_cap": fmt.wide_tile_cap,
        "compute_dtype": compute_dtype,
    }
    g = decide(decisions, f"{role}.geometry", GEMM_GEOMETRY, case)
    # MoeGemmSpec (b12x.kernels.moe_gemm) still keys on the codebook's registry name.
    return MoeGemmSpec(
        fmt.name, bits, bf16, m_tiles=m_tiles, n_tiles=g.n_tiles, warps=g.warps, depth=g.depth,
        k_split=k_split,
    )  # fmt: skip


def fc2_tile_case(
    spec: MoeGemmSpec, *, limits: Any, m: int, top_k: int, num_experts: int, hidden: int,
    intermediate: int,
) -> dict[str, Any]:  # fmt: skip
    """The :data:`~b12x.ops.moe.fc2_tile.FC2_TILE` case of an FC2 launch planned as ``spec`` (its
    default geometry) on a device (``limits``: :class:`b12x.ops.dense.tiles.DeviceLimits` or
    None)."""
    return {
        "sm_count": None if limits is None else limits.sm_count,
        "max_shared_mem": None if limits is None else limits.max_shared_mem,
        "m": m,
        "top_k": top_k,
        "num_experts": num_experts,
        "hidden": hidden,
        "intermediate": intermediate,
        "bits": spec.bits,
        "m_tiles": spec.m_tiles,
        "k_split": spec.k_split,
        "default_n_group": spec.n_group,
        "pair": spec.pair,
        "wide_tile_cap": resolve_format(spec.codebook, spec.bits).wide_tile_cap,
    }


def plan_fc2_tile(
    spec: MoeGemmSpec, *, decisions: list[Decision], role: str, limits: Any, m: int, top_k: int,
    num_experts: int, hidden: int, intermediate: int,
) -> MoeGemmSpec:  # fmt: skip
    """``spec`` with the wave-balanced FC2 geometry when the :data:`FC2_TILE` table says so."""
    case = fc2_tile_case(
        spec, limits=limits, m=m, top_k=top_k, num_experts=num_experts, hidden=hidden,
        intermediate=intermediate,
    )  # fmt: skip
    tile = decide(decisions, f"{role}.fc2_tile", FC2_TILE, case)
    if tile is None:
        return spec
    return dataclasses.replace(spec, n_tiles=tile.n_tiles, warps=tile.warps, depth=tile.depth)


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
    :func:`b12x.ops.moe.custom_op.check_moe_op_args`, so tracing rejects what planning rejects."""
    for name, value in (
        ("m", m),
        ("top_k", top_k),
        ("hidden", hidden),
        ("intermediate", intermediate),
    ):
        check_positive_int(name, value)
        check_extent(name, value)
    check_extent("m", m * top_k, what=f" tokens x top_k {top_k} routes")
    if hidden % 128 or intermediate % 128:
        raise ValueError(
            f"hidden/intermediate: H={hidden} and I={intermediate} must be multiples of 128"
        )
    if not isinstance(codebook, str):
        raise TypeError(f"codebook: expected str, got {type(codebook).__name__}")
    check_layout(w13_layout)
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
    fmt = resolve_format(codebook)
    for t, (b, e) in enumerate(zip(bits_t, experts_t, strict=True)):
        if isinstance(b, bool) or not isinstance(b, int):
            raise TypeError(f"bits: expected int, got {type(b).__name__}")
        fmt.check_bits(b)
        check_positive_int("num_experts", e)
        if len(bits_t) == 2 and e > MAX_TIER_EXPERTS:
            raise ValueError(f"num_experts: tier {t} holds {e} experts (at most 256 per tier)")
        tiers.append(TierSpec(b, e))
    if len(tiers) == 2:
        if not fmt.tiered:
            raise ValueError(
                f"codebook: mixed K3/K4 tiers are EXL3 MCG tiers, expected 'mcg', got {codebook!r}"
            )
        if num_global_experts is None:
            raise ValueError("num_global_experts: tiers route by global id; give the id space")
        check_positive_int("num_global_experts", num_global_experts)
        total = sum(tier.num_experts for tier in tiers)
        if num_global_experts < total:
            raise ValueError(
                f"num_global_experts: {num_global_experts} global ids cannot address the "
                f"{total} experts of the two tiers ({tiers[0].num_experts} + "
                f"{tiers[1].num_experts}); expected at least {total}"
            )
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
    if m_tiles is not None:
        if isinstance(m_tiles, bool) or not isinstance(m_tiles, int):
            raise TypeError(f"m_tiles: expected int, got {type(m_tiles).__name__}")
        if m_tiles not in (1, 2, 4):
            raise ValueError(f"m_tiles: expected None or one of (1, 2, 4), got {m_tiles!r}")
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
    shared_decode: str | None = None,
) -> MoePlan:
    """Plan one MoE call of ``m`` tokens (the capacity). ``bits``/``num_experts`` are ints for a
    uniform stack, or one per tier (two tiers: ``num_global_experts`` names the router's id
    space). ``fc1_pair``/``fc2_pair`` choose QSRT pairs per phase (:mod:`b12x.ops.moe.pairs`: None,
    a kind, or ``"dynamic"``; ``bits`` is then the base 3). ``device`` (a CUDA device or a
    simulated one, optional) lets an unpaired FC2 take the wave-balanced tile
    (:func:`wave_balanced_fc2`). ``shared_decode`` pins the :data:`MAINLOOP` table (``"off"``:
    the per-warp mainloop, ``"wide"``: the shared decode; None: by routes per expert). Every
    argument is validated here, before anything is launched.

    Every launch geometry comes from the tables of :mod:`b12x.ops.moe.dispatch` (route block, K
    split, unpaired or pair geometry, FC2 tile); :attr:`MoePlan.decisions` records each case,
    path and value, and the plan's fields are exactly those values."""
    problem = check_moe_problem(
        m=m, top_k=top_k, hidden=hidden, intermediate=intermediate, codebook=codebook,
        bits=bits, num_experts=num_experts, w13_layout=w13_layout, x_dtype=x_dtype,
        compute_dtype=compute_dtype, num_global_experts=num_global_experts, m_tiles=m_tiles,
        fc1_pair=fc1_pair, fc2_pair=fc2_pair,
    )  # fmt: skip
    pairs = (problem.fc1_pair, problem.fc2_pair)
    limits = None if device is None else device_limits(device)
    decisions: list[Decision] = []
    route_case = {"m": m, "top_k": top_k, "num_experts": problem.num_experts, "m_tiles": m_tiles}
    fc1_n = 2 * intermediate if w13_layout == "packed" else intermediate
    mainloop_case = {
        **route_case, "shared_decode": shared_decode, "paired": pairs != (None, None),
        "fc1_pair_odd": pairs[0] is not None and pair_rate_sum(pairs[0]) % 2 == 1,
        "fc1_n": fc1_n, "fc2_n": hidden,
        "max_shared_mem": None if limits is None else limits.max_shared_mem,
        "capability": None if limits is None else tuple(limits.capability),
    }  # fmt: skip
    shared = decide(decisions, "mainloop", MAINLOOP, mainloop_case)
    if shared is not None and shared.wgmma and mainloop_case["capability"] != WGMMA_CAPABILITY:
        raise ValueError(
            f"shared_decode: {shared_decode!r} multiplies with wgmma, which needs an sm_90 device; "
            f"got {'no device' if limits is None else limits.name}"
        )
    if (
        shared is not None
        and pairs != (None, None)
        and not (shared.wgmma and not mainloop_case["fc1_pair_odd"])
    ):
        raise ValueError(
            f"shared_decode: {shared_decode!r} cannot run QSRT pairs {pairs}: the pair shared "
            f"decode multiplies with wgmma and needs an even FC1 rate sum (not P43); use 'off'"
        )
    if shared is None:
        m_tiles = decide(decisions, "route_block", ROUTE_BLOCK, route_case)
        block_size = 16 * m_tiles
    else:  # the shared geometry fixes the block; the route-block table is not consulted
        m_tiles, block_size = shared.m_tiles, shared.block_size
    routes = routing.plan_routes(
        m=m, top_k=top_k, num_experts=problem.num_experts, block_size=block_size
    )
    check_grid(routes, m)
    launches = {"fc1": (hidden, fc1_n, pairs[0]), "fc2": (intermediate, hidden, pairs[1])}
    specs: dict[str, list[MoeGemmSpec]] = {"fc1": [], "fc2": []}
    for phase, (k, n, choice) in launches.items():
        for t, tier in enumerate(problem.tiers if choice is None else problem.tiers[:1]):
            role = f"{phase}[{t}]"
            spec = plan_gemm_spec(
                decisions=decisions, role=role, fmt=problem.fmt, bits=tier.bits,
                compute_dtype=compute_dtype, m_tiles=m_tiles, phase=phase, choice=choice, k=k,
                n=n, shared=shared,
            )  # fmt: skip
            if phase == "fc2" and shared is None:
                spec = plan_fc2_tile(
                    spec, decisions=decisions, role=role, limits=limits, m=m, top_k=top_k,
                    num_experts=problem.num_experts, hidden=hidden, intermediate=intermediate,
                )  # fmt: skip
            specs[phase].append(spec)
    if shared is not None and limits is not None:
        need = max(s.smem_bytes for s in specs["fc1"] + specs["fc2"])
        if need > limits.max_shared_mem:
            raise ValueError(
                f"shared_decode: the shared decode needs {need} B of shared memory per block, "
                f"{limits.name} grants {limits.max_shared_mem} B; use shared_decode='off'"
            )
    return MoePlan(
        problem, routes, tuple(specs["fc1"]), tuple(specs["fc2"]),
        moe_buffer_specs(problem, routes), tuple(decisions),
    )  # fmt: skip


def _per_tier(name: str, value: object) -> tuple:
    """An int (uniform) or a tuple/list (one per tier); anything else names ``name``."""
    if isinstance(value, int):  # bools pass here and are refused per element by name
        return (value,)
    if isinstance(value, tuple | list):
        return tuple(value)
    raise TypeError(
        f"{name}: expected an int (uniform) or a tuple of ints (one per tier), got "
        f"{type(value).__name__}"
    )


def check_layout(w13_layout: object) -> str:
    """``"packed"`` or ``"proj"`` (:data:`W13_LAYOUTS`); anything else names ``w13_layout``."""
    if not isinstance(w13_layout, str):
        raise TypeError(
            f"w13_layout: expected one of {W13_LAYOUTS}, got {type(w13_layout).__name__}"
        )
    if w13_layout not in W13_LAYOUTS:
        raise ValueError(f"w13_layout: expected one of {W13_LAYOUTS}, got {w13_layout!r}")
    return w13_layout


def check_grid(routes: routing.RoutePlan, m: int) -> None:
    """Route blocks are the launch grid's y dimension: at most :data:`MAX_GRID_Y` of them."""
    if routes.num_blocks > MAX_GRID_Y:
        raise ValueError(
            f"m: {m} tokens give {routes.num_blocks} route blocks of {routes.block_size}, more "
            f"than the {MAX_GRID_Y} a launch grid can hold; use a larger m_tiles or split the batch"
        )


def wave_balanced_fc2(problem: MoeProblem, routes, spec: MoeGemmSpec, device: Any) -> bool:
    """Does an FC2 planned as ``spec`` (its default geometry) take
    :data:`b12x.ops.dense.tiles.WAVE_BALANCED_FC2` (512 columns per CTA, 256 threads) on ``device``
    (a CUDA device or a simulated one)? The :data:`~b12x.ops.moe.fc2_tile.FC2_TILE` table's answer:
    THE tile predicate (:func:`b12x.ops.dense.tiles.qualify`, phase ``"fc2"``) accepts it for this
    FC2 (K = I, N = H), the launch is unpaired and not both split and wide, the step has at
    least :data:`~b12x.ops.moe.fc2_tile.WAVE_FC2_MIN_ROUTES` routes (below, the default geometry
    measured faster on the H200), and the default launch has more live CTAs than the device has
    SMs (at most ``min(blocks, M·top_k)`` live route blocks: a second wave that 4× wider CTAs
    shorten). Opt-in (``plan_moe(device=...)``)."""
    del routes  # the table recomputes the packed capacity from (m, top_k, E, m_tiles)
    case = fc2_tile_case(
        spec, limits=device_limits(device), m=problem.m, top_k=problem.top_k,
        num_experts=problem.num_experts, hidden=problem.hidden, intermediate=problem.intermediate,
    )  # fmt: skip
    return FC2_TILE.explain(case).path == "wave_balanced"


def allocate_moe_buffers(plan: MoePlan, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Plan-time allocation of exactly the plan's buffers (never during capture)."""
    return BUFFERS.allocate(plan, device)


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


class BoundMoe(BoundBuffers):
    """A plan and the caller's buffers, kept by identity."""


def bind_moe(plan: MoePlan, **buffers: torch.Tensor | None) -> BoundMoe:
    """Check every planned buffer (exact shape/dtype/device/contiguity/alignment), keep by id."""
    return BUFFERS.bind(plan, buffers)


def check_bind_device(name: str, tensor: object) -> torch.device | None:
    """The device of the buffer ``name`` (every other buffer must match it), refused unless it
    is one of :data:`BIND_DEVICE_TYPES`; None when the buffer is not a tensor (the buffer check
    then names it)."""
    if not isinstance(tensor, torch.Tensor):
        return None
    if tensor.device.type not in BIND_DEVICE_TYPES:
        raise ValueError(
            f"{name}: expected a buffer on a CUDA device (or cpu for the emulated CPU tier), got "
            f"{tensor.device}; the MoE kernels cannot run on it"
        )
    return tensor.device


#: The op's buffer contract (allocate and bind), declared once; the output's device must be
#: one of :data:`BIND_DEVICE_TYPES`.
BUFFERS = OpBuffers(MoePlan, BoundMoe, ALL_BUFFER_NAMES, anchor_device=check_bind_device)


def describe(plan: MoePlan) -> dict[str, Any]:
    """A plain summary of the plan (tests and reports)."""
    p = plan.problem
    return {
        "tiers": [(t.bits, t.num_experts) for t in p.tiers],
        "pairs": {"fc1": p.fc1_pair, "fc2": p.fc2_pair},
        "block_size": plan.routes.block_size,
        "capacity": plan.routes.capacity,
        "kernels": [dataclasses.asdict(s) for s in plan.kernel_specs],
        "decisions": [(d.role, d.table, d.path) for d in plan.decisions],
        "buffer_bytes": sum(b.nbytes for b in plan.buffers),
    }
