"""plan / bind / run of the dense trellis linear (spec §3.2–3.3, §5.5; R4, R5, R15).

Layout:
* Validation, one function per kind of argument, shared by every door (this module, the custom op
  of :mod:`b12x.ops.dense.custom_op` and its fake): :func:`check_dense_problem` (the scalar
  problem, metadata only), :func:`check_dense_inputs` (the tensors), :func:`payload_geometry` (K,
  N, bits of a payload), :func:`dense_problem_from_tensors` (the op's tensors → plan keywords).
* :func:`plan_dense` (host only) validates the problem and asks the dispatch, tile, mainloop
  and split-K tables (:mod:`b12x.ops.dense`) for the path, the tile, the
  :class:`~b12x.kernels.geometry.GemmGeometry` and the split (fixed as the launcher does it); a
  frozen :class:`DensePlan` holds them, its launch sequence and its buffer specs.
* :func:`allocate_dense_buffers` is the plan-time allocator (outside capture only).
* :func:`bind_dense` only checks the caller's buffers (exact shape, dtype, device, contiguity,
  16-byte alignment) and keeps them by identity; a missing or placeholder buffer raises naming
  it ("scratch `c_tmp` is not initialized for CUDA graph capture" while capturing).
* :func:`run_dense` validates the inputs against the plan, then walks the plan's launch sequence
  (:class:`DenseLaunches`: specs and the :class:`~b12x.launch.host.GemmStep` built at plan time)
  through :mod:`b12x.launch.host`: no second validation, no spec rebuilt, no allocation.

Buffers per path: ``output`` always; ``gemm_output`` (generic, decode_matmul), ``c_tmp`` (split
slices), fp16 / bf16 staging copies by compute dtype and external H128, ``weight_f16`` /
``weight_compute`` (decode_matmul), ``workspace`` (K6 only; the K6 path uses no generic scratch,
so a consumer with a one-element generic scratch can capture it). The exact table and the K6
path's composition: docs/notes/b12x.md.

Invariants: paths, tiles and split-K are decided once, in the plan; ``run`` reads them and never
re-decides (plan fields equal launch fields, R15); every run-time check precedes the first launch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from b12x.formats import DecodeFormat, resolve_format
from b12x.kernels.geometry import GemmGeometry
from b12x.launch import host as launchers
from b12x.launch.kinds import compiled
from b12x.launch.specs import KernelSpec
from b12x.ops.dense import dispatch as dense_dispatch
from b12x.ops.dense import mainloop as mainloop_table
from b12x.ops.dense import split_k as split_table
from b12x.ops.dense import tiles as dense_tiles
from b12x.runtime import compile_cache
from b12x.runtime.scratch import BoundBuffers, BufferSpec, OpBuffers, PlannedBuffers, live_rows
from b12x.runtime.validate import (
    HALF_DTYPES,
    check_bool,
    check_codebook_bits,
    check_dtype_choice,
    check_extent,
    check_positive_int,
    check_row_stride,
    check_tensor,
)

__all__ = [
    "BUFFER_NAMES",
    "BUFFERS",
    "BoundDense",
    "DenseLaunches",
    "DenseOp",
    "DensePlan",
    "DenseProblem",
    "allocate_dense_buffers",
    "bind_dense",
    "check_dense_inputs",
    "check_dense_problem",
    "dense_problem_from_tensors",
    "device_limits",
    "payload_geometry",
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
    "stream_k_partials",
    "stream_k_flags",
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
    #: The codebook's format, resolved once here from the validated name; every kernel spec
    #: built for this problem carries it (never the name).
    fmt: DecodeFormat = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "fmt", resolve_format(self.codebook, self.bits))


@dataclasses.dataclass(frozen=True)
class DenseLaunches:
    """The kernels :func:`run_dense` launches, built once by the plan (in launch order): the
    internal input rotation, the trellis GEMM (generic and K6 paths) or the decode
    (decode_matmul), and the internal output rotation writing ``x.dtype`` (no bias) or fp16 (a
    bias follows). ``None`` where the path or the external H128 launches no such kernel."""

    rotate_in: KernelSpec | None
    gemm: launchers.GemmStep | None
    decode: KernelSpec | None
    rotate_out: KernelSpec | None
    rotate_out_f16: KernelSpec | None

    @property
    def specs(self) -> tuple[KernelSpec, ...]:
        """Every spec, each once, in launch order (fp16 output rotation first)."""
        specs = [self.rotate_in, self.decode, *(self.gemm.specs if self.gemm else ())]
        specs += [self.rotate_out_f16, self.rotate_out]
        return tuple(dict.fromkeys(spec for spec in specs if spec is not None))


@dataclasses.dataclass(frozen=True)
class DensePlan(PlannedBuffers):
    """Everything ``run`` needs, decided once (module docstring)."""

    problem: DenseProblem
    device: dense_tiles.DeviceLimits
    path: str
    reasons: tuple[str, ...]
    tile: dense_tiles.Tile | None
    #: The GEMM's geometry (the K6 stand-in's, or decode_matmul's recorded one: it launches no
    #: trellis GEMM).
    geometry: GemmGeometry
    split_k: int
    buffers: tuple[BufferSpec, ...]
    launches: DenseLaunches
    split_reasons: tuple[str, ...] = ()  # the split-K table's explain (b12x.ops.dense.split_k)
    mainloop_reasons: tuple[str, ...] = ()

    @property
    def buffer_owner(self) -> str:
        return f"plan for path {self.path}"

    @property
    def kernel_specs(self) -> tuple[KernelSpec, ...]:
        """The kernel specialisations ``run`` launches (the warm-up set)."""
        return self.launches.specs


def _launches(problem: DenseProblem, path: str, step) -> DenseLaunches:
    """The plan's launch sequence (:class:`DenseLaunches`) for ``path`` and its GEMM step."""
    bf16 = problem.compute_dtype == torch.bfloat16
    x_bf16 = problem.x_dtype == torch.bfloat16
    internal = not problem.external_rotation
    rotate_in = rotate_out = rotate_out_f16 = None
    if internal:  # reads x, writes the GEMM's A in the compute dtype
        rotate_in = KernelSpec("rotate_in", in_bf16=x_bf16, out_bf16=bf16)
        # the K6 GEMM writes fp16; a bias add needs an fp16 result
        gemm_bf16 = bf16 and path != "k6_mcg_small_m"
        rotate_out = KernelSpec("rotate_out", in_bf16=gemm_bf16, out_bf16=x_bf16)
        rotate_out_f16 = KernelSpec("rotate_out", in_bf16=gemm_bf16, out_bf16=False)
    decode = None
    if path == "decode_matmul":
        decode = KernelSpec("decode", problem.fmt, problem.bits, out_bf16=bf16)
    return DenseLaunches(rotate_in, step, decode, rotate_out, rotate_out_f16)


def device_limits(device: Any = None) -> dense_tiles.DeviceLimits:
    """Facts of a CUDA device (default: the current one), or of a simulated device object
    (any object with ``name``, ``sm_count``, ``max_shared_mem`` and ``capability``, validated by
    :func:`b12x.ops.dense.tiles.check_device`). Anything else, a non-CUDA device (``cpu``,
    ``meta``),
    or a CUDA device on a machine without one raises ``TypeError``/``ValueError`` naming
    ``device``."""
    if device is not None and not isinstance(device, torch.device | str | int):
        for attr in ("name", "sm_count", "max_shared_mem", "capability"):
            if not hasattr(device, attr):
                raise TypeError(f"device: simulated device lacks `{attr}`")
        dense_tiles.check_device(device)
        return dense_tiles.DeviceLimits(
            device.name, device.sm_count, device.max_shared_mem, tuple(device.capability)
        )
    if isinstance(device, bool):
        raise TypeError("device: expected a CUDA device, an index or a simulated device, got bool")
    if isinstance(device, int) and device < 0:
        raise ValueError(f"device: expected a CUDA device index >= 0, got {device}")
    try:
        if device is None or isinstance(device, int):
            dev = torch.device("cuda", device)
        else:
            dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"device: not a device ({exc})") from None
    if dev.type != "cuda":
        raise ValueError(f"device: expected a CUDA device or a simulated device, got {dev}")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device: {dev} requested but no CUDA device is available; plan with a simulated "
            "device (name, sm_count, max_shared_mem, capability) instead"
        )
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ValueError(f"device: {dev} does not exist ({torch.cuda.device_count()} visible)")
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", None) or props.shared_memory_per_block
    return dense_tiles.DeviceLimits(
        props.name, props.multi_processor_count, int(smem), (props.major, props.minor)
    )


def _stream_k_buffers(problem: DenseProblem, spec: KernelSpec, sm_count: int) -> tuple:
    """The stream-K GEMM's scratch: one fp32 accumulator set per CTA and one flag per CTA
    (zeroed; every launch leaves it zero), for the CTAs the launch will run at the planned M
    (a live M below it runs no more CTAs)."""
    ctas = launchers.check_stream_k(spec, problem.m, problem.k, problem.n, sm_count)
    return (
        BufferSpec("stream_k_partials", (launchers.stream_k_partials(spec, ctas),), torch.float32),
        BufferSpec("stream_k_flags", (ctas,), torch.int32, zeroed=True),
    )


def _buffers(problem: DenseProblem, path: str, split_k: int, sm_count: int) -> tuple:
    m, k, n = problem.m, problem.k, problem.n
    f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
    x_bf16 = problem.x_dtype == bf16
    compute_bf16 = problem.compute_dtype == bf16
    external = problem.external_rotation
    specs = [BufferSpec("output", (m, n), problem.x_dtype, role="output")]
    if x_bf16 and external:  # the internal rotation reads bf16 x itself
        specs.append(BufferSpec("input_f16", (m, k), f16))
    if external or not compute_bf16:  # else the internal rotation writes rotated_compute
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
        if external:  # the internal output rotation reads the bf16 GEMM output itself
            specs.append(BufferSpec("gemm_output_f16", (m, n), f16))
    if path == "decode_matmul":  # the decoded Wq, in the compute dtype
        name = "weight_compute" if compute_bf16 else "weight_f16"
        specs.append(BufferSpec(name, (k, n), problem.compute_dtype))
    return tuple(specs)


def _launched_splits(k: int, requested: int) -> int:
    rows = k // 16
    per_split = -(-rows // requested)
    return -(-rows // per_split)


def check_dense_problem(
    *,
    m: int,
    k: int,
    n: int,
    bits: int,
    codebook: str,
    x_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    external_rotation: bool,
    tile: Any,
    split_k: int | None,
) -> tuple[str, int, dense_tiles.Tile | None]:
    """THE metadata-only validator of a dense problem (every :func:`plan_dense` keyword but the
    device); returns ``(codebook, bits, pinned tile or None)``.

    :func:`plan_dense` calls it first, and the custom op's fake implementation calls it (through
    :func:`dense_problem_from_tensors`) so tracing rejects exactly what planning rejects. One
    validator per argument kind: positive ints (``m``, ``k``, ``n``, ``split_k``), the kernel
    registry's (codebook, bits) legality, the fp16/bf16 dtype choices, a real ``bool`` for
    ``external_rotation``, and the tile registry's :func:`~b12x.ops.dense.tiles.parse_tile`.
    """
    for name, value in (("m", m), ("k", k), ("n", n)):
        check_extent(name, check_positive_int(name, value))
    codebook, bits = check_codebook_bits(codebook, bits)
    check_row_stride("n", n, bits)
    check_dtype_choice("x_dtype", x_dtype, HALF_DTYPES)
    check_dtype_choice("compute_dtype", compute_dtype, HALF_DTYPES)
    check_bool("external_rotation", external_rotation)
    if k % 128 or n % 128:
        raise ValueError(f"k/n: K={k} and N={n} must be multiples of 128 (H128 blocks)")
    if split_k is not None:
        check_positive_int("split_k", split_k)
    pinned = None
    if tile is not None:
        pinned = dense_tiles.parse_tile(tile)
    return codebook, bits, pinned


def payload_geometry(trellis: Any, *, device: Any = None) -> tuple[int, int, int]:
    """``(K, N, bits)`` of a layer payload ``int16[K/16, N/16, 16·bits]`` (metadata only)."""
    check_tensor("trellis", trellis, dtypes=(torch.int16,), ndim=3, device=device)
    words = int(trellis.shape[-1])  # static: the bitrate selects the compiled kernel
    if words == 0 or words % 16:
        raise ValueError(f"trellis: last dim must be 16·bits, got {words}")
    return trellis.shape[0] * 16, trellis.shape[1] * 16, words // 16


def check_dense_inputs(
    x: Any,
    trellis: Any,
    suh: Any,
    svh: Any,
    bias: Any,
    *,
    k: int,
    n: int,
    bits: int,
    x_dtype: torch.dtype,
    device: torch.device,
    max_m: int | None,
) -> int:
    """THE tensor validator of the dense linear (metadata only); returns the live M.

    ``x [M, K]`` in ``x_dtype`` with ``1 <= M <= max_m`` (``None``: any M ≥ 1),
    ``trellis int16 [K/16, N/16, 16·bits]``, ``suh fp16 [K]``, ``svh fp16 [N]``, optional
    ``bias fp16 [N]``; all contiguous, 16-byte aligned and on ``device``. :func:`run_dense`
    calls it with the plan's values, the custom op with the values read off the tensors.
    """
    check_tensor("x", x, dtypes=(x_dtype,), ndim=2, device=device)
    live_m = x.shape[0]
    if x.shape[1] != k:
        raise ValueError(f"x: expected {k} features (K), got {x.shape[1]}")
    if live_m < 1 or (max_m is not None and live_m > max_m):
        bound = "" if max_m is None else f", planned M={max_m}"
        raise ValueError(f"x: live M={live_m} must be in [1{bound}]")
    check_tensor(
        "trellis", trellis, dtypes=(torch.int16,), shape=(k // 16, n // 16, 16 * bits),
        device=device,
    )  # fmt: skip
    check_tensor("suh", suh, dtypes=(torch.float16,), shape=(k,), device=device)
    check_tensor("svh", svh, dtypes=(torch.float16,), shape=(n,), device=device)
    if bias is not None:
        check_tensor("bias", bias, dtypes=(torch.float16,), shape=(n,), device=device)
    return live_m


def dense_problem_from_tensors(
    x: Any,
    trellis: Any,
    suh: Any,
    svh: Any,
    *,
    codebook: Any,
    bias: Any = None,
    tile: Any = None,
    split_k: Any = None,
    compute_dtype: Any = torch.float16,
    external_rotation: Any = False,
) -> dict[str, Any]:
    """The :func:`plan_dense` keywords (less ``device``) of one call on these tensors.

    Metadata only: reads shapes/dtypes/devices (fake and meta tensors work), validates the
    tensors with :func:`check_dense_inputs` and the problem with :func:`check_dense_problem`.
    Used by the custom op (real and fake implementations) so the op validates exactly as the
    plan does."""
    check_tensor("x", x, dtypes=HALF_DTYPES, ndim=2)
    k, n, bits = payload_geometry(trellis, device=x.device)
    m = check_dense_inputs(
        x, trellis, suh, svh, bias, k=k, n=n, bits=bits, x_dtype=x.dtype, device=x.device,
        max_m=None,
    )  # fmt: skip
    problem = dict(
        m=m, k=k, n=n, bits=bits, codebook=codebook, x_dtype=x.dtype,
        compute_dtype=compute_dtype, external_rotation=external_rotation, tile=tile,
        split_k=split_k,
    )  # fmt: skip
    check_dense_problem(**problem)
    return problem


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

    ``tile`` pins the generic GEMM tile (a :class:`~b12x.ops.dense.tiles.Tile`, a registry name,
    or its serialised ``[tile_k, tile_n, cta_threads]``: :func:`~b12x.ops.dense.tiles.parse_tile`);
    ``device`` is a CUDA device or a simulated one.
    Validation: :func:`check_dense_problem`, then :func:`device_limits`. The path comes from the
    dispatch table (:mod:`b12x.ops.dense.dispatch`), the tile from the tile registry, the split-K
    request from the split-K table (:mod:`b12x.ops.dense.split_k`).
    """
    codebook, bits, pinned = check_dense_problem(
        m=m, k=k, n=n, bits=bits, codebook=codebook, x_dtype=x_dtype,
        compute_dtype=compute_dtype, external_rotation=external_rotation, tile=tile,
        split_k=split_k,
    )  # fmt: skip
    limits = device_limits(device)
    problem = DenseProblem(m, k, n, bits, codebook, x_dtype, compute_dtype, external_rotation)
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
    m_tiles = dense_tiles.choose_tiles(m)[0]
    chosen_tile = None
    if choice.path != "generic":  # K6: no split-K scratch; decode_matmul: no trellis GEMM
        if split_k is not None:
            raise ValueError(f"split_k: only the generic path splits K; this plan is {choice.path}")
        geometry = GemmGeometry(m_tiles=m_tiles, n_tiles=K6_N_TILES, warps=K6_WARPS)
    else:
        tile_problem = dense_tiles.TileProblem("dense", m, k, n, bits)
        if pinned is not None:
            chosen_tile = dense_tiles.pin(pinned, tile_problem, limits)
        else:
            chosen_tile = dense_tiles.auto_select(tile_problem, limits)
        geometry = dense_tiles.gemm_geometry(chosen_tile, m_tiles=m_tiles)
    loop = mainloop_table.explain(
        {
            "path": choice.path,
            "m": m,
            "n": n,
            "bits": bits,
            "pinned": pinned is not None,
            "capability": limits.capability,
            "wide_tile_cap": problem.fmt.wide_tile_cap,
        }
    )
    shared = loop.value  # a SharedDecode, or None: the per-warp decode
    if shared is not None:
        geometry = shared.geometry()
    split = split_table.explain(
        {
            "path": choice.path,
            "requested": split_k,
            "planned": None if shared is None else shared.split_k,
            "m": m,
            "k": k,
            "n": n,
            "m_tiles": geometry.cta_m // 16,
            "n_tiles": geometry.n_tiles,
            "warps": geometry.warps,
            "sm_count": limits.sm_count,
        }
    )
    splits = _launched_splits(k, split.split_k)
    # an explicit split-K request keeps the split (the stream-K schedule splits K itself)
    if geometry.stream_k and splits != 1:
        geometry = dataclasses.replace(geometry, stream_k=False)
    buffers = _buffers(problem, choice.path, splits, limits.sm_count)
    step = None
    if choice.path != "decode_matmul":
        step = launchers.gemm_step(
            problem.fmt, bits, geometry, k=k, bf16=compute_dtype == torch.bfloat16,
            split_k=1 if choice.path != "generic" else splits,
        )  # fmt: skip
        if geometry.stream_k:
            buffers += _stream_k_buffers(problem, step.spec, limits.sm_count)
    return DensePlan(
        problem=problem,
        device=limits,
        path=choice.path,
        reasons=choice.reasons,
        tile=chosen_tile,
        geometry=geometry,
        split_k=splits,
        buffers=buffers,
        launches=_launches(problem, choice.path, step),
        split_reasons=split.reasons,
        mainloop_reasons=loop.reasons,
    )


class BoundDense(BoundBuffers):
    """A plan and the caller's buffers (by identity); what :func:`run_dense` executes."""


#: The op's buffer contract (allocate and bind), declared once.
BUFFERS = OpBuffers(DensePlan, BoundDense, BUFFER_NAMES)


def allocate_dense_buffers(plan: DensePlan, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Plan-time allocation of exactly the plan's buffers (never during capture)."""
    return BUFFERS.allocate(plan, device)


def bind_dense(plan: DensePlan, **buffers: torch.Tensor | None) -> BoundDense:
    """Check the caller's buffers against ``plan`` and keep them by identity (module docstring).

    Names the plan does not use but the op knows (e.g. a consumer's one-element ``c_tmp`` on
    the K6 path) are accepted and ignored; unknown names raise."""
    return BUFFERS.bind(plan, buffers)


def _resolve_callback(hadamard_128: Any) -> Any:
    fn = getattr(hadamard_128, "had_r_128", hadamard_128)
    if not callable(fn):
        raise TypeError("hadamard_128: expected a callable or an object with .had_r_128")
    return fn


def _check_inputs(bound: BoundDense, x, trellis, suh, svh, bias, hadamard_128) -> int:
    p = bound.plan.problem
    live_m = check_dense_inputs(
        x, trellis, suh, svh, bias, k=p.k, n=p.n, bits=p.bits, x_dtype=p.x_dtype,
        device=bound.device, max_m=p.m,
    )  # fmt: skip
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
    bf16_compute = p.compute_dtype == torch.bfloat16
    # The GEMM's A operand. The internal rotation rounds a bf16 x to fp16 first (the input_f16
    # rounding point) and a bf16 operand from the fp16 rotation (the rotated_f16 ->
    # rotated_compute copy), so it writes the compute dtype directly.
    a = rows("rotated_compute") if bf16_compute else rows("rotated_f16")
    steps = plan.launches
    if had is None:
        launchers.launch_rotation(steps.rotate_in, x, suh, a)
    else:
        x16 = x
        if p.x_dtype == torch.bfloat16:
            x16 = rows("input_f16")
            x16.copy_(x)
        rotated = rows("rotated_f16")
        had(x16, rotated, suh, None, 1.0)
        if bf16_compute:
            a.copy_(rotated)
    # The internal output rotation writes x.dtype (a bf16 output is rounded from the fp16
    # value, the output_f16 -> output copy); the fp16 staging is kept for the bias add and the
    # external H128, both of which act on the fp16 output.
    direct = had is None and bias is None
    out16 = output if p.x_dtype == torch.float16 else rows("output_f16")
    final, rotate_out = (output, steps.rotate_out) if direct else (out16, steps.rotate_out_f16)

    if plan.path == "k6_mcg_small_m":
        launchers.launch_gemm(steps.gemm, a=a, payload=trellis, out=out16, scratch=None, flags=None)
        launchers.launch_rotation(rotate_out, out16, svh, final)
    else:
        gemm = rows("gemm_output")
        if plan.path == "decode_matmul":  # the decode writes the compute dtype (bf16 from fp16)
            weight = buf["weight_compute" if bf16_compute else "weight_f16"]
            launchers.launch_decode(steps.decode, trellis, weight)
            torch.mm(a, weight, out=gemm)
        else:
            launchers.launch_gemm(
                steps.gemm,
                a=a,
                payload=trellis,
                out=gemm,
                scratch=_gemm_scratch(plan, buf),
                flags=buf["stream_k_flags"] if plan.geometry.stream_k else None,
            )
        if had is None:  # a bf16 GEMM output is rounded to fp16 first (gemm_output_f16, §3.3)
            launchers.launch_rotation(rotate_out, gemm, svh, final)
        else:
            gemm16 = gemm
            if bf16_compute:
                gemm16 = rows("gemm_output_f16")
                gemm16.copy_(gemm)
            had(gemm16, out16, None, svh, 1.0)
    if bias is not None:
        out16.add_(bias)
    if final is not output:
        output.copy_(out16)
    return output


def _gemm_scratch(plan: DensePlan, buf) -> torch.Tensor | None:
    """The generic GEMM's fp32 scratch: split-K slices or the stream-K CTAs' partials."""
    if plan.geometry.stream_k:
        return buf["stream_k_partials"]
    return buf["c_tmp"] if plan.split_k > 1 else None


class DenseOp:
    """plan / bind / run over mappings: the op protocol of ``oracle.run.graph_protocol``.

    ``DenseOp(device=None, hadamard_128=None)``: ``device`` is fixed at construction (a CUDA
    device or a simulated one, e.g. an SM120 stand-in that plans the K6 row); ``hadamard_128``
    is an optional external H128 callback (the exllamav3 ``had_r_128`` contract, see
    :func:`run_dense`) handed to every run, so a consumer can drive the raw GEMM through the
    front door with an identity rotation. ``plan(problem)`` takes :func:`plan_dense`'s keywords
    as a mapping; ``external_rotation`` defaults to "a callback was given" and must agree with
    it. ``bind(plan, buffers)`` reads exactly the plan's buffer names from the consumer's
    mapping; ``run(bound, inputs)`` reads ``x``, ``trellis``, ``suh``, ``svh`` and an optional
    ``bias``. ``freeze()`` returns the :func:`~b12x.runtime.compile_cache.frozen` context;
    ``compile_unwarmed(plan)`` asks for a GEMM specialisation no run launches (it must raise once
    frozen or under capture).
    """

    name = "dense_trellis_linear"

    def __init__(self, device: Any = None, *, hadamard_128: Any = None) -> None:
        if hadamard_128 is not None:
            _resolve_callback(hadamard_128)
        self.device = device
        self.hadamard_128 = hadamard_128

    def plan(self, problem: Mapping[str, Any]) -> DensePlan:
        if not isinstance(problem, Mapping):
            raise TypeError(f"problem: expected a mapping, got {type(problem).__name__}")
        if "device" in problem:
            raise ValueError("problem: the device is fixed at DenseOp(device=...), not per plan")
        external = self.hadamard_128 is not None
        given = problem.get("external_rotation", external)
        if given is not external:
            raise ValueError(
                f"external_rotation: {given!r} disagrees with the op's hadamard_128 "
                f"({'given' if external else 'none'})"
            )
        return plan_dense(device=self.device, **{**problem, "external_rotation": external})

    def bind(self, plan: DensePlan, buffers: Mapping[str, torch.Tensor]) -> BoundDense:
        if not isinstance(buffers, Mapping):
            raise TypeError(f"buffers: expected a mapping, got {type(buffers).__name__}")
        BUFFERS.check_plan(plan)
        return bind_dense(plan, **{name: buffers.get(name) for name in plan.buffer_names})

    def run(self, bound: BoundDense, inputs: Mapping[str, torch.Tensor]) -> None:
        if not isinstance(inputs, Mapping):
            raise TypeError(f"inputs: expected a mapping, got {type(inputs).__name__}")
        missing = [name for name in ("x", "trellis", "suh", "svh") if name not in inputs]
        if missing:
            raise ValueError(f"inputs: missing {missing} (needs x, trellis, suh, svh, [bias])")
        run_dense(
            bound,
            inputs["x"],
            inputs["trellis"],
            inputs["suh"],
            inputs["svh"],
            bias=inputs.get("bias"),
            hadamard_128=self.hadamard_128,
        )

    def freeze(self) -> Any:
        return compile_cache.frozen()

    def compile_unwarmed(self, plan: DensePlan) -> None:
        if not isinstance(plan, DensePlan):
            raise TypeError(f"plan: expected DensePlan, got {type(plan).__name__}")
        major, minor = plan.device.capability
        p = plan.problem
        never_launched = KernelSpec("gemm", p.fmt, p.bits, geometry=GemmGeometry(unroll=2, depth=2))
        compiled(never_launched, f"sm_{major}{minor}")
