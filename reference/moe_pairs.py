"""The fused MoE over QSRT pair payloads (spec §3.4 with §4.2–§4.4): experts and forward.

Tensors of one paired expert stack (:class:`PairedExperts`, validated on construction; ``E``
experts, hidden ``H`` (multiple of 128), intermediate ``I = 256·P``, codebook explicit):

* ``fc1_pair`` / ``fc2_pair``: ``None`` (that phase is an ordinary trellis tensor, shapes as in
  :class:`reference.moe.TrellisExperts`), a pair kind of :data:`reference.pairs.PAIR_KINDS`, or
  ``"dynamic"``: per expert P33 (mode 0) or P24 (mode 1) from ``fc1_modes`` / ``fc2_modes``
  (int32/int64 ``[E]``, values in {0, 1}). Every pair of an expert's phase has the same kind.
  The rate axis is the phase's: FC1 on N (gate/up output channels), FC2 on K.
* ``w13`` (paired FC1, ``"proj"`` or ``"packed"``, ``fc1_order``), ``w2`` (paired FC2) and the
  rotations (as :class:`reference.moe.TrellisExperts`): layouts in :class:`PairedExperts`.

Each expert decodes with :func:`reference.pairs.decode_pair` into the same fp16 ``Wq`` matrices
a uniform stack has, then runs the §3.4 chain of :mod:`reference.moe` unchanged
(:func:`reference.moe.route_outputs_from_source`, :func:`reference.moe.weighted_route_sum`): same
exact (fp64) and faithful (kernel rounding points) precisions.

**P33 is uniform K3, re-cut**: its pair payloads are the flattened uniform payload
(:func:`p33_from_uniform`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference._checks import check_dtype
from reference.moe import (
    W13_LAYOUTS,
    ExpertRotations,
    TrellisExperts,
    stack_moe_forward,
    stack_route_outputs,
)
from reference.pairs import (
    PAIR_CHANNELS,
    PAIR_KINDS,
    decode_pair,
    deinterleave_n_axis,
    pair_payload_length,
)
from reference.trellis import decode

__all__ = [
    "DYNAMIC",
    "DYNAMIC_KINDS",
    "PairedExperts",
    "expert_kinds",
    "p33_from_uniform",
    "paired_moe_forward",
    "paired_route_outputs",
]

DYNAMIC = "dynamic"
DYNAMIC_KINDS = ("P33", "P24")
"""Mode 0 -> P33, mode 1 -> P24 (spec §4.2, one table per phase)."""
PAIR_CHOICES = (*PAIR_KINDS, DYNAMIC)
FC1_ORDERS = ("prepared", "reference")


def _check_choice(name: str, value: object) -> str | None:
    if value is not None and value not in PAIR_CHOICES:
        raise ValueError(f"{name}: expected None or one of {PAIR_CHOICES}, got {value!r}")
    return value


def _rate_sum(choice: str) -> int:
    kinds = DYNAMIC_KINDS if choice == DYNAMIC else (choice,)
    (total,) = {sum(PAIR_KINDS[kind]) for kind in kinds}
    return total


def p33_from_uniform(trellis: torch.Tensor, rate_axis: str, *, layout: str = "prepared"):
    """The P33 pair payload of a uniform K3 trellis ``[K/16, N/16, 48]`` (see the docstring).

    Rate axis ``"k"`` needs K = 256·P, ``"n"`` needs N = 256·P. Returns a 1-D int16 tensor.

    **P33 is uniform K3, re-cut** (:func:`p33_from_uniform`): both records of a P33 pair have 3
    bits, so record 0 of pair p on the K axis is K16 rows ``16p..16p+7`` of the uniform ``[I/16,
    H/16, 48]`` stack in row-major order and record 1 rows ``16p+8..16p+15``: the pair-major payload
    is the uniform payload flattened. On the N axis the prepared order per K16 row is ``[pair p:
    tiles 16p..16p+7 ‖ tiles 16p+8..16p+15]``, i.e. the uniform row's tiles in order: the prepared
    payload is again the flattened uniform payload (the reference order is its de-interleave).
    """
    trellis = check_dtype(trellis, torch.int16, "trellis")
    if trellis.dim() != 3 or trellis.shape[-1] != 48:
        raise ValueError(f"trellis: expected a K3 trellis [K/16, N/16, 48], got {trellis.shape}")
    k, n = 16 * trellis.shape[0], 16 * trellis.shape[1]
    rate = {"k": k, "n": n}.get(rate_axis)
    if rate is None:
        raise ValueError(f"rate_axis: expected 'k' or 'n', got {rate_axis!r}")
    if rate % PAIR_CHANNELS:
        raise ValueError(f"trellis: the rate axis holds {rate} channels, not whole 256-pairs")
    flat = trellis.reshape(-1).clone()
    if rate_axis == "n" and layout == "reference":
        return deinterleave_n_axis(flat, ("P33",) * (n // PAIR_CHANNELS), k)
    if layout not in ("prepared", "reference"):
        raise ValueError(f"layout: expected 'prepared' or 'reference', got {layout!r}")
    return flat


def _check_modes(name: str, modes: object, num_experts: int, device) -> torch.Tensor:
    modes = check_dtype(modes, (torch.int32, torch.int64), name)
    if tuple(modes.shape) != (num_experts,):
        raise ValueError(f"{name}: expected shape ({num_experts},), got {tuple(modes.shape)}")
    if modes.device != device:
        raise ValueError(f"{name}: expected device {device}, got {modes.device}")
    if bool(((modes != 0) & (modes != 1)).any()):
        raise ValueError(f"{name}: mode values must be 0 (P33) or 1 (P24)")
    return modes


@dataclass(frozen=True, eq=False)
class PairedExperts:
    """One paired trellis expert stack; see the module docstring for every field.

    * ``w13`` (paired FC1), int16, ``s = b_lo + b_hi`` (6 for dynamic):

      - ``"proj"``: ``[2, E, (H/16)·P·128·s]``; projection 0 = gate, 1 = up, each a P-pair N-axis
        payload with ``orth = H``;
      - ``"packed"``: ``[E, (H/16)·2P·128·s]``: one 2P-pair N-axis payload whose first P pairs are
        gate's columns ``[0, I)`` and the last P up's ``[I, 2I)``.

      ``fc1_order`` names the N-axis order: ``"prepared"`` (K16-row-major, what b12x consumes,
      :func:`reference.pairs.interleave_n_axis`) or ``"reference"`` (pair-major records).
    * ``w2`` (paired FC2), int16 ``[E, P·(H/16)·128·s]``: a P-pair K-axis payload (``orth = H``),
      per pair ``[record 0 plane: K16 rows 0..7 ‖ record 1 plane: rows 8..15]`` (the absolute K16
      row ``16p + kt`` of the intermediate).
    * Rotations exactly as :class:`reference.moe.TrellisExperts` (``[E|1, H]`` hidden-side tables,
      ``[E, 3I]`` intermediate ``[gate_svh ‖ up_svh ‖ down_suh]``, record-major per pair).
    """

    w13: torch.Tensor
    w2: torch.Tensor
    gate_suh: torch.Tensor
    up_suh: torch.Tensor
    intermediate_rotations: torch.Tensor
    down_svh: torch.Tensor
    codebook: str
    w13_layout: str
    fc1_pair: str | None
    fc2_pair: str | None
    fc1_modes: torch.Tensor | None = None
    fc2_modes: torch.Tensor | None = None
    fc1_order: str = "prepared"

    def __post_init__(self) -> None:
        if self.w13_layout not in W13_LAYOUTS:
            raise ValueError(f"w13_layout: expected one of {W13_LAYOUTS}, got {self.w13_layout!r}")
        if not isinstance(self.codebook, str):
            raise TypeError(f"codebook: expected a str, got {type(self.codebook).__name__}")
        if self.fc1_order not in FC1_ORDERS:
            raise ValueError(f"fc1_order: expected one of {FC1_ORDERS}, got {self.fc1_order!r}")
        _check_choice("fc1_pair", self.fc1_pair)
        _check_choice("fc2_pair", self.fc2_pair)
        inter = self.intermediate_rotations
        if not isinstance(inter, torch.Tensor) or inter.dim() != 2 or inter.shape[1] % 3:
            raise ValueError("intermediate_rotations: expected [E, 3I]")
        e, i = inter.shape[0], inter.shape[1] // 3
        h = self.down_svh.shape[-1]
        if (self.fc1_pair or self.fc2_pair) and i % PAIR_CHANNELS:
            raise ValueError(f"intermediate_rotations: I = {i} is not a whole number of pairs")
        for name in ("w13", "w2"):
            check_dtype(getattr(self, name), torch.int16, name)
        if self.fc1_pair is not None:
            words = pair_payload_length(("P33",) * (i // PAIR_CHANNELS), h)
            words = words // 6 * _rate_sum(self.fc1_pair)
            want = (e, 2 * words) if self.w13_layout == "packed" else (2, e, words)
            if tuple(self.w13.shape) != want:
                raise ValueError(f"w13: expected shape {want}, got {tuple(self.w13.shape)}")
        if self.fc2_pair is not None:
            words = pair_payload_length(("P33",) * (i // PAIR_CHANNELS), h)
            want = (e, words // 6 * _rate_sum(self.fc2_pair))
            if tuple(self.w2.shape) != want:
                raise ValueError(f"w2: expected shape {want}, got {tuple(self.w2.shape)}")
        for phase in ("fc1", "fc2"):
            name, modes = f"{phase}_modes", getattr(self, f"{phase}_modes")
            if getattr(self, f"{phase}_pair") == DYNAMIC:
                _check_modes(name, modes, e, self.w13.device)
            elif modes is not None:
                raise ValueError(f"{name}: only a dynamic {phase} phase takes a mode table")
        # The uniform phases and every rotation table: TrellisExperts' checks, on stand-ins.
        object.__setattr__(self, "_uniform", self._uniform_view())

    def _uniform_view(self) -> TrellisExperts:
        """A TrellisExperts with this stack's rotations (and unpaired phases): its construction
        validates the rotation tables; paired phases get zero K3 stand-ins of the right shape."""
        e, i, h = self.num_experts, self.intermediate_size, self.hidden_size
        dev = self.w13.device
        w2 = self.w2
        if self.fc2_pair is not None:
            bits = 3 if self.fc1_pair is not None else self.w13.shape[-1] // 16
            w2 = torch.zeros(e, i // 16, h // 16, 16 * bits, dtype=torch.int16, device=dev)
        w13 = self.w13
        for name, choice in (("w13", self.fc1_pair), ("w2", self.fc2_pair)):
            want = (5 if self.w13_layout == "proj" else 4) if name == "w13" else 4
            if choice is None and getattr(self, name).dim() != want:
                phase = "FC1" if name == "w13" else "FC2"
                raise ValueError(
                    f"{name}: an unpaired {phase} is an ordinary trellis stack ({want}-d, as in "
                    f"reference.moe.TrellisExperts), got shape {tuple(getattr(self, name).shape)}"
                )
        if self.fc1_pair is not None:
            words = w2.shape[-1]
            shape = (e, h // 16, 2 * i // 16, words) if self.w13_layout == "packed" else (
                2, e, h // 16, i // 16, words)  # fmt: skip
            w13 = torch.zeros(shape, dtype=torch.int16, device=dev)
        return TrellisExperts(
            w13, w2, self.gate_suh, self.up_suh, self.intermediate_rotations, self.down_svh,
            self.codebook, self.w13_layout,
        )  # fmt: skip

    @property
    def num_experts(self) -> int:
        return self.intermediate_rotations.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.down_svh.shape[-1]

    @property
    def intermediate_size(self) -> int:
        return self.intermediate_rotations.shape[1] // 3

    def expert_kind(self, phase: str, expert: int) -> str | None:
        """The pair kind of ``phase`` ("fc1"/"fc2") for ``expert`` (None when unpaired)."""
        self._uniform.check_expert(expert)
        choice = getattr(self, f"{phase}_pair")
        if choice != DYNAMIC:
            return choice
        return DYNAMIC_KINDS[int(getattr(self, f"{phase}_modes")[expert])]

    def decode_expert(self, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(Wq_gate [H, I], Wq_up [H, I], Wq_down [I, H])`` of one expert, float16."""
        self._uniform.check_expert(expert)
        h, i = self.hidden_size, self.intermediate_size
        pairs = i // PAIR_CHANNELS
        kind1, kind2 = self.expert_kind("fc1", expert), self.expert_kind("fc2", expert)
        if kind1 is None and self.w13_layout == "packed":
            fc1 = decode(self.w13[expert], self.codebook)
            gate, up = fc1[:, :i], fc1[:, i:]
        elif kind1 is None:
            gate, up = (decode(self.w13[proj, expert], self.codebook) for proj in (0, 1))
        elif self.w13_layout == "packed":
            fc1 = decode_pair(
                self.w13[expert], (kind1,) * (2 * pairs), "n", h, self.codebook,
                layout=self.fc1_order,
            )  # fmt: skip
            gate, up = fc1[:, :i], fc1[:, i:]
        else:
            gate, up = (
                decode_pair(
                    self.w13[proj, expert], (kind1,) * pairs, "n", h, self.codebook,
                    layout=self.fc1_order,
                )
                for proj in (0, 1)
            )  # fmt: skip
        if kind2 is None:
            down = decode(self.w2[expert], self.codebook)
        else:
            down = decode_pair(self.w2[expert], (kind2,) * pairs, "k", h, self.codebook)
        return gate, up, down

    def expert_rotations(self, expert: int) -> ExpertRotations:
        """The six rotation vectors of one expert (as :class:`reference.moe.TrellisExperts`)."""
        return self._uniform.expert_rotations(expert)


def expert_kinds(experts: PairedExperts) -> list[tuple[str | None, str | None]]:
    """``(fc1 kind, fc2 kind)`` of every expert (the mode tables resolved)."""
    return [
        (experts.expert_kind("fc1", e), experts.expert_kind("fc2", e))
        for e in range(experts.num_experts)
    ]


def paired_route_outputs(
    x: torch.Tensor,
    experts: PairedExperts,
    topk_ids: torch.Tensor,
    *,
    precision: str = "exact",
    compute_dtype: torch.dtype = torch.float16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-route ``Hb(y_raw) * down_svh`` (unweighted), as
    :func:`reference.moe.expert_route_outputs`: ``(outputs [M, top_k, H], active)``."""
    if not isinstance(experts, PairedExperts):
        raise TypeError(f"experts: expected PairedExperts, got {type(experts).__name__}")
    return stack_route_outputs(
        x, experts, topk_ids, precision=precision, compute_dtype=compute_dtype
    )


def paired_moe_forward(
    x: torch.Tensor,
    experts: PairedExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    precision: str = "exact",
    compute_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """:func:`reference.moe.moe_forward` of a paired stack (float64 exact / float32 faithful)."""
    if not isinstance(experts, PairedExperts):
        raise TypeError(f"experts: expected PairedExperts, got {type(experts).__name__}")
    return stack_moe_forward(
        x, experts, topk_weights, topk_ids, precision=precision, compute_dtype=compute_dtype
    )
