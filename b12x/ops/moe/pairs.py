"""QSRT pairs on the fused MoE (spec §4.2–§4.4): choices, payload shapes, mode tables, launch.

Layout:
* **Choice per phase** (:data:`PAIR_CHOICES`): ``None`` (uniform payload), a static kind
  ``P22 / P33 / P24 / P43 / P44`` (``(b_lo, b_hi)`` = :data:`PAIR_KINDS`), or ``"dynamic"``
  (per expert P33 or P24 from an int32 mode table ``[E]``: 0 = P33, 1 = P24). The rate axis is
  fixed by the phase: FC1 = N axis (records on gate/up output channels), FC2 = K axis (records
  on the intermediate, the reduction axis). Pairs compile on the ``bits = 3`` base.
* **Payloads** (int16, one per phase; ``s = b_lo + b_hi``, 6 for both dynamic kinds, so a
  dynamic stack has one fixed length per expert; ``P = I/256`` pairs per projection):

  - FC1 ``proj``: ``[2, E, (H/16)·P·128·s]``, ``packed``: ``[E, (H/16)·2P·128·s]`` (the 2I
    columns are 2P pairs, gate's P then up's P). Per expert, the **prepared** N-axis order of
    :func:`reference.pairs.interleave_n_axis`: K16-row-major ``[kt][pair][record 0 ‖ record 1]``
    (done once at load time).
  - FC2: ``[E, P·(H/16)·128·s]``: per expert pair-major ``[pair p: record 0 plane (8 K16 rows ×
    H/16 tiles × 16·b_lo) ‖ record 1 plane (8 × H/16 × 16·b_hi)]`` (reference order = prepared).

  :func:`pair_payload_shape` gives the exact shape. **Mode tables** are caller tensors (int32
  ``[E]``), one per dynamic phase; static and uniform phases take none.
* **Geometry** of a paired launch is the answer of the table
  :data:`b12x.ops.moe.dispatch.PAIR_GEOMETRY` by phase (:func:`pair_geometry`); the phase fixes the
  rate axis there too. :func:`pair_spec` turns it into the compile-time spec.
* :func:`launch_paired_gemm` is the shared body of one paired grouped-GEMM launch (keyword-only;
  arguments through :class:`b12x.launch.records.PairGemmLaunch`).

Invariants:
* Pairs run on a uniform (single-tier) stack: tier 0 with the identity descriptors.
* Nothing here allocates on the launch path; payload views are views.
"""

from __future__ import annotations

import torch

from b12x.abi import shared_body
from b12x.formats import resolve_format
from b12x.kernels.moe_gemm import (
    DYNAMIC,
    DYNAMIC_KINDS,
    PAIR_BASE_BITS,
    PAIR_KINDS,
    MoeGemmSpec,
)
from b12x.launch import host as launchers
from b12x.launch.kinds import compiled
from b12x.launch.records import PairGemmLaunch
from b12x.ops.moe.dispatch import PAIR_GEOMETRY, PairGeometry
from b12x.ops.moe.mainloop import SharedGeometry
from b12x.runtime.compile_cache import capture_active
from b12x.runtime.validate import check_tensor

__all__ = [
    "DYNAMIC",
    "PAIR_BASE_BITS",
    "DYNAMIC_KINDS",
    "PAIR_CHANNELS",
    "PAIR_CHOICES",
    "PAIR_KINDS",
    "check_pair_choice",
    "check_pair_codebook",
    "check_pair_modes",
    "launch_paired_gemm",
    "pair_gemm_spec",
    "pair_geometry",
    "pair_payload_shape",
    "pair_spec",
    "pair_rate_sum",
]

PAIR_CHOICES = (*PAIR_KINDS, DYNAMIC)
PAIR_CHANNELS = 256


def check_pair_choice(name: str, value: object) -> str | None:
    """``None``, a pair kind or ``"dynamic"``; anything else raises naming ``name``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(
            f"{name}: expected None or one of {PAIR_CHOICES}, got {type(value).__name__}"
        )
    if value not in PAIR_CHOICES:
        raise ValueError(f"{name}: expected None or one of {PAIR_CHOICES}, got {value!r}")
    return value


def pair_kinds(choice: str) -> tuple[str, ...]:
    """The kinds a choice can decode: ``(kind,)`` or :data:`DYNAMIC_KINDS`."""
    return DYNAMIC_KINDS if choice == DYNAMIC else (choice,)


def pair_rate_sum(choice: str) -> int:
    """``b_lo + b_hi`` of a choice (6 for ``"dynamic"``: P33 and P24 spend the same bits)."""
    (total,) = {sum(PAIR_KINDS[kind]) for kind in pair_kinds(choice)}
    return total


def check_pair_codebook(name: str, codebook: str, choice: str) -> None:
    """Every record rate of ``choice`` must be a legal kernel rate of ``codebook``."""
    for kind in pair_kinds(choice):
        for rate in PAIR_KINDS[kind]:
            try:
                resolve_format(codebook, rate)
            except ValueError as exc:
                raise ValueError(
                    f"{name}: {kind} needs K{rate} records, illegal for codebook {codebook!r} "
                    f"({exc})"
                ) from None


def pair_payload_shape(
    phase: str, choice: str, *, num_experts: int, hidden: int, intermediate: int, w13_layout: str
) -> tuple[int, ...]:
    """The exact int16 payload shape of a paired phase (see the module docstring)."""
    pairs = intermediate // PAIR_CHANNELS
    words = (hidden // 16) * pairs * 128 * pair_rate_sum(choice)
    if phase == "fc2":
        return (num_experts, words)
    if w13_layout == "packed":
        return (num_experts, 2 * words)
    return (2, num_experts, words)


def pair_geometry(*, phase: str, m_tiles: int, n: int) -> PairGeometry:
    """``(n_tiles, warps, depth, rate_axis)`` of a paired launch: the answer of the table
    :data:`b12x.ops.moe.dispatch.PAIR_GEOMETRY` (see its rows; ``n``: the launch's output columns).

    N axis (FC1): one CTA owns one pair (16 N16 tiles): 8 warps × 2 tiles for single M16 blocks,
    4 warps × 4 tiles for wider blocks. K axis (FC2): the unpaired single-block geometry, 4 × 4
    at two blocks when ``N % 256 == 0`` (else 4 × 2), and 2 tiles with one row in flight at 4
    blocks (4 × 4 at depth 2 spills on sm_90, and so does P44 at 2 × 2 with depth 2: two record
    planes keep twice the pointers live).
    """
    return PAIR_GEOMETRY.decide({"phase": phase, "m_tiles": m_tiles, "n": n})


def pair_spec(
    *, codebook: str, bf16: bool, m_tiles: int, choice: str, geometry: PairGeometry,
    shared: SharedGeometry | None = None,
) -> MoeGemmSpec:  # fmt: skip
    """The compile-time spec of a paired phase from its decided geometry (``k_split`` is 1: the
    paired kernel has no K split, its K-axis records interleave rates per pair). ``shared``:
    the mainloop table's ``wgmma`` geometry, which replaces the per-warp one
    (:mod:`b12x.kernels.pair_decode`)."""
    if shared is not None:
        if not shared.wgmma:
            raise ValueError(f"shared: the pair shared decode is wgmma only, got {shared}")
        rows, stages = shared.slots
        return MoeGemmSpec(
            codebook, PAIR_BASE_BITS, bf16, m_tiles=shared.m_tiles, n_tiles=shared.n_tiles,
            warps=shared.warps, pair=choice, rate_axis=geometry.rate_axis,
            m_warps=shared.m_warps, shared_rows=rows, smem_stages=stages, wgmma=True,
        )  # fmt: skip
    return MoeGemmSpec(
        codebook,
        PAIR_BASE_BITS,
        bf16,
        m_tiles=m_tiles,
        n_tiles=geometry.n_tiles,
        warps=geometry.warps,
        depth=geometry.depth,
        pair=choice,
        rate_axis=geometry.rate_axis,
    )


def pair_gemm_spec(
    *, codebook: str, bf16: bool, m_tiles: int, choice: str, phase: str, n: int
) -> MoeGemmSpec:
    """The compile-time spec of a paired phase (``n``: the launch's output columns); the geometry
    comes from :func:`pair_geometry` (the table), as in :func:`b12x.ops.moe.plan.plan_moe`."""
    geometry = pair_geometry(phase=phase, m_tiles=m_tiles, n=n)
    return pair_spec(
        codebook=codebook, bf16=bf16, m_tiles=m_tiles, choice=choice, geometry=geometry
    )


def check_pair_modes(name: str, modes: object, num_experts: int, device) -> None:
    """An int32 ``[E]`` contiguous mode table on ``device`` with values in {0, 1}.

    The value check reads the table (one host synchronisation) and is skipped while a CUDA
    graph is capturing; the kernel decodes any value other than 1 as P33.
    """
    check_tensor(name, modes, dtypes=(torch.int32,), shape=(num_experts,), device=device)
    capturing = capture_active()
    if not capturing:
        low, high = torch.aminmax(modes)
        if int(low) < 0 or int(high) > 1:
            raise ValueError(
                f"{name}: mode values must be 0 (P33) or 1 (P24), got range "
                f"[{int(low)}, {int(high)}]"
            )


def _lut_addr(spec: MoeGemmSpec, device: torch.device) -> int:
    table = launchers.lut_tensor(resolve_format(spec.codebook, spec.bits), device)
    return 0 if table is None else table.data_ptr()


def payload_view(spec: MoeGemmSpec, payload: torch.Tensor, *, num_payload_experts: int,
                 k: int, n: int) -> torch.Tensor:  # fmt: skip
    """The int32 kernel view of a paired payload (``k``, ``n``: the launch's GEMM dims).

    N axis: ``[E_payload·k/16, n/256, 64·s]``; K axis: ``[E_payload·k/256, n/16, 64·s]``.
    """
    words = payload.view(torch.int32)
    if spec.rate_axis == "n":
        shape = (num_payload_experts * (k // 16), n // PAIR_CHANNELS, spec.pair_words)
    else:
        shape = (num_payload_experts * (k // PAIR_CHANNELS), n // 16, spec.pair_words)
    return words.view(shape)


@shared_body
def launch_paired_gemm(
    *,
    spec: MoeGemmSpec,
    codebook: str,
    ctx,
    a: torch.Tensor,
    payload: torch.Tensor,
    num_payload_experts: int,
    modes: torch.Tensor | None,
    out: torch.Tensor,
    n: int,
    expert_base: int,
    out_col: int,
) -> None:
    """One paired grouped-GEMM launch: ``out[r, out_col : out_col + n] = A[r] @ W[expert_base +
    local]`` for every route ``r`` of a live block (tier 0), the weight decoded from the pair
    payload at the rates of ``spec.pair`` (``modes[local]`` per expert when dynamic)."""
    if codebook != spec.codebook:
        raise ValueError(f"codebook: {codebook!r} differs from the compiled {spec.codebook!r}")
    if (modes is None) == (spec.pair == DYNAMIC):
        raise ValueError(f"modes: a {spec.pair!r} launch takes a mode table iff it is dynamic")
    k = a.shape[1]
    spec.check_k(k)
    view = payload_view(spec, payload, num_payload_experts=num_payload_experts, k=k, n=n)
    table = ctx.descriptors if modes is None else modes  # static kinds never read the slot
    fn = compiled(spec, ctx.arch)
    launch = PairGemmLaunch(
        a=a.view(torch.int32),
        payload=view,
        out=out.view(torch.int32),
        block_expert_ids=ctx.block_expert_ids,
        route_count=ctx.route_count,
        route_rows=ctx.route_rows,
        descriptors=ctx.descriptors,
        modes=table,
        lut_addr=_lut_addr(spec, a.device),
        tier=0,
        expert_base=expert_base,
        out_col_word=out_col // 2,
    )
    fn(*launch.args())
