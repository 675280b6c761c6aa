"""plan / bind / run of the dense trellis linear (spec §3.2–3.3, §5.5; design §4; R4, R5, R15).

Layout
------
* :func:`plan_dense` (host only, may allocate nothing on the device) validates the problem, asks
  the dispatch table (:mod:`b12x.dense.dispatch`) for the path, picks or validates the tile
  through the ONE tile predicate (:mod:`b12x.dense.tiles`), fixes split-K exactly as the GEMM
  launcher will (``rows = ceil(K16/split)``, ``splits = ceil(K16/rows)``) and lists the buffers of
  that path as :class:`~b12x.runtime.scratch.BufferSpec` s. It returns a frozen :class:`DensePlan`.
* :func:`allocate_dense_buffers` is the plan-time allocator (outside capture only).
* :func:`bind_dense` takes the caller's buffers by name and only checks them (exact shape, dtype,
  device, contiguity, 16-byte alignment); it keeps them by identity (no copy, no view that would
  change ``data_ptr``). A missing or placeholder buffer raises naming it, e.g. "scratch `c_tmp`
  is not initialized for CUDA graph capture" while capturing.
* :func:`run_dense` validates the inputs against the plan, then launches the kernels of
  :mod:`b12x.kernels.host` into the bound buffers. It never allocates: every intermediate is a
  bound buffer, a row-prefix view of one (live ``M`` may be below the planned ``M``), or an
  in-place op (``copy_``, ``add_``).

Buffers per path (exact shapes; M, K, N from the plan)
------------------------------------------------------
=================  =================  ==========================================================
name               shape / dtype      when
=================  =================  ==========================================================
``output``         [M,N] x.dtype      always (the result)
``input_f16``      [M,K] fp16         x is bf16 (fp16 copy of x)
``rotated_f16``    [M,K] fp16         always (input-rotation result; the K6 kernel's ``A_had``)
``output_f16``     [M,N] fp16         x (= output) is bf16
``workspace``      [max(4·SMs+2, N/16)] int32, zeroed   K6 path only (the lock workspace)
``gemm_output``    [M,N] compute      generic and decode_matmul
``c_tmp``          [S,M,N] fp32       generic with S > 1 split-K slices
``rotated_compute`` [M,K] bf16        generic/decode_matmul with bf16 compute
``gemm_output_f16`` [M,N] fp16        generic/decode_matmul with bf16 compute
``weight_f16``     [K,N] fp16         decode_matmul (decoded Wq)
``weight_compute`` [K,N] bf16         decode_matmul with bf16 compute
=================  =================  ==========================================================

The K6 path uses no generic scratch (no ``gemm_output``, ``c_tmp``, ``rotated_compute``,
``gemm_output_f16``), so a consumer that provisions a one-element generic scratch can capture it.
Until a fused cooperative K6 kernel lands in :mod:`b12x.kernels`, the K6 path is composed from the
same launches with split-K off: input rotation into ``rotated_f16``, the GEMM straight into the
fp16 output buffer, and the output rotation in place there (each warp reads its 128-block before
writing it). The workspace is validated and reserved for that kernel's locks.

Invariants
----------
* Paths, tiles and split-K are decided once, in the plan; ``run`` reads them and never re-decides
  (plan fields equal launch fields, R15).
* Every run-time check happens before the first launch.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

import torch

from b12x.dense import dispatch as dense_dispatch
from b12x.dense import tiles as dense_tiles
from b12x.kernels import host as host_kernels
from b12x.kernels.specs import KernelSpec
from b12x.runtime import compile_cache
from b12x.runtime.scratch import (
    BufferSpec,
    allocate_buffers,
    check_known_names,
    live_rows,
    require_buffer,
)
from b12x.runtime.validate import (
    HALF_DTYPES,
    check_codebook_bits,
    check_dtype_choice,
    check_positive_int,
    check_tensor,
)

__all__ = [
    "BUFFER_NAMES",
    "BoundDense",
    "DenseOp",
    "DensePlan",
    "DenseProblem",
    "allocate_dense_buffers",
    "bind_dense",
    "device_limits",
    "plan_dense",
    "run_dense",
]

BUFFER_NAMES = (
    "output",
    "input_f16",
    "rotated_f16",
    "output_f16",
    "workspace",
    "gemm_output",
    "c_tmp",
    "rotated_compute",
    "gemm_output_f16",
    "weight_f16",
    "weight_compute",
)
K6_WARPS, K6_N_TILES = 4, 2  # the K6 stand-in's GEMM geometry (128-wide N tiles)
# (decode_matmul records the same geometry; it launches no trellis GEMM)


@dataclasses.dataclass(frozen=True)
class DenseProblem:
    m: int
    k: int
    n: int
    bits: int
    codebook: str
    x_dtype: torch.dtype
    compute_dtype: torch.dtype
    external_rotation: bool


@dataclasses.dataclass(frozen=True)
class DensePlan:
    """Everything ``run`` needs, decided once (module docstring)."""

    problem: DenseProblem
    device: dense_tiles.DeviceLimits
    path: str
    reasons: tuple[str, ...]
    tile: dense_tiles.Tile | None
    m_tiles: int
    n_tiles: int
    warps: int
    split_k: int
    buffers: tuple[BufferSpec, ...]

    @property
    def buffer_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.buffers)

    def buffer(self, name: str) -> BufferSpec:
        for spec in self.buffers:
            if spec.name == name:
                return spec
        raise KeyError(f"name: plan for path {self.path} has no buffer {name!r}")

    @property
    def kernel_specs(self) -> tuple[KernelSpec, ...]:
        """The kernel specialisations ``run`` launches (the warm-up set)."""
        p = self.problem
        bf16 = p.compute_dtype == torch.bfloat16
        specs: list[KernelSpec] = []
        if not p.external_rotation:
            specs.append(KernelSpec("rotate_in", in_bf16=False, out_bf16=False))
        if self.path == "decode_matmul":
            specs.append(KernelSpec("decode", p.codebook, p.bits))
        else:
            specs.append(
                KernelSpec(
                    "gemm",
                    p.codebook,
                    p.bits,
                    bf16=bf16,
                    m_tiles=self.m_tiles,
                    n_tiles=self.n_tiles,
                    warps=self.warps,
                    write_partials=self.split_k > 1,
                )
            )
            if self.split_k > 1:
                specs.append(KernelSpec("reduce", bf16=bf16))
        if not p.external_rotation:
            specs.append(KernelSpec("rotate_out", in_bf16=False, out_bf16=False))
        return tuple(specs)


def device_limits(device: Any = None) -> dense_tiles.DeviceLimits:
    """Facts of a CUDA device (default: the current one), or of a simulated device object."""
    if device is not None and not isinstance(device, torch.device | str | int):
        for attr in ("name", "sm_count", "max_shared_mem", "capability"):
            if not hasattr(device, attr):
                raise TypeError(f"device: simulated device lacks `{attr}`")
        return dense_tiles.DeviceLimits(
            device.name, device.sm_count, device.max_shared_mem, tuple(device.capability)
        )
    dev = torch.device("cuda") if device is None else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device: expected a CUDA device or a simulated device, got {dev}")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", None) or props.shared_memory_per_block
    return dense_tiles.DeviceLimits(
        props.name, props.multi_processor_count, int(smem), (props.major, props.minor)
    )


def _buffers(problem: DenseProblem, path: str, split_k: int, sm_count: int) -> tuple:
    m, k, n = problem.m, problem.k, problem.n
    f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
    x_bf16 = problem.x_dtype == bf16
    compute_bf16 = problem.compute_dtype == bf16
    specs = [BufferSpec("output", (m, n), problem.x_dtype, role="output")]
    if x_bf16:
        specs.append(BufferSpec("input_f16", (m, k), f16))
    specs.append(BufferSpec("rotated_f16", (m, k), f16))
    if x_bf16:
        specs.append(BufferSpec("output_f16", (m, n), f16))
    if path == "k6_mcg_small_m":
        length = max(4 * sm_count + 2, n // 16)
        specs.append(BufferSpec("workspace", (length,), torch.int32, zeroed=True))
        return tuple(specs)
    specs.append(BufferSpec("gemm_output", (m, n), problem.compute_dtype))
    if path == "generic" and split_k > 1:
        specs.append(BufferSpec("c_tmp", (split_k, m, n), f32))
    if compute_bf16:
        specs.append(BufferSpec("rotated_compute", (m, k), bf16))
        specs.append(BufferSpec("gemm_output_f16", (m, n), f16))
    if path == "decode_matmul":
        specs.append(BufferSpec("weight_f16", (k, n), f16))
        if compute_bf16:
            specs.append(BufferSpec("weight_compute", (k, n), bf16))
    return tuple(specs)


def _launched_splits(k: int, requested: int) -> int:
    rows = k // 16
    per_split = -(-rows // requested)
    return -(-rows // per_split)


def plan_dense(
    *,
    m: int,
    k: int,
    n: int,
    bits: int,
    codebook: str,
    x_dtype: torch.dtype,
    compute_dtype: torch.dtype = torch.float16,
    external_rotation: bool = False,
    tile: Any = None,
    split_k: int | None = None,
    device: Any = None,
) -> DensePlan:
    """Plan one dense trellis linear of ``M`` rows (the capacity); see the module docstring.

    ``tile`` pins the generic GEMM tile (a :class:`~b12x.dense.tiles.Tile` or its serialised
    ``[tile_k, tile_n, cta_threads]``); ``device`` is a CUDA device or a simulated one.
    """
    for name, value in (("m", m), ("k", k), ("n", n)):
        check_positive_int(name, value)
    codebook, bits = check_codebook_bits(codebook, bits)
    check_dtype_choice("x_dtype", x_dtype, HALF_DTYPES)
    check_dtype_choice("compute_dtype", compute_dtype, HALF_DTYPES)
    if not isinstance(external_rotation, bool):
        raise TypeError(f"external_rotation: expected bool, got {type(external_rotation).__name__}")
    if k % 128 or n % 128:
        raise ValueError(f"k/n: K={k} and N={n} must be multiples of 128 (H128 blocks)")
    if split_k is not None:
        check_positive_int("split_k", split_k)
    limits = device_limits(device)
    problem = DenseProblem(m, k, n, bits, codebook, x_dtype, compute_dtype, external_rotation)
    pinned = None
    if tile is not None:
        spec = dense_tiles.serialize(tile) if isinstance(tile, dense_tiles.Tile) else tile
        pinned = dense_tiles.deserialize(spec)
    case = {
        "capability": limits.capability,
        "m": m,
        "bits": bits,
        "codebook": codebook,
        "pair_kind": None,
        "compute_dtype": str(compute_dtype).removeprefix("torch."),
        "external_rotation": external_rotation,
        "explicit_tile": None if pinned is None else tuple(dense_tiles.serialize(pinned)),
    }
    choice = dense_dispatch.explain(case)
    m_tiles = host_kernels.choose_tiles(m)[0]
    chosen_tile = None
    if choice.path != "generic":  # K6: no split-K scratch; decode_matmul: no trellis GEMM
        if split_k is not None:
            raise ValueError(f"split_k: only the generic path splits K; this plan is {choice.path}")
        warps, n_tiles, splits = K6_WARPS, K6_N_TILES, 1
    else:
        tile_problem = dense_tiles.TileProblem("dense", m, k, n, bits)
        if pinned is not None:
            chosen_tile = dense_tiles.pin(pinned, tile_problem, limits)
        else:
            chosen_tile = dense_tiles.auto_select(tile_problem, limits)
        warps, n_tiles = dense_tiles.kernel_geometry(chosen_tile)
        requested = split_k or host_kernels.choose_split_k(
            m, k, n, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps, sm_count=limits.sm_count
        )
        splits = _launched_splits(k, requested)
    return DensePlan(
        problem=problem,
        device=limits,
        path=choice.path,
        reasons=choice.reasons,
        tile=chosen_tile,
        m_tiles=m_tiles,
        n_tiles=n_tiles,
        warps=warps,
        split_k=splits,
        buffers=_buffers(problem, choice.path, splits, limits.sm_count),
    )


def allocate_dense_buffers(plan: DensePlan, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Plan-time allocation of exactly the plan's buffers (never during capture)."""
    if not isinstance(plan, DensePlan):
        raise TypeError(f"plan: expected DensePlan, got {type(plan).__name__}")
    return allocate_buffers(plan.buffers, device)


@dataclasses.dataclass(frozen=True)
class BoundDense:
    """A plan and the caller's buffers (by identity); what :func:`run_dense` executes."""

    plan: DensePlan
    buffers: Mapping[str, torch.Tensor]
    device: torch.device


def bind_dense(plan: DensePlan, **buffers: torch.Tensor | None) -> BoundDense:
    """Check the caller's buffers against ``plan`` and keep them by identity (module docstring).

    Names the plan does not use but the op knows (e.g. a consumer's one-element ``c_tmp`` on
    the K6 path) are accepted and ignored; unknown names raise."""
    if not isinstance(plan, DensePlan):
        raise TypeError(f"plan: expected DensePlan, got {type(plan).__name__}")
    check_known_names(BUFFER_NAMES, buffers)
    output = buffers.get("output")
    device = output.device if isinstance(output, torch.Tensor) else None
    kept = {}
    for spec in plan.buffers:
        kept[spec.name] = require_buffer(spec, buffers.get(spec.name), device=device)
    return BoundDense(plan, types.MappingProxyType(kept), kept["output"].device)


def _resolve_callback(hadamard_128: Any) -> Any:
    fn = getattr(hadamard_128, "had_r_128", hadamard_128)
    if not callable(fn):
        raise TypeError("hadamard_128: expected a callable or an object with .had_r_128")
    return fn


def _check_inputs(bound: BoundDense, x, trellis, suh, svh, bias, hadamard_128) -> int:
    p = bound.plan.problem
    dev = bound.device
    check_tensor("x", x, dtypes=(p.x_dtype,), ndim=2, device=dev)
    live_m = x.shape[0]
    if x.shape[1] != p.k:
        raise ValueError(f"x: expected {p.k} features (planned K), got {x.shape[1]}")
    if not 1 <= live_m <= p.m:
        raise ValueError(f"x: live M={live_m} must be in [1, planned M={p.m}]")
    check_tensor(
        "trellis",
        trellis,
        dtypes=(torch.int16,),
        shape=(p.k // 16, p.n // 16, 16 * p.bits),
        device=dev,
    )
    check_tensor("suh", suh, dtypes=(torch.float16,), shape=(p.k,), device=dev)
    check_tensor("svh", svh, dtypes=(torch.float16,), shape=(p.n,), device=dev)
    if bias is not None:
        check_tensor("bias", bias, dtypes=(torch.float16,), shape=(p.n,), device=dev)
    if p.external_rotation and hadamard_128 is None:
        raise ValueError("hadamard_128: the plan expects an external H128 callback")
    if not p.external_rotation and hadamard_128 is not None:
        raise ValueError("hadamard_128: the plan was made without an external H128; re-plan")
    return live_m


def run_dense(
    bound: BoundDense,
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    hadamard_128: Any = None,
) -> torch.Tensor:
    """``y = ((x ⊙ suh)·H128)·Wq·H128 ⊙ svh (+ bias)`` into the bound ``output``; returns its
    ``[live M, N]`` row prefix. Never allocates (module docstring)."""
    if not isinstance(bound, BoundDense):
        raise TypeError(f"bound: expected BoundDense (from bind_dense), got {type(bound).__name__}")
    m = _check_inputs(bound, x, trellis, suh, svh, bias, hadamard_128)
    had = None if hadamard_128 is None else _resolve_callback(hadamard_128)
    plan, p, buf = bound.plan, bound.plan.problem, bound.buffers

    def rows(name: str) -> torch.Tensor:
        return live_rows(buf, name, m)

    output = rows("output")
    x16 = x
    if p.x_dtype == torch.bfloat16:
        x16 = rows("input_f16")
        x16.copy_(x)
    rotated = rows("rotated_f16")
    if had is None:
        host_kernels.rotate_input(x16, suh, out_dtype=torch.float16, out=rotated)
    else:
        had(x16, rotated, suh, None, 1.0)
    out16 = output if p.x_dtype == torch.float16 else rows("output_f16")

    if plan.path == "k6_mcg_small_m":
        host_kernels.trellis_matmul(
            rotated,
            trellis,
            p.codebook,
            split_k=1,
            out=out16,
            tiles=(plan.m_tiles, plan.n_tiles),
            warps=plan.warps,
        )
        host_kernels.rotate_output(out16, svh, out_dtype=torch.float16, out=out16)
    else:
        a = rotated
        if p.compute_dtype == torch.bfloat16:
            a = rows("rotated_compute")
            a.copy_(rotated)
        gemm = rows("gemm_output")
        if plan.path == "decode_matmul":
            weight = buf["weight_f16"]
            host_kernels.decode_weight(trellis, p.codebook, out=weight)
            if p.compute_dtype == torch.bfloat16:
                buf["weight_compute"].copy_(weight)
                weight = buf["weight_compute"]
            torch.mm(a, weight, out=gemm)
        else:
            host_kernels.trellis_matmul(
                a,
                trellis,
                p.codebook,
                split_k=plan.split_k,
                out=gemm,
                scratch=buf["c_tmp"] if plan.split_k > 1 else None,
                tiles=(plan.m_tiles, plan.n_tiles),
                warps=plan.warps,
            )
        gemm16 = gemm
        if p.compute_dtype == torch.bfloat16:
            gemm16 = rows("gemm_output_f16")
            gemm16.copy_(gemm)
        if had is None:
            host_kernels.rotate_output(gemm16, svh, out_dtype=torch.float16, out=out16)
        else:
            had(gemm16, out16, None, svh, 1.0)
    if bias is not None:
        out16.add_(bias)
    if out16 is not output:
        output.copy_(out16)
    return output


class DenseOp:
    """plan / bind / run over mappings: the op protocol of ``oracle.graph_protocol``.

    ``plan(problem)`` takes :func:`plan_dense`'s keywords as a mapping (the device is fixed at
    construction, a CUDA device or a simulated one); ``bind(plan, buffers)`` reads exactly the
    plan's buffer names from the consumer's mapping; ``run(bound, inputs)`` reads ``x``,
    ``trellis``, ``suh``, ``svh`` and an optional ``bias``. ``freeze()`` returns the
    :func:`~b12x.runtime.compile_cache.frozen` context; ``compile_unwarmed(plan)`` asks for a GEMM
    specialisation no run launches (it must raise once frozen or under capture).
    """

    name = "dense_trellis_linear"

    def __init__(self, device: Any = None) -> None:
        self.device = device

    def plan(self, problem: Mapping[str, Any]) -> DensePlan:
        if not isinstance(problem, Mapping):
            raise TypeError(f"problem: expected a mapping, got {type(problem).__name__}")
        return plan_dense(device=self.device, **problem)

    def bind(self, plan: DensePlan, buffers: Mapping[str, torch.Tensor]) -> BoundDense:
        return bind_dense(plan, **{name: buffers.get(name) for name in plan.buffer_names})

    def run(self, bound: BoundDense, inputs: Mapping[str, torch.Tensor]) -> None:
        run_dense(
            bound,
            inputs["x"],
            inputs["trellis"],
            inputs["suh"],
            inputs["svh"],
            bias=inputs.get("bias"),
        )

    def freeze(self) -> Any:
        return compile_cache.frozen()

    def compile_unwarmed(self, plan: DensePlan) -> None:
        major, minor = plan.device.capability
        p = plan.problem
        never_launched = KernelSpec("gemm", p.codebook, p.bits, unroll=2, depth=2)
        compile_cache.compiled_kernel(never_launched, f"sm_{major}{minor}")
