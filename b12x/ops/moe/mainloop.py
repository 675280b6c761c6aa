"""Which mainloop the MoE's grouped GEMMs run, as a declarative table (issue 15).

The grouped GEMM (:mod:`b12x.kernels.moe_gemm`) has two mainloops: the **per-warp decode** (each
warp decodes the weights it multiplies; route blocks of ``16·m_tiles`` slots, the
``moe_route_block`` table's) and the **shared decode** (:mod:`b12x.kernels.shared_decode`: the
CTA decodes each K16 row of its expert once into shared memory and ``m_warps`` x
``warps/m_warps`` warps multiply it, its K split folded in the per-warp kernel's order). One
routing serves FC1 and FC2, so this table answers once per step, before the route block: on the
shared decode the block is its geometry's (128 slots) and ``moe_route_block`` is not consulted.
The machinery is :mod:`b12x.ops.tables` (:data:`~b12x.ops.moe.dispatch.TABLES` lists it first).

Rows (:data:`MAINLOOP`, in priority order; value a :class:`SharedGeometry` or ``None`` =
per-warp): ``pinned`` (a ``shared_decode`` pin: off / wide / tensor), ``pinned_m_tiles`` (None),
``paired_odd`` (FC1 P43: None), ``n_not_128`` (None), ``tensor_core`` (sm_90, N multiples of
256, ``m·top_k >= TENSOR_MIN_ROUTES·E``, :data:`SHARED_TENSOR_SMEM` granted:
:data:`SHARED_TENSOR`, pair phases too), ``paired`` (None), ``few_routes`` (``m·top_k <
SHARED_MIN_ROUTES·E``: None), ``no_room`` (:data:`SHARED_WIDE_SMEM` not granted: None),
``shared_wide`` (:data:`SHARED_WIDE`). Every mainloop gives a route the same result bit for bit.
The route thresholds were chosen by measurement: docs/evidence/moe-shared-decode-routes.md; the
rows in full: docs/notes/b12x.md.

Fields ``m, top_k, num_experts, m_tiles, shared_decode, paired, fc1_pair_odd, fc1_n, fc2_n,
max_shared_mem, capability``; both sides of every threshold are literal
:class:`~b12x.ops.tables.Boundary` records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from b12x.kernels.shared_layout import (
    SMEM_LIMIT,
    WGMMA_CAPABILITY,
    fold_bytes,
    shared_decode_layout,
)
from b12x.ops.dense.dispatch import check_capability
from b12x.ops.dense.tiles import GROUPED_M_TILES
from b12x.ops.tables import (
    Boundary,
    Condition,
    DecisionTable,
    Field,
    int_choice,
    optional,
    positive_int,
    str_choice,
)
from b12x.runtime.validate import check_bool

__all__ = [
    "MAINLOOP",
    "SHARED_GEOMETRIES",
    "SHARED_MIN_ROUTES",
    "SHARED_PINS",
    "SHARED_TENSOR",
    "SHARED_TENSOR_SMEM",
    "SHARED_WIDE",
    "SHARED_WIDE_SMEM",
    "TENSOR_MIN_ROUTES",
    "SharedGeometry",
]


class SharedGeometry(NamedTuple):
    """A shared-decode grouped GEMM (:mod:`b12x.kernels.shared_decode`): ``m_tiles`` M16 blocks
    and ``n_tiles`` decoded N16 tiles per warp, ``warps`` warps as ``m_warps`` (M) x
    ``warps/m_warps`` (N); route blocks of ``16·m_tiles·m_warps`` slots."""

    m_tiles: int
    n_tiles: int
    warps: int
    m_warps: int
    #: The MMAs are Hopper warpgroup MMAs (sm_90, :mod:`b12x.kernels.wgmma_decode`).
    wgmma: bool = False
    #: ``(shared_rows, smem_stages)`` fixed by the geometry; None: the first of
    #: :data:`~b12x.kernels.shared_layout.SLOT_CHOICES` that fits the 48 KB at the rate.
    slots: tuple[int, int] | None = None

    @property
    def block_size(self) -> int:
        return 16 * self.m_tiles * self.m_warps

    @property
    def n_group(self) -> int:
        return 16 * self.n_tiles * self.warps


#: 8 warps as 4 (M) x 2 (N): 128 route slots x 128 columns per CTA (the dense WIDE geometry).
SHARED_WIDE = SharedGeometry(m_tiles=2, n_tiles=1, warps=8, m_warps=4)
#: sm_90: every warp decodes, two warpgroups multiply with ``wgmma``: 128 route slots x 256
#: columns per CTA (the dense TENSOR geometry), 2 K16 rows per step in 4 slots.
SHARED_TENSOR = SharedGeometry(m_tiles=1, n_tiles=2, warps=8, m_warps=8, wgmma=True, slots=(2, 4))
SHARED_GEOMETRIES: Mapping[str, SharedGeometry] = {"wide": SHARED_WIDE, "tensor": SHARED_TENSOR}
#: ``shared_decode`` pins: ``"off"`` (the per-warp mainloop) or a geometry name.
SHARED_PINS = ("off", *SHARED_GEOMETRIES)
#: Fewest routes per expert on average (``m·top_k/E``) at which both grouped GEMMs take the
#: shared decode. Chosen by measurement: docs/evidence/moe-shared-decode-routes.md
SHARED_MIN_ROUTES = 64
#: Fewest routes per expert at which the sm_90 tensor geometry (:data:`SHARED_TENSOR`) is
#: planned. Chosen by measurement: docs/evidence/moe-shared-decode-routes.md
TENSOR_MIN_ROUTES = 48
#: Shared memory per block the wide geometry may need: slots and fragment buffers within the
#: 48 KB, plus the K-slice fold (64 KB): a launch opts in past 48 KB, so the device must grant it.
SHARED_WIDE_SMEM = SMEM_LIMIT + fold_bytes(
    m_tiles=SHARED_WIDE.m_tiles, n_tiles=SHARED_WIDE.n_tiles, warps=SHARED_WIDE.warps,
    m_warps=SHARED_WIDE.m_warps,
)  # fmt: skip


#: Shared memory per block the tensor geometry needs at the largest rate (K8): slots, fragment
#: buffers and its fold (128 accumulators per thread, 128 KB).
SHARED_TENSOR_SMEM = shared_decode_layout(
    bits=8, m_tiles=SHARED_TENSOR.m_tiles, n_tiles=SHARED_TENSOR.n_tiles,
    warps=SHARED_TENSOR.warps, m_warps=SHARED_TENSOR.m_warps, rows=SHARED_TENSOR.slots[0],
    stages=SHARED_TENSOR.slots[1], fold=True,
).total  # fmt: skip


def _per_expert(c) -> str:
    return f"m·top_k/E = {c['m']}·{c['top_k']}/{c['num_experts']}"


def _mainloop_case(**changes: Any) -> dict:
    base = {"m": 4096, "top_k": 8, "num_experts": 128, "m_tiles": None, "shared_decode": None}
    base |= {"paired": False, "fc1_pair_odd": False, "fc1_n": 3072, "fc2_n": 5120}
    base |= {"max_shared_mem": 232448, "capability": (9, 0)}
    return {**base, **changes}


def _n_fits(c, geometry: SharedGeometry = SHARED_WIDE) -> bool:
    return all(c[f] % geometry.n_group == 0 for f in ("fc1_n", "fc2_n"))


def _capability(name: str, value: Any):
    if value is None:
        return None
    return check_capability(name, value)


MAINLOOP = DecisionTable.build(
    "moe_mainloop",
    "the grouped GEMMs' mainloop (per-warp decode or shared decode) and so the route block",
    (
        Field("m", positive_int, doc="planned tokens"),
        Field("top_k", positive_int),
        Field("num_experts", positive_int, doc="experts of the combined namespace"),
        Field(
            "m_tiles", int_choice(GROUPED_M_TILES, optional=True), None, "an explicit m_tiles pin"
        ),
        Field("shared_decode", str_choice(SHARED_PINS, optional=True), None, "an explicit pin"),
        Field("paired", check_bool, False, "a phase runs QSRT pairs"),
        Field(
            "fc1_pair_odd",
            check_bool,
            False,
            "FC1 runs a pair kind whose record rates sum to an odd number (P43)",
        ),
        Field("fc1_n", positive_int, doc="FC1's output columns per launch"),
        Field("fc2_n", positive_int, doc="FC2's output columns (hidden)"),
        Field(
            "max_shared_mem",
            optional(positive_int),
            None,
            "the device's opt-in shared memory per block (None: no device)",
        ),
        Field("capability", _capability, None, "(major, minor) of the device (None: no device)"),
    ),
    (
        (
            "pinned",
            "an explicit shared_decode pin wins ('off': the per-warp mainloop)",
            (
                Condition(
                    "shared_decode_pinned",
                    lambda c: c["shared_decode"] is not None,
                    lambda c: "shared_decode is not pinned",
                ),
            ),
            lambda c: SHARED_GEOMETRIES.get(c["shared_decode"]),
        ),
        (
            "pinned_m_tiles",
            "an explicit m_tiles fixes the per-warp route block",
            (
                Condition(
                    "m_tiles_pinned",
                    lambda c: c["m_tiles"] is not None,
                    lambda c: "m_tiles is not pinned",
                ),
            ),
            None,
        ),
        (
            "paired_odd",
            "an FC1 pair kind with an odd rate sum (P43) has no shared decode",
            (
                Condition("paired", lambda c: bool(c["paired"]), lambda c: "no phase is paired"),
                Condition(
                    "fc1_pair_odd",
                    lambda c: bool(c["fc1_pair_odd"]),
                    lambda c: "FC1's pair rate sum is even",
                ),
            ),
            None,
        ),
        (
            "n_not_128",
            "the shared geometry covers 128 columns per CTA in both GEMMs",
            (
                Condition(
                    "n%128!=0",
                    lambda c: not _n_fits(c),
                    lambda c: f"fc1_n={c['fc1_n']} and fc2_n={c['fc2_n']} are multiples of 128",
                ),
            ),
            None,
        ),
        (
            "tensor_core",
            "sm_90: 128 route slots x 256 columns per CTA, two warpgroups multiply with wgmma",
            (
                Condition(
                    "capability==9.0",
                    lambda c: c["capability"] == WGMMA_CAPABILITY,
                    lambda c: f"capability={c['capability']} has no wgmma",
                ),
                Condition(
                    "n%256==0",
                    lambda c: _n_fits(c, SHARED_TENSOR),
                    lambda c: f"fc1_n={c['fc1_n']} or fc2_n={c['fc2_n']} is not a multiple of 256",
                ),
                Condition(
                    "routes_per_expert>=48",
                    lambda c: c["m"] * c["top_k"] >= TENSOR_MIN_ROUTES * c["num_experts"],
                    lambda c: f"{_per_expert(c)} < {TENSOR_MIN_ROUTES}",
                ),
                Condition(
                    "smem_for_tensor",
                    lambda c: (c["max_shared_mem"] or 0) >= SHARED_TENSOR_SMEM,
                    lambda c: f"max_shared_mem={c['max_shared_mem']} < {SHARED_TENSOR_SMEM}",
                ),
            ),
            SHARED_TENSOR,
        ),
        (
            "paired",
            "the pair shared decode multiplies with wgmma only (sm_90, the tensor_core row)",
            (Condition("paired", lambda c: bool(c["paired"]), lambda c: "no phase is paired"),),
            None,
        ),
        (
            "few_routes",
            "fewer than 64 routes per expert on average: 128-slot blocks would be mostly padding",
            (
                Condition(
                    "routes_per_expert<64",
                    lambda c: c["m"] * c["top_k"] < SHARED_MIN_ROUTES * c["num_experts"],
                    lambda c: f"{_per_expert(c)} >= {SHARED_MIN_ROUTES}",
                ),
            ),
            None,
        ),
        (
            "no_room",
            "the device must grant the wide geometry's shared memory (fold included)",
            (
                Condition(
                    "smem_unknown_or_short",
                    lambda c: (c["max_shared_mem"] or 0) < SHARED_WIDE_SMEM,
                    lambda c: f"max_shared_mem={c['max_shared_mem']} >= {SHARED_WIDE_SMEM}",
                ),
            ),
            None,
        ),
        ("shared_wide", "128 route slots x 128 columns per CTA", (), SHARED_WIDE),
    ),
    (
        Boundary(
            "mainloop_min_routes",
            _mainloop_case(m=1024, capability=(8, 0)),
            "m",
            1023,
            1024,
            "few_routes",
            "shared_wide",
        ),
        Boundary(
            "mainloop_tensor_min_routes",
            _mainloop_case(m=768),
            "m",
            767,
            768,
            "few_routes",
            "tensor_core",
        ),
        Boundary(
            "mainloop_pin_off",
            _mainloop_case(),
            "shared_decode",
            None,
            "off",
            "tensor_core",
            "pinned",
        ),
        Boundary(
            "mainloop_pin_wide",
            _mainloop_case(m=1),
            "shared_decode",
            None,
            "wide",
            "few_routes",
            "pinned",
        ),
        Boundary(
            "mainloop_pin_tensor",
            _mainloop_case(m=1),
            "shared_decode",
            None,
            "tensor",
            "few_routes",
            "pinned",
        ),
        Boundary(
            "mainloop_m_tiles_pin",
            _mainloop_case(),
            "m_tiles",
            None,
            4,
            "tensor_core",
            "pinned_m_tiles",
        ),
        Boundary(
            "mainloop_paired_off_sm90",
            _mainloop_case(m=1024, capability=(8, 0)),
            "paired",
            False,
            True,
            "shared_wide",
            "paired",
        ),
        Boundary(
            "mainloop_paired_few_routes",
            _mainloop_case(m=768, paired=True),
            "m",
            768,
            767,
            "tensor_core",
            "paired",
        ),
        Boundary(
            "mainloop_paired_odd",
            _mainloop_case(paired=True),
            "fc1_pair_odd",
            False,
            True,
            "tensor_core",
            "paired_odd",
        ),
        Boundary(
            "mainloop_fc1_n", _mainloop_case(), "fc1_n", 3072, 3136, "tensor_core", "n_not_128"
        ),
        Boundary(
            "mainloop_fc2_n", _mainloop_case(), "fc2_n", 5120, 5184, "tensor_core", "n_not_128"
        ),
        Boundary(
            "mainloop_fc1_n_256",
            _mainloop_case(),
            "fc1_n",
            3072,
            3200,
            "tensor_core",
            "shared_wide",
        ),
        Boundary(
            "mainloop_by_experts",
            _mainloop_case(m=1024, capability=(8, 0)),
            "num_experts",
            128,
            129,
            "shared_wide",
            "few_routes",
        ),
        Boundary(
            "mainloop_tensor_by_experts",
            _mainloop_case(m=768),
            "num_experts",
            128,
            129,
            "tensor_core",
            "few_routes",
        ),
        Boundary(
            "mainloop_no_device",
            _mainloop_case(),
            "max_shared_mem",
            232448,
            None,
            "tensor_core",
            "no_room",
        ),
        Boundary(
            "mainloop_tensor_smem",
            _mainloop_case(),
            "max_shared_mem",
            229376,
            229375,
            "tensor_core",
            "shared_wide",
        ),
        Boundary(
            "mainloop_capability",
            _mainloop_case(),
            "capability",
            (9, 0),
            (8, 0),
            "tensor_core",
            "shared_wide",
        ),
        Boundary(
            "mainloop_capability_sm120",
            _mainloop_case(),
            "capability",
            (9, 0),
            (12, 0),
            "tensor_core",
            "shared_wide",
        ),
        Boundary(
            "mainloop_smem",
            _mainloop_case(capability=(8, 0)),
            "max_shared_mem",
            114688,
            114687,
            "shared_wide",
            "no_room",
        ),
    ),  # fmt: skip
)
