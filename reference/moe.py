"""Fused trellis MoE with full (uncoupled) rotation: experts, exact and faithful forward (§3.4).

The tensors of one uniform-rate expert stack (``w13`` in the ``"packed"`` or ``"proj"`` layout,
``w2``, the rotation tables, an explicit ``codebook``): :class:`TrellisExperts`.

Per route (token ``t``, expert ``e``, router weight ``w``), with ``Hb`` the blockwise H128:

1. ``A_g = Hb(x_t * gate_suh[e])``, ``A_u = Hb(x_t * up_suh[e])`` (packed: ``A_u = A_g``);
2. ``gate_raw = A_g @ Wq_gate[e]``, ``up_raw = A_u @ Wq_up[e]``;
3. ``g = Hb(gate_raw) * gate_svh[e]``, ``u = Hb(up_raw) * up_svh[e]``, ``a = silu(g) * u *
   down_suh[e]``, ``A2 = Hb(a)``;
4. ``y_raw = A2 @ Wq_down[e]``;
5. ``out_t = sum over the token's active routes of w * (Hb(y_raw) * down_svh[e])``.

Each expert matrix is an EXL3 linear (§3.2, ``diag(suh) H Wq H diag(svh)``) with FC1's ``svh``
and FC2's ``suh`` applied at the intermediate boundary. Precisions ``"exact"`` (float64) and
``"faithful"`` (the kernel's rounding points): :func:`moe_forward`.

Inactive routes (ids outside ``[0, E)``, see :mod:`reference.routing`) are never gathered, never
decoded and never added, so they contribute exactly zero, whatever their router weight (even NaN).
Work is vectorised per expert (routes grouped by :func:`reference.routing.pack_routes`, each
expert decoded once, one matmul per projection). Caller tensors are never modified.

:func:`expert_route_outputs` exposes step 1-4 plus the ``Hb(y_raw) * down_svh`` term per route
(unweighted) and :func:`weighted_route_sum` step 5, so :mod:`reference.tiers` can reuse them.
:func:`row_magnitude` (``sum_s |w_s| * ||route output_s||`` per token) is the scale against which
near-cancelling rows must be judged: a row whose routes nearly cancel has a tiny norm, so its own
rel-L2 blows up even when every route is accurate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference._checks import check_dtype, check_finite, check_tensor
from reference.codebooks import validate_codebook_bits
from reference.hadamard import BLOCK, apply_blockwise, apply_blockwise_faithful
from reference.routing import check_route_ids, pack_routes
from reference.trellis import decode

W13_LAYOUTS = ("packed", "proj")
PRECISIONS = ("exact", "faithful")
COMPUTE_DTYPES = (torch.float16, torch.bfloat16)
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _payload_bits(payload: torch.Tensor, name: str) -> int:
    words = payload.shape[-1]
    if words == 0 or words % 16 or not 1 <= words // 16 <= 8:
        raise ValueError(
            f"{name}: last dimension must be 16*bits with bits in 1..8, got shape "
            f"{tuple(payload.shape)}"
        )
    return words // 16


def _check_feature_size(size: int, name: str, what: str, shape: torch.Size) -> None:
    if size == 0 or size % BLOCK:
        raise ValueError(
            f"{name}: {what} = {size} is not a positive multiple of {BLOCK} (shape {tuple(shape)})"
        )


def _check_scale_table(
    value: object, name: str, num_experts: int, width: int, *, broadcast: bool, device: torch.device
) -> torch.Tensor:
    value = check_dtype(value, torch.float16, name)
    rows_ok = value.dim() == 2 and value.shape[1] == width
    rows_ok = rows_ok and (value.shape[0] == num_experts or (broadcast and value.shape[0] == 1))
    if not rows_ok:
        wanted = f"[{num_experts}, {width}]" + (f" or [1, {width}]" if broadcast else "")
        raise ValueError(f"{name}: expected shape {wanted}, got {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{name}: expected device {device}, got {value.device}")
    return check_finite(value, name)


@dataclass(frozen=True, eq=False)
class TrellisExperts:
    """One uniform-rate trellis expert stack.

    Tensors of one uniform-rate expert stack (:class:`TrellisExperts`, validated on construction;
    ``E`` experts, hidden size ``H``, intermediate size ``I``, both multiples of 128, bit rate
    ``b``):

    * ``w13`` int16, FC1 (``H -> 2I``), in one of two layouts (§1.6):

      - ``"packed"``: ``[E, H/16, 2I/16, 16b]``, gate = output columns ``[0, I)``, up = ``[I, 2I)``.
        The kernel computes **one** input rotation for both halves (``gate_suh``). ``up_suh`` is
        still a field, but it carries no extra information: it must equal ``gate_suh`` element for
        element (after broadcasting), otherwise construction raises a ValueError. A checkpoint with
        distinct gate/up input scales needs the ``"proj"`` layout.
      - ``"proj"`` (b12x ``trellis_t256_proj``): ``[2, E, H/16, I/16, 16b]``, projection 0 = gate, 1
        = up, each with its own input rotation (``gate_suh``, ``up_suh``; b12x "dual A").

    * ``w2`` int16 ``[E, I/16, H/16, 16b]``, FC2 (``I -> H``).
    * ``gate_suh``, ``up_suh``, ``down_svh``: fp16 ``[E, H]`` or ``[1, H]`` (``[1, H]`` is the
      shared/broadcast form, expert stride 0).
    * ``intermediate_rotations``: fp16 ``[E, 3I]`` = ``[gate_svh || up_svh || down_suh]`` in exactly
      that order.
    * ``codebook``: explicit, no default; ``(codebook, b)`` must be legal. All scales finite.
    """

    w13: torch.Tensor
    w2: torch.Tensor
    gate_suh: torch.Tensor
    up_suh: torch.Tensor
    intermediate_rotations: torch.Tensor
    down_svh: torch.Tensor
    codebook: str
    w13_layout: str

    def __post_init__(self) -> None:
        if self.w13_layout not in W13_LAYOUTS:
            raise ValueError(f"w13_layout: expected one of {W13_LAYOUTS}, got {self.w13_layout!r}")
        if not isinstance(self.codebook, str):
            raise TypeError(f"codebook: expected a str, got {type(self.codebook).__name__}")
        w13 = check_dtype(self.w13, torch.int16, "w13")
        if self.w13_layout == "packed":
            if w13.dim() != 4:
                raise ValueError(
                    f"w13: packed layout expects [E, H/16, 2I/16, 16*bits], got {tuple(w13.shape)}"
                )
            num_experts, h_tiles, fc1_tiles = w13.shape[:3]
            if fc1_tiles % 2:
                raise ValueError(f"w13: 2I/16 = {fc1_tiles} is odd (shape {tuple(w13.shape)})")
            i_tiles = fc1_tiles // 2
        else:
            if w13.dim() != 5 or w13.shape[0] != 2:
                raise ValueError(
                    f"w13: proj layout expects [2, E, H/16, I/16, 16*bits], got {tuple(w13.shape)}"
                )
            num_experts, h_tiles, i_tiles = w13.shape[1:4]
        if num_experts < 1:
            raise ValueError(f"w13: expected at least one expert, got shape {tuple(w13.shape)}")
        hidden, inter = 16 * h_tiles, 16 * i_tiles
        _check_feature_size(hidden, "w13", "H", w13.shape)
        _check_feature_size(inter, "w13", "I", w13.shape)
        bits = _payload_bits(w13, "w13")

        w2 = check_dtype(self.w2, torch.int16, "w2")
        expected_w2 = (num_experts, i_tiles, h_tiles, 16 * bits)
        if tuple(w2.shape) != expected_w2:
            raise ValueError(
                f"w2: expected shape {list(expected_w2)} ([E, I/16, H/16, 16*bits] with the bits "
                f"of w13), got {tuple(w2.shape)}"
            )
        if w2.device != w13.device:
            raise ValueError(f"w2: expected device {w13.device}, got {w2.device}")
        validate_codebook_bits(self.codebook, bits)

        device = w13.device
        for name in ("gate_suh", "up_suh", "down_svh"):
            _check_scale_table(
                getattr(self, name), name, num_experts, hidden, broadcast=True, device=device
            )
        _check_scale_table(
            self.intermediate_rotations,
            "intermediate_rotations",
            num_experts,
            3 * inter,
            broadcast=False,
            device=device,
        )
        if self.w13_layout == "packed":
            gate = self.gate_suh.expand(num_experts, hidden)
            if not torch.equal(self.up_suh.expand(num_experts, hidden), gate):
                raise ValueError(
                    "up_suh: the packed w13 layout has one input rotation (gate_suh) for both "
                    "halves, so up_suh must equal gate_suh; use w13_layout='proj' for distinct "
                    "gate/up input scales"
                )

    @property
    def num_experts(self) -> int:
        return self.w2.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.w2.shape[2] * 16

    @property
    def intermediate_size(self) -> int:
        return self.w2.shape[1] * 16

    @property
    def bits(self) -> int:
        return self.w2.shape[-1] // 16

    def check_expert(self, expert: object) -> int:
        """``expert`` as an index of this stack: an int (not a bool) in ``[0, num_experts)``;
        a negative index is refused, never counted from the end."""
        if isinstance(expert, bool) or not isinstance(expert, int):
            raise TypeError(f"expert: expected int, got {type(expert).__name__}")
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert: {expert} is outside [0, {self.num_experts})")
        return expert

    def decode_expert(self, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(Wq_gate [H, I], Wq_up [H, I], Wq_down [I, H])`` of one expert, float16."""
        self.check_expert(expert)
        inter = self.intermediate_size
        if self.w13_layout == "packed":
            fc1 = decode(self.w13[expert], self.codebook)
            gate, up = fc1[:, :inter], fc1[:, inter:]
        else:
            gate = decode(self.w13[0, expert], self.codebook)
            up = decode(self.w13[1, expert], self.codebook)
        return gate, up, decode(self.w2[expert], self.codebook)

    def expert_rotations(self, expert: int) -> ExpertRotations:
        """The six rotation vectors of one expert (broadcast rows resolved)."""
        self.check_expert(expert)
        inter = self.intermediate_size

        def row(table: torch.Tensor) -> torch.Tensor:
            return table[0] if table.shape[0] == 1 else table[expert]

        intermediate = self.intermediate_rotations[expert]
        return ExpertRotations(
            gate_suh=row(self.gate_suh),
            up_suh=row(self.up_suh),
            gate_svh=intermediate[:inter],
            up_svh=intermediate[inter : 2 * inter],
            down_suh=intermediate[2 * inter :],
            down_svh=row(self.down_svh),
        )


@dataclass(frozen=True, eq=False)
class ExpertRotations:
    """The fp16 rotation vectors of one expert: ``[H]`` on the hidden side, ``[I]`` inside."""

    gate_suh: torch.Tensor
    up_suh: torch.Tensor
    gate_svh: torch.Tensor
    up_svh: torch.Tensor
    down_suh: torch.Tensor
    down_svh: torch.Tensor


ExpertSource = Callable[
    [int], tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ExpertRotations, bool]
]
"""``expert -> ((Wq_gate, Wq_up, Wq_down), rotations, shared_input)`` for one routed expert."""


def validate_moe_inputs(
    x: object,
    hidden_size: int,
    topk_ids: object,
    precision: object,
    compute_dtype: object,
    device: torch.device | None = None,
) -> None:
    """Check the forward arguments but the route weights (:func:`validate_topk_weights`); every
    error names the argument. Ids are never narrowed. ``device`` (the experts' device), when
    given, must be ``x``'s device.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(
            f"compute_dtype: expected torch.float16 or torch.bfloat16, got {compute_dtype!r}"
        )
    x = check_dtype(x, INPUT_DTYPES, "x")
    if x.dim() != 2 or x.shape[1] != hidden_size:
        raise ValueError(f"x: expected shape [M, {hidden_size}], got {tuple(x.shape)}")
    if device is not None and x.device != device:
        raise ValueError(f"x: expected the experts' device {device}, got {x.device}")
    check_route_ids(topk_ids, "topk_ids")
    if topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids: {topk_ids.shape[0]} token rows, but x has {x.shape[0]} rows")
    if topk_ids.device != x.device:
        raise ValueError(f"topk_ids: expected device {x.device}, got {topk_ids.device}")


def validate_topk_weights(topk_weights: object, topk_ids: torch.Tensor, x: torch.Tensor) -> None:
    """The route weights of a weighted forward: a floating tensor shaped and placed like the ids
    (``None`` is refused like any other non-tensor: there is no unweighted forward)."""
    topk_weights = check_tensor(topk_weights, "topk_weights")
    if not topk_weights.is_floating_point():
        raise TypeError(f"topk_weights: expected a floating dtype, got {topk_weights.dtype}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_weights: shape {tuple(topk_weights.shape)} does not match topk_ids shape "
            f"{tuple(topk_ids.shape)}"
        )
    if topk_weights.device != x.device:
        raise ValueError(f"topk_weights: expected device {x.device}, got {topk_weights.device}")


def _fp16_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``fp16(a * b)`` for fp16 operands (the fp32 product is exact, so this rounds once)."""
    return (a.to(torch.float32) * b.to(torch.float32)).to(torch.float16)


def _expert_exact(rows: torch.Tensor, weights, rot: ExpertRotations, shared_input: bool):
    f64 = torch.float64
    gate_w, up_w, down_w = (w.to(f64) for w in weights)
    x = rows.to(f64)
    a_gate = apply_blockwise(x * rot.gate_suh.to(f64))
    a_up = a_gate if shared_input else apply_blockwise(x * rot.up_suh.to(f64))
    g = apply_blockwise(a_gate @ gate_w) * rot.gate_svh.to(f64)
    u = apply_blockwise(a_up @ up_w) * rot.up_svh.to(f64)
    a2 = apply_blockwise(F.silu(g) * u * rot.down_suh.to(f64))
    return apply_blockwise(a2 @ down_w) * rot.down_svh.to(f64)


def faithful_rotate_input(
    x16: torch.Tensor, suh: torch.Tensor, *, compute_dtype: torch.dtype
) -> torch.Tensor:
    """Faithful steps 2-3 for routed rows: ``cd(fp16(H128_fp32(fp16(x16 * suh))))``.

    ``x16`` fp16 ``[R, H]`` (the token rows of the routes), ``suh`` fp16 ``[H]``. Returns the
    rotated operand in ``compute_dtype`` (the ``rotated_gate`` / ``rotated_up`` stage).
    """
    rotated_f16 = apply_blockwise_faithful(_fp16_product(x16, suh)).to(torch.float16)
    return rotated_f16.to(compute_dtype)


def faithful_expert_gemm(a: torch.Tensor, weight: torch.Tensor, *, compute_dtype: torch.dtype):
    """Faithful steps 4 / 6: ``cd(a @ cd(weight))`` with fp32 accumulation (torch's order).

    ``a`` holds compute-dtype values (any float dtype), ``weight`` the decoded fp16 matrix.
    Returns ``compute_dtype`` (the ``fc1`` halves / the ``fc2`` stage).
    """
    f32 = torch.float32
    return (a.to(f32) @ weight.to(compute_dtype).to(f32)).to(compute_dtype)


def faithful_activate(
    gate_raw: torch.Tensor,
    up_raw: torch.Tensor,
    rot: ExpertRotations,
    *,
    compute_dtype: torch.dtype,
) -> torch.Tensor:
    """Faithful step 5 (the intermediate boundary) from the stored FC1 halves ``[R, I]``:
    ``cd(H128_fp32(silu(H128_fp32(gate) * gate_svh) * (H128_fp32(up) * up_svh) * down_suh))``,
    every operation in fp32 (the ``activated`` stage, ``compute_dtype``)."""
    f32 = torch.float32
    g = apply_blockwise_faithful(gate_raw) * rot.gate_svh.to(f32)
    u = apply_blockwise_faithful(up_raw) * rot.up_svh.to(f32)
    a = F.silu(g) * u * rot.down_suh.to(f32)
    return apply_blockwise_faithful(a).to(compute_dtype)


def faithful_route_term(y_raw: torch.Tensor, down_svh: torch.Tensor) -> torch.Tensor:
    """Faithful step 7's per-route term before the router weight: ``H128_fp32(y_raw) * down_svh``
    in fp32 (``y_raw`` the stored FC2 output, ``down_svh`` fp16 ``[H]``)."""
    return apply_blockwise_faithful(y_raw) * down_svh.to(torch.float32)


def faithful_expert_stages(
    rows: torch.Tensor,
    weights,
    rot: ExpertRotations,
    *,
    shared_input: bool,
    compute_dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """Every stored stage of one expert's routes (``rows`` the routes' token rows ``[R, H]``):
    ``rotated_gate``, ``rotated_up`` (``[R, H]``), ``fc1`` (``[R, 2I]``, gate | up), ``activated``
    (``[R, I]``), ``fc2`` (``[R, H]``), all ``compute_dtype``; ``term`` fp32 ``[R, H]`` (the
    unweighted route output :func:`faithful_route_term`). ``weights`` = ``(Wq_gate, Wq_up,
    Wq_down)`` fp16; ``shared_input``: the packed layout's single input rotation."""
    gate_w, up_w, down_w = weights
    x16 = rows.to(torch.float16)
    cd = compute_dtype
    a_gate = faithful_rotate_input(x16, rot.gate_suh, compute_dtype=cd)
    a_up = a_gate if shared_input else faithful_rotate_input(x16, rot.up_suh, compute_dtype=cd)
    gate_raw = faithful_expert_gemm(a_gate, gate_w, compute_dtype=cd)
    up_raw = faithful_expert_gemm(a_up, up_w, compute_dtype=cd)
    a2 = faithful_activate(gate_raw, up_raw, rot, compute_dtype=cd)
    y_raw = faithful_expert_gemm(a2, down_w, compute_dtype=cd)
    return {
        "rotated_gate": a_gate,
        "rotated_up": a_up,
        "fc1": torch.cat([gate_raw, up_raw], dim=1),
        "activated": a2,
        "fc2": y_raw,
        "term": faithful_route_term(y_raw, rot.down_svh),
    }


def expert_route_term(
    rows: torch.Tensor,
    weights,
    rotations: ExpertRotations,
    *,
    shared_input: bool,
    precision: str,
    compute_dtype: torch.dtype,
) -> torch.Tensor:
    """``Hb(y_raw) * down_svh`` (unweighted) of one expert's routes, ``rows`` the routes' token
    rows ``[R, H]`` and ``weights`` its decoded ``(Wq_gate, Wq_up, Wq_down)``: float64 for
    ``"exact"``, float32 for ``"faithful"`` (arguments pre-validated). The one per-expert step of
    :func:`route_outputs_from_source`, public so that a caller holding an expert's decoded
    weights (the oracle's judge) computes both references without decoding it again."""
    if precision == "exact":
        return _expert_exact(rows, weights, rotations, shared_input)
    stages = faithful_expert_stages(
        rows, weights, rotations, shared_input=shared_input, compute_dtype=compute_dtype
    )
    return stages["term"]


def route_outputs_from_source(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    source: ExpertSource,
    *,
    precision: str,
    compute_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-4 and ``Hb(y_raw) * down_svh`` for every active route (arguments pre-validated).

    Returns ``(outputs [M, top_k, H], active [M, top_k])``; rows of inactive routes are zero.
    ``source(e)`` supplies the decoded weights and rotations of expert ``e`` (called once per
    routed expert).
    """
    m, top_k = topk_ids.shape
    out_dtype = torch.float64 if precision == "exact" else torch.float32
    outputs = torch.zeros(m * top_k, x.shape[1], dtype=out_dtype, device=x.device)
    packed = pack_routes(topk_ids, num_experts, block_size=1)
    offsets, counts = packed.expert_offsets.tolist(), packed.expert_counts.tolist()
    for expert in range(num_experts):
        if counts[expert] == 0:
            continue
        start = offsets[expert]
        routes = packed.packed_route_indices[start : start + counts[expert]].to(torch.int64)
        rows = x.index_select(0, routes // top_k)
        weights, rotations, shared_input = source(expert)
        result = expert_route_term(
            rows, weights, rotations, shared_input=shared_input, precision=precision,
            compute_dtype=compute_dtype,
        )  # fmt: skip
        outputs.index_copy_(0, routes, result)
    active = torch.zeros(m * top_k, dtype=torch.bool, device=x.device)
    active[packed.packed_route_indices[: packed.packed_route_count].to(torch.int64)] = True
    return outputs.reshape(m, top_k, x.shape[1]), active.reshape(m, top_k)


ROUTE_STAGES = ("rotated_gate", "rotated_up", "fc1", "activated", "fc2", "term")
"""The stored stages of :func:`faithful_expert_stages`, in chain order."""


def route_stages_from_source(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    source: ExpertSource,
    *,
    compute_dtype: torch.dtype,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Every faithful stage of every route, in route order ``r = t * top_k + j``.

    Returns ``(stages, active [M * top_k])`` where ``stages[name]`` is ``[M * top_k, F]``
    (:data:`ROUTE_STAGES`; compute dtype, ``term`` fp32) with zero rows for inactive routes.
    Arguments as :func:`route_outputs_from_source` (pre-validated). The stages are the values
    :func:`route_outputs_from_source` computes on its faithful path, exposed for the oracle.
    """
    m, top_k = topk_ids.shape
    routes_total = m * top_k
    stages: dict[str, torch.Tensor] = {}
    packed = pack_routes(topk_ids, num_experts, block_size=1)
    offsets, counts = packed.expert_offsets.tolist(), packed.expert_counts.tolist()
    for expert in range(num_experts):
        if counts[expert] == 0:
            continue
        start = offsets[expert]
        routes = packed.packed_route_indices[start : start + counts[expert]].to(torch.int64)
        rows = x.index_select(0, routes // top_k)
        weights, rotations, shared_input = source(expert)
        result = faithful_expert_stages(
            rows, weights, rotations, shared_input=shared_input, compute_dtype=compute_dtype
        )
        for name, value in result.items():
            if name not in stages:
                stages[name] = torch.zeros(
                    routes_total, value.shape[1], dtype=value.dtype, device=x.device
                )
            stages[name].index_copy_(0, routes, value)
    active = torch.zeros(routes_total, dtype=torch.bool, device=x.device)
    active[packed.packed_route_indices[: packed.packed_route_count].to(torch.int64)] = True
    return stages, active


def stack_route_stages(
    x: torch.Tensor,
    experts,
    topk_ids: torch.Tensor,
    *,
    compute_dtype: torch.dtype = torch.float16,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """:func:`route_stages_from_source` of any stack accepted by :func:`stack_route_outputs`.

    Stages no route reached are absent from the dict (an all-inactive batch returns ``{}``)."""
    validate_moe_inputs(
        x, experts.hidden_size, topk_ids, "faithful", compute_dtype, experts.w13.device
    )
    shared = experts.w13_layout == "packed"

    def source(expert: int):
        return experts.decode_expert(expert), experts.expert_rotations(expert), shared

    return route_stages_from_source(
        x, topk_ids, experts.num_experts, source, compute_dtype=compute_dtype
    )


def stack_route_outputs(
    x: torch.Tensor,
    experts,
    topk_ids: torch.Tensor,
    *,
    precision: str = "exact",
    compute_dtype: torch.dtype = torch.float16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-route ``Hb(y_raw) * down_svh`` (unweighted) of any expert stack: ``(outputs [M,
    top_k, H], active)``, float64 for exact, float32 for faithful; inactive routes are zero rows
    and ``False`` in ``active``.

    ``experts`` is any stack exposing ``hidden_size``, ``num_experts``, ``w13`` (for its
    device), ``w13_layout``, ``decode_expert(e)`` and ``expert_rotations(e)`` — a
    :class:`TrellisExperts`, or a QSRT-paired stack (:mod:`reference.moe_pairs`). The typed
    entry points check the stack's class, then call this.
    """
    validate_moe_inputs(
        x, experts.hidden_size, topk_ids, precision, compute_dtype, experts.w13.device
    )
    shared = experts.w13_layout == "packed"

    def source(expert: int):
        return experts.decode_expert(expert), experts.expert_rotations(expert), shared

    return route_outputs_from_source(
        x, topk_ids, experts.num_experts, source, precision=precision, compute_dtype=compute_dtype
    )


def stack_moe_forward(
    x: torch.Tensor,
    experts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    precision: str = "exact",
    compute_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """:func:`moe_forward` of any expert stack accepted by :func:`stack_route_outputs`."""
    validate_moe_inputs(
        x, experts.hidden_size, topk_ids, precision, compute_dtype, experts.w13.device
    )
    validate_topk_weights(topk_weights, topk_ids, x)
    outputs, active = stack_route_outputs(
        x, experts, topk_ids, precision=precision, compute_dtype=compute_dtype
    )
    return weighted_route_sum(outputs, active, topk_weights)


def expert_route_outputs(
    x: torch.Tensor,
    experts: TrellisExperts,
    topk_ids: torch.Tensor,
    *,
    precision: str = "exact",
    compute_dtype: torch.dtype = torch.float16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-route ``Hb(y_raw) * down_svh`` (unweighted) of a :class:`TrellisExperts` stack
    (:func:`stack_route_outputs`)."""
    if not isinstance(experts, TrellisExperts):
        raise TypeError(f"experts: expected TrellisExperts, got {type(experts).__name__}")
    return stack_route_outputs(
        x, experts, topk_ids, precision=precision, compute_dtype=compute_dtype
    )


def weighted_route_sum(
    route_outputs: torch.Tensor, active: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """Step 5: ``out_t = sum over active slots s (in slot order) of w[t, s] * outputs[t, s]``.

    Accumulates in ``route_outputs.dtype`` (float32 faithful, float64 exact) from a zero
    accumulator; weights are converted to that dtype; inactive slots are skipped, not added.
    """
    route_outputs = check_dtype(route_outputs, (torch.float32, torch.float64), "route_outputs")
    if route_outputs.dim() != 3:
        raise ValueError(
            f"route_outputs: expected shape [M, top_k, H], got {tuple(route_outputs.shape)}"
        )
    active = check_dtype(active, torch.bool, "active")
    for name, tensor in (("active", active), ("topk_weights", topk_weights)):
        if tuple(tensor.shape) != tuple(route_outputs.shape[:2]):
            raise ValueError(
                f"{name}: expected shape {tuple(route_outputs.shape[:2])}, got "
                f"{tuple(tensor.shape)}"
            )
    accumulate = route_outputs.dtype
    weights = topk_weights.to(accumulate)
    out = torch.zeros(
        route_outputs.shape[0],
        route_outputs.shape[2],
        dtype=accumulate,
        device=route_outputs.device,
    )
    for slot in range(route_outputs.shape[1]):
        rows = active[:, slot]
        if bool(rows.any()):
            term = weights[rows, slot, None] * route_outputs[rows, slot]
            out[rows] = out[rows] + term
    return out


def row_magnitude(
    route_outputs: torch.Tensor, active: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """Per token ``sum over active slots of |w| * ||route output||_2`` (float64 ``[M]``).

    The scale to judge a row's error against: a row whose routes nearly cancel has a tiny norm,
    so its own relative error is meaningless, while the error of each route is proportional to
    that route's magnitude.
    """
    norms = route_outputs.to(torch.float64).norm(dim=-1)
    terms = topk_weights.to(torch.float64).abs() * norms
    return torch.where(active, terms, torch.zeros_like(terms)).sum(dim=-1)


def moe_forward(
    x: torch.Tensor,
    experts: TrellisExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    precision: str = "exact",
    compute_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """The fused MoE forward of §3.4 for ``x [M, H]`` and routes ``[M, top_k]``.

    ``topk_ids`` is int32 or int64; ids outside ``[0, E)`` are inactive. Precisions:

    * ``"exact"``: float64 everywhere over the decoded fp16 weights; returns float64 ``[M, H]``.
    * ``"faithful"``: the kernel's rounding points, in this order:

      1. ``x -> fp16`` (``fp16(x_t)``);
      2. ``fp16(x16 * suh)``: the fp32 product of two fp16 values is exact, so one rounding;
      3. H128 with the kernel's fp32 butterfly
         (:func:`reference.hadamard.apply_blockwise_faithful`), rounded to fp16 (the
         ``rotation_gate``/``rotation_up`` route-major buffers), then to the compute dtype as a GEMM
         operand (a no-op for fp16);
      4. FC1: operands in the compute dtype (decoded fp16 weights rounded to bf16 for bf16 compute),
         fp32 accumulation, gate and up each stored in the compute dtype (the fc1 buffer);
      5. boundary in fp32 from the stored values: fp32 butterfly H128, ``* svh`` in fp32, ``(silu(g)
         * u) * down_suh`` in fp32 (silu = ``g * sigmoid(g)`` by torch; the kernel's exp
         approximation is not replayed), fp32 butterfly H128, stored in the compute dtype (``A2``);
      6. FC2: fp32 accumulation, stored in the compute dtype (``y_raw``);
      7. top-k sum in fp32: ``Hb_fp32(y_raw) * down_svh`` then ``* w`` (w as fp32), added into an
         fp32 zero accumulator over the token's active slots in slot order. Returns float32 ``[M,
         H]``; the kernel's final store to the output dtype is the caller's one extra rounding.

      The summation order inside the fp32 GEMMs is torch's, not the kernel's. ``compute_dtype`` bf16
      is modelled for completeness only: the spec (§4.1, §6) says full rotation needs fp16 operands,
      so a bf16 run is a double rounding fp16 -> bf16 of the rotated operands and of the decoded
      weights.
    """
    if not isinstance(experts, TrellisExperts):
        raise TypeError(f"experts: expected TrellisExperts, got {type(experts).__name__}")
    return stack_moe_forward(
        x, experts, topk_weights, topk_ids, precision=precision, compute_dtype=compute_dtype
    )
