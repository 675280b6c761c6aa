"""What b12x declares to the oracle: the typed op contract, and CPU compile reports.

Layout:
* **The contract** (``docs/oracle_contract.md`` §1; the oracle imports it directly):
  :class:`DeclaredVariant` (one supported variant of one op) and :class:`OpContract` (one op: its
  plan / bind / run / allocate entry points, its graph op, custom op, variants, dispatch tables,
  tile registry and observable buffers). :data:`OPS` (``decode``, ``dense``, ``moe``; built on
  first access, so importing this module stays light); :func:`op_contract` looks one up.
* **Variants are derived, never hand-listed**: every legal (codebook, bits) of :mod:`b12x.formats`,
  both compute dtypes; dense rotations ``"full"`` and ``"none"`` (an external identity H128
  callback: the raw GEMM) with the dispatch rows that can serve each (:func:`dense_paths`, asked of
  the dense dispatch table at its boundary M values and capabilities); MoE uniform (both w13
  layouts), tiers (:data:`b12x.ops.moe.tiers.TIER_BITS`, codebook
  :data:`b12x.ops.moe.tiers.TIER_CODEBOOK`) and QSRT pairs (each kind of
  :data:`b12x.kernels.moe_gemm.PAIR_KINDS` whose base and record rates are legal for the codebook;
  ``"dynamic"`` added for :data:`~b12x.kernels.moe_gemm.DYNAMIC_KINDS`).
* Deprecated views derived from :data:`OPS`: :func:`supported_variants`,
  :func:`supported_moe_variants`.
* :func:`kernel_specializations` lists every :class:`~b12x.launch.specs.KernelSpec` the host
  wrappers can launch; :func:`representative_specializations` a subset touching every kernel
  kind, codebook family, compute dtype and window geometry.
* :func:`compile_specialization` compiles one spec of any kernel kind (``KernelSpec``,
  ``MoeGemmSpec``, ...: :mod:`b12x.launch.kinds`) for one arch on the CPU with fake tensors and
  returns a :class:`CompileReport` (PTX, registers and spill bytes from ptxas's remarks).

Invariants:
* Compiling needs no GPU (the arch comes from ``--gpu-arch``); cutlass and the op modules are
  imported lazily.
* A variant of an op is in :data:`OPS` iff b12x runs it; the oracle skips nothing silently.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from b12x.formats import FORMATS
from b12x.kernels.geometry import GemmGeometry
from b12x.launch.specs import KernelSpec, compile_spec, gemm_spec, target_arch

__all__ = [
    "ARCHES",
    "GEMM_TILES",
    "OPS",  # noqa: F822 - built on first access by the module __getattr__
    "CompileReport",
    "DeclaredVariant",
    "OpContract",
    "compile_specialization",
    "dense_paths",
    "kernel_specializations",
    "op_contract",
    "representative_specializations",
    "supported_moe_variants",
    "supported_variants",
]

ARCHES = ("sm_80", "sm_90", "sm_120")
#: (m_tiles, n_tiles) per warp used by :func:`b12x.ops.dense.tiles.choose_tiles`.
GEMM_TILES = ((1, 4), (2, 4), (1, 2), (2, 2), (4, 2))
COMPUTE_DTYPES = ("float16", "bfloat16")
OP_NAMES = ("decode", "dense", "moe", "moe_gemm")
MOE_LAYOUTS = ("packed", "proj")


@dataclass(frozen=True)
class CompileReport:
    ptx: str
    registers: int | None
    spill_bytes: int | None
    log: str = ""


@dataclass(frozen=True)
class DeclaredVariant:
    """One variant b12x runs, of one op (``docs/oracle_contract.md`` §1).

    ``bits`` is the uniform rate; for QSRT pairs the base 3 (records in ``pair_kind``), for
    tiers tier 0's rate (both in ``tier_bits``). ``rotation``: decode ``"none"``; dense
    ``"full"`` (internal H128 on both sides) or ``"none"`` (an external identity H128 callback,
    i.e. the raw GEMM); moe ``"full"``. ``pair_modes`` is ``("static",)`` or ``("static",
    "dynamic")`` (P33/P24 also run from a per-expert mode table). ``layouts`` are the MoE w13
    layouts it accepts; ``paths`` the dispatch rows that can serve it (empty for ops without a
    dispatch table: decode, and moe until its table lands).
    """

    op: str
    codebook: str
    bits: int
    compute_dtype: Any  # torch.float16 | torch.bfloat16
    rotation: str
    pair_kind: str | None = None
    pair_modes: tuple[str, ...] = ()
    tier_bits: tuple[int, int] | None = None
    layouts: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class OpContract:
    """One op as the oracle drives it (``docs/oracle_contract.md`` §1).

    ``plan`` (keyword-only problem → frozen plan), ``bind(plan, **buffers)`` (views of caller
    buffers), ``run(bound, ...)`` (output view; never allocates), ``allocate(plan, device)``
    (plan time only), ``graph_op(device=None, **options)`` (an object with ``plan(problem)`` /
    ``bind(plan, buffers)`` / ``run(bound, inputs)`` / ``freeze()`` / ``compile_unwarmed(plan)``),
    ``custom_op`` (``"ns::name"`` or ``None``), ``variants``, ``dispatch`` (a tuple of tables in
    ``oracle.judge.dispatch``'s protocol), ``tiles`` (a registry in ``oracle.judge.tiles``'
    protocol, or ``None``) and ``observables`` (plan buffer name → judge stage name).
    """

    name: str
    plan: Callable[..., Any]
    bind: Callable[..., Any]
    run: Callable[..., Any]
    allocate: Callable[..., dict]
    graph_op: Callable[..., Any]
    custom_op: str | None
    variants: tuple[DeclaredVariant, ...]
    dispatch: tuple[Any, ...]
    tiles: Any | None
    observables: Mapping[str, str]


def _legal() -> list[tuple[str, int]]:
    return [(name, bits) for name, fmt in FORMATS.items() for bits in fmt.legal_bits]


def _dtypes() -> tuple[Any, ...]:
    import torch

    return (torch.float16, torch.bfloat16)


@functools.cache
def dense_paths(codebook: str, bits: int, compute_dtype: Any, rotation: str) -> tuple[str, ...]:
    """The dense dispatch rows that serve a variant: :func:`b12x.ops.dense.dispatch.explain` over
    every capability and M the table's boundaries name (both sides), in table order."""
    from b12x.ops.dense import dispatch

    points = [dispatch.DEFAULT_CASE, *(side for b in dispatch.BOUNDARIES for side in (
        {**b.base, b.field: b.below}, {**b.base, b.field: b.above}))]  # fmt: skip
    caps = sorted({tuple(p["capability"]) for p in points})
    ms = sorted({p["m"] for p in points})
    seen = set()
    for cap in caps:
        for m in ms:
            case = {
                "capability": cap,
                "m": m,
                "bits": bits,
                "codebook": codebook,
                "compute_dtype": compute_dtype,
                "external_rotation": rotation == "none",
            }
            seen.add(dispatch.explain(case).path)
    return tuple(name for name in dispatch.PATH_NAMES if name in seen)


def _decode_variants() -> tuple[DeclaredVariant, ...]:
    return tuple(
        DeclaredVariant("decode", codebook, bits, dtype, "none")
        for codebook, bits in _legal()
        for dtype in _dtypes()
    )


def _dense_variants() -> tuple[DeclaredVariant, ...]:
    return tuple(
        DeclaredVariant(
            "dense",
            codebook,
            bits,
            dtype,
            rotation,
            paths=dense_paths(codebook, bits, dtype, rotation),
        )  # fmt: skip
        for codebook, bits in _legal()
        for dtype in _dtypes()
        for rotation in ("full", "none")
    )


def _moe_variants() -> tuple[DeclaredVariant, ...]:
    from b12x.kernels.moe_gemm import DYNAMIC, DYNAMIC_KINDS, PAIR_KINDS
    from b12x.ops.moe.pairs import PAIR_BASE_BITS
    from b12x.ops.moe.tiers import TIER_BITS, TIER_CODEBOOK

    out = [
        DeclaredVariant("moe", codebook, bits, dtype, "full", layouts=MOE_LAYOUTS)
        for codebook, bits in _legal()
        for dtype in _dtypes()
    ]
    out += [
        DeclaredVariant(
            "moe",
            TIER_CODEBOOK,
            TIER_BITS[0],
            dtype,
            "full",
            tier_bits=TIER_BITS,
            layouts=MOE_LAYOUTS,
        )  # fmt: skip
        for dtype in _dtypes()
    ]
    for codebook, fmt in FORMATS.items():
        for kind, rates in PAIR_KINDS.items():
            if not {PAIR_BASE_BITS, *rates} <= set(fmt.legal_bits):
                continue
            modes = ("static", DYNAMIC) if kind in DYNAMIC_KINDS else ("static",)
            out += [
                DeclaredVariant(
                    "moe",
                    codebook,
                    PAIR_BASE_BITS,
                    dtype,
                    "full",
                    pair_kind=kind,
                    pair_modes=modes,
                    layouts=MOE_LAYOUTS,
                )  # fmt: skip
                for dtype in _dtypes()
            ]
    return tuple(out)


def _moe_gemm_variants() -> tuple[DeclaredVariant, ...]:
    """The grouped GEMM alone (``moe_gemm``): every uniform rate and every pair the fused MoE
    declares, without rotations (the caller's activations go straight in). The oracle judges it
    through decode cases (one-hot rows reproduce the weight bit for bit), not as a grid op."""
    return tuple(
        dataclasses.replace(v, op="moe_gemm", rotation="none", layouts=())
        for v in _moe_variants()
        if v.tier_bits is None
    )


def _build_ops() -> tuple[OpContract, ...]:
    import types

    import b12x.ops.dense.custom_op  # noqa: F401 - registers b12x::trellis_dense_linear
    from b12x.ops.decode import plan as decode
    from b12x.ops.dense import dispatch as dense_dispatch
    from b12x.ops.dense import mainloop as dense_mainloop
    from b12x.ops.dense import plan as dense
    from b12x.ops.dense import split_k as dense_split_k
    from b12x.ops.dense import tiles as dense_tiles
    from b12x.ops.moe import custom_op as moe_ops
    from b12x.ops.moe import dispatch as moe_dispatch
    from b12x.ops.moe import gemm_op as moe_gemm
    from b12x.ops.moe import plan as moe_plan
    from b12x.ops.moe import run as moe_run

    frozen = types.MappingProxyType
    decode_op = OpContract(
        name="decode",
        plan=decode.plan_decode,
        bind=decode.bind_decode,
        run=decode.run_decode,
        allocate=decode.allocate_decode_buffers,
        graph_op=decode.DecodeOp,
        custom_op=None,
        variants=_decode_variants(),
        dispatch=(),
        tiles=None,
        observables=frozen({}),
    )
    dense_op = OpContract(
        name="dense",
        plan=dense.plan_dense,
        bind=dense.bind_dense,
        run=dense.run_dense,
        allocate=dense.allocate_dense_buffers,
        graph_op=dense.DenseOp,
        custom_op=b12x.ops.dense.custom_op.OP_NAME,
        variants=_dense_variants(),
        dispatch=(dense_dispatch.TABLE, dense_split_k.TABLE, dense_mainloop.TABLE),
        tiles=dense_tiles.REGISTRY,
        observables=frozen({"rotated_f16": "rotated", "gemm_output": "gemm"}),
    )
    moe_op = OpContract(
        name="moe",
        plan=moe_plan.plan_moe,  # tiers: b12x.ops.moe.tiers.plan_tiered_moe (graph op: tier0_bits)
        bind=moe_plan.bind_moe,
        run=moe_run.run_moe,
        allocate=moe_plan.allocate_moe_buffers,
        graph_op=moe_ops.MoeOp,
        custom_op=moe_ops.OP_NAME,
        variants=_moe_variants(),
        dispatch=moe_dispatch.TABLES,
        tiles=None,
        observables=frozen(
            {
                "rotation_gate": "rotated_gate",
                "rotation_up": "rotated_up",
                "fc1": "fc1",
                "activated": "activated",
                "fc2": "fc2",
            }
        ),
    )
    moe_gemm_op = OpContract(
        name="moe_gemm",
        plan=moe_gemm.plan_moe_gemm,
        bind=moe_gemm.bind_moe_gemm,
        run=moe_gemm.run_moe_gemm,
        allocate=moe_gemm.allocate_moe_gemm_buffers,
        graph_op=moe_gemm.MoeGemmOp,
        custom_op=None,
        variants=_moe_gemm_variants(),
        dispatch=moe_dispatch.TABLES,
        tiles=None,
        observables=frozen(dict(moe_gemm.OBSERVABLES)),
    )
    return (decode_op, dense_op, moe_op, moe_gemm_op)


@functools.cache
def _ops() -> tuple[OpContract, ...]:
    ops = _build_ops()
    assert tuple(op.name for op in ops) == OP_NAMES, "OP_NAMES and _build_ops disagree"
    return ops


def __getattr__(name: str) -> Any:
    if name == "OPS":  # built on first access (module docstring)
        return _ops()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def op_contract(name: str) -> OpContract:
    """The :class:`OpContract` named ``name``; ``ValueError`` naming the known ops."""
    if not isinstance(name, str) or name not in OP_NAMES:
        raise ValueError(f"name: unknown op {name!r}; known ops: {OP_NAMES}")
    return next(op for op in _ops() if op.name == name)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def supported_variants() -> list[dict]:
    """Deprecated: read :data:`OPS` (``op_contract("decode"/"dense").variants``).

    The old view, derived from :data:`OPS`: ``{"op", "codebook", "bits", "compute_dtype"}`` dicts
    for the decode kernel (fp16 output: the ``decode`` op's fp16 variants) and the dense linear
    (``"op": "dense_linear"``, one entry per (codebook, bits, dtype) whatever the rotation)."""
    out: dict[tuple, dict] = {}
    for v in op_contract("decode").variants:
        if _dtype_name(v.compute_dtype) == "float16":
            entry = {"op": "decode", "codebook": v.codebook, "bits": v.bits,
                     "compute_dtype": "float16"}  # fmt: skip
            out.setdefault(tuple(entry.values()), entry)
    for v in op_contract("dense").variants:
        entry = {"op": "dense_linear", "codebook": v.codebook, "bits": v.bits,
                 "compute_dtype": _dtype_name(v.compute_dtype)}  # fmt: skip
        out.setdefault(tuple(entry.values()), entry)
    return list(out.values())


def supported_moe_variants() -> list[dict]:
    """Deprecated: read :data:`OPS` (``op_contract("moe").variants``).

    The old view, derived from :data:`OPS`: per layout and compute dtype, uniform entries
    ``{"op": "moe", "codebook", "bits", "w13_layout", "compute_dtype"}``, tiers
    (``"op": "moe_tiers"``, ``"bits": (3, 4)``) and pairs (``"pair_kind"``, ``"phases":
    ("fc1", "fc2")``, ``"bits"`` the base 3)."""
    out = []
    for v in op_contract("moe").variants:
        for layout in v.layouts:
            entry: dict[str, Any] = {"op": "moe", "codebook": v.codebook, "bits": v.bits}
            if v.tier_bits is not None:
                entry.update(op="moe_tiers", bits=v.tier_bits)
            if v.pair_kind is not None:
                entry.update(pair_kind=v.pair_kind, phases=("fc1", "fc2"))
            entry.update(w13_layout=layout, compute_dtype=_dtype_name(v.compute_dtype))
            out.append(entry)
    return out


def kernel_specializations() -> list[KernelSpec]:
    specs = []
    for fmt in FORMATS.values():
        for bits in fmt.legal_bits:
            for bf16 in (False, True):
                specs.append(KernelSpec("decode", fmt, bits, out_bf16=bf16))
                for m_tiles, n_tiles in GEMM_TILES:
                    for partials in (False, True):
                        geometry = GemmGeometry(m_tiles=m_tiles, n_tiles=n_tiles)
                        specs.append(
                            gemm_spec(fmt, bits, geometry, bf16=bf16, write_partials=partials)
                        )
    for bf16 in (False, True):
        specs.append(KernelSpec("reduce", bf16=bf16))
    for kind in ("rotate_in", "rotate_out"):
        for in_bf16 in (False, True):
            for out_bf16 in (False, True):
                specs.append(KernelSpec(kind, in_bf16=in_bf16, out_bf16=out_bf16))
    return specs


def representative_specializations() -> list[KernelSpec]:
    """Every kernel kind and decoder family, both dtypes, 2- and 3-word lane geometries."""
    return [
        KernelSpec("decode", "sqg_e4m3", 3),
        KernelSpec("decode", "sqg_fp16", 6),
        gemm_spec("mcg", 4, GemmGeometry(m_tiles=1, n_tiles=4)),
        gemm_spec("mcg", 6, GemmGeometry(m_tiles=4, n_tiles=2), bf16=True, write_partials=True),
        gemm_spec("sqg_e4m3", 2, GemmGeometry(m_tiles=2, n_tiles=4), write_partials=True),
        gemm_spec("sqg_fp16", 5, GemmGeometry(m_tiles=1, n_tiles=4), bf16=True),
        gemm_spec("mul1", 8, GemmGeometry(m_tiles=1, n_tiles=4)),
        gemm_spec("3inst", 3, GemmGeometry(m_tiles=1, n_tiles=2), write_partials=True),
        KernelSpec("reduce", bf16=True),
        KernelSpec("rotate_in", in_bf16=True, out_bf16=True),
        KernelSpec("rotate_out", in_bf16=False, out_bf16=False),
    ]


def compile_specialization(spec: Any, arch: str) -> CompileReport:
    """Compile ``spec`` for ``arch`` on the CPU; report PTX, registers and spill bytes.

    ``spec`` is any spec of the kernel-kind registry (:func:`b12x.launch.kinds.kind_of`): a
    dense :class:`KernelSpec` (its first spill-free level, as launches compile it), a grouped-GEMM
    ``MoeGemmSpec`` or a ``MoeBoundarySpec`` (the kind's compile level: spill-free kinds at their
    first spill-free level, the others at the default level their launches use)."""
    from b12x.launch.kinds import kind_of
    from b12x.launch.toolchain import compile_spill_free, compile_with_remarks

    kind = kind_of(spec)  # TypeError naming `spec` for a type no kind takes
    if not isinstance(arch, str) or not re.fullmatch(r"sm_\d+a?", arch):
        raise ValueError(f"arch: expected something like 'sm_90', got {arch!r}")
    target = target_arch(spec, arch)  # sm_90a for a wgmma spec
    if isinstance(spec, KernelSpec):
        result = compile_spec(spec, arch, ptx=True)
    elif kind.spill_free:
        result = compile_spill_free(functools.partial(kind.build, spec), target, ptx=True)
    else:
        remarks = compile_with_remarks(*kind.build(spec), target, ptx=True)
        return CompileReport(
            ptx=remarks.ptx,
            registers=max(remarks.registers) if remarks.registers else None,
            spill_bytes=sum(remarks.spills) if remarks.spills else None,
            log=remarks.log,
        )
    return CompileReport(
        ptx=result.fn.artifacts.PTX or "",
        registers=result.registers,
        spill_bytes=result.spill_bytes,
        log=result.log,
    )
