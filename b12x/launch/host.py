"""Host wrappers that launch the trellis kernels on torch CUDA tensors.

Layout
------
* :func:`decode_weight` — payload ``int16[K/16, N/16, 16b]`` → fp16 (or bf16) ``[K, N]``.
* :func:`gemm_step` builds a :class:`GemmStep` once (the GEMM spec of a
  :class:`~b12x.kernels.geometry.GemmGeometry`, its K split and the split-K reduce);
  :func:`launch_gemm`, :func:`launch_rotation` and :func:`launch_decode` launch prebuilt specs
  into checked buffers: the dense plan's launch sequence (:mod:`b12x.ops.dense.plan`).
* :func:`trellis_matmul` — a test and benchmark helper over the same step: already-rotated
  activations ``[M, K]`` (fp16/bf16) × decoded Wq → ``[M, N]`` in the activation dtype, with
  optional split-K over an fp32 scratch arena ``[S, M, N]`` reduced deterministically (the
  split is the caller's, default 1: choosing it is the plan's job).
* :func:`rotate_input` / :func:`rotate_output` — the two H128 rotations of §3.2;
  :func:`lut_tensor` — the per-device uint8 table a codebook reads through its LUT slot.

Invariants
----------
* Every wrapper validates dtype, shape, contiguity, 16-byte alignment and device *before* any
  launch and raises ``TypeError``/``ValueError`` naming the argument; the ``launch_*``
  functions validate nothing (their callers did).
* Caller-provided ``out`` / ``scratch`` buffers are used as given (no allocation); missing ones
  are allocated here (this module is not the capture-safe runtime; b12x/runtime owns that).
* Every kernel is resolved through :func:`_kernel`, i.e. :func:`b12x.launch.kinds.compiled`
  and the one runtime compile cache behind it: its structural key, its freeze switch and its
  capture check apply to every launch made here.
* Every launch binds its arguments by name in a launch record of :mod:`b12x.launch.records`
  (``fn(*GemmLaunch(a=..., ...).args())``): the positional order comes from the kernel's own
  ``__call__``, never from this module.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import torch

from b12x.formats import DecodeFormat, resolve_format
from b12x.launch import kinds
from b12x.launch.records import (
    DecodeLaunch,
    GemmLaunch,
    InputRotationLaunch,
    OutputRotationLaunch,
    ReduceLaunch,
    StreamKGemmLaunch,
)
from b12x.launch.specs import KernelSpec, gemm_spec

if TYPE_CHECKING:
    from b12x.kernels.geometry import GemmGeometry

__all__ = [
    "device_arch",
    "lut_tensor",
    "decode_weight",
    "trellis_matmul",
    "rotate_input",
    "rotate_output",
    "GemmStep",
    "check_stream_k",
    "gemm_step",
    "launch_decode",
    "launch_gemm",
    "launch_rotation",
    "stream_k_ctas",
    "stream_k_partials",
]

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def device_arch(device: torch.device) -> str:
    """``"sm_XY"`` of a CUDA device; ``ValueError`` naming ``device`` for anything else (a CPU or
    meta device, or no CUDA at all), before torch would fail less clearly."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device: the b12x kernels launch on CUDA tensors, got device {dev}")
    try:
        major, minor = torch.cuda.get_device_capability(dev)
    except (AssertionError, RuntimeError) as exc:  # no CUDA build / driver / such device
        raise ValueError(f"device: {dev} is not usable here ({exc})") from None
    return f"sm_{major}{minor}"


def _kernel(spec: KernelSpec, device: torch.device):
    """The compiled callable of ``spec`` for ``device``'s arch, from the runtime cache."""
    return kinds.compiled(spec, device_arch(device))


def lut_tensor(fmt: DecodeFormat, device: torch.device) -> torch.Tensor | None:
    """The codebook's table on ``device`` (None for table-free codebooks); cached per device."""
    if not fmt.reads_lut:
        return None
    return _lut_cached(fmt, str(torch.device(device)))


@functools.cache
def _lut_cached(fmt: DecodeFormat, device: str) -> torch.Tensor:
    data = torch.frombuffer(bytearray(fmt.lut()), dtype=torch.uint8)
    return data.to(device)


def _lut_addr(fmt: DecodeFormat, device: torch.device) -> int:
    table = lut_tensor(fmt, device)
    return 0 if table is None else table.data_ptr()


def _allocate(name: str, role: str, shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Allocate a buffer the caller did not pass, or raise while a CUDA graph is capturing.

    These wrappers are the eager convenience layer; graph-captured callers go through the
    plan / bind / run ops, which own every buffer. A missing buffer during capture is an error
    that names it, never a silent allocation from the capture pool.
    """
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{role} `{name}` is not initialized for CUDA graph capture")
    return torch.empty(shape, dtype=dtype, device=device)


def _check_tensor(name: str, t, *, dtypes, ndim: int | None = None, device=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype {want}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    if not t.is_cuda:
        raise ValueError(f"{name}: expected a CUDA tensor, got device {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    if t.data_ptr() % 16 != 0:
        raise ValueError(f"{name}: data pointer must be 16-byte aligned")


def _check_payload(trellis, codebook: str) -> tuple[DecodeFormat, int]:
    if not isinstance(trellis, torch.Tensor):
        raise TypeError(f"trellis: expected a torch.Tensor, got {type(trellis).__name__}")
    if trellis.dtype != torch.int16:
        raise TypeError(f"trellis: expected dtype torch.int16, got {trellis.dtype}")
    if trellis.dim() != 3 or trellis.shape[-1] % 16 != 0 or 0 in trellis.shape:
        raise ValueError(
            f"trellis: expected shape [K/16, N/16, 16·bits], got {tuple(trellis.shape)}"
        )
    bits = trellis.shape[-1] // 16
    fmt = resolve_format(codebook, bits)
    _check_tensor("trellis", trellis, dtypes=(torch.int16,), ndim=3)
    return fmt, bits


def decode_weight(trellis: torch.Tensor, codebook: str, *, out: torch.Tensor | None = None):
    """Decode a layer payload ``int16[K/16, N/16, 16b]`` to ``[K, N]`` on the GPU: fp16, or bf16
    when ``out`` is bf16 (each fp16 weight rounded to nearest even, as a bf16 GEMM takes it)."""
    fmt, bits = _check_payload(trellis, codebook)
    k, n = trellis.shape[0] * 16, trellis.shape[1] * 16
    if out is None:
        out = _allocate("out", "output", (k, n), torch.float16, trellis.device)
    _check_tensor("out", out, dtypes=_HALF_DTYPES, ndim=2, device=trellis.device)
    if tuple(out.shape) != (k, n):
        raise ValueError(f"out: expected shape {(k, n)}, got {tuple(out.shape)}")
    launch_decode(
        KernelSpec("decode", fmt, bits, out_bf16=out.dtype == torch.bfloat16), trellis, out
    )
    return out


def launch_decode(spec: KernelSpec, payload: torch.Tensor, out: torch.Tensor) -> None:
    """Launch the decode ``spec`` on checked buffers (no validation here)."""
    launch = DecodeLaunch(
        payload=payload.view(torch.int32),
        out=out.view(torch.int16),
        lut_addr=_lut_addr(spec.fmt, payload.device),
    )
    _kernel(spec, payload.device)(*launch.args())


@dataclasses.dataclass(frozen=True)
class GemmStep:
    """One trellis GEMM launch, built once (by a plan or :func:`trellis_matmul`): the GEMM spec,
    how it splits K (``splits`` slices of ``k_rows_per_split`` K16 rows; the ``reduce`` spec
    when ``splits > 1``). :func:`launch_gemm` walks it without validating anything again."""

    spec: KernelSpec
    splits: int
    k_rows_per_split: int
    reduce: KernelSpec | None

    @property
    def geometry(self) -> GemmGeometry:
        return self.spec.geometry

    @property
    def specs(self) -> tuple[KernelSpec, ...]:
        return (self.spec,) if self.reduce is None else (self.spec, self.reduce)


def gemm_step(
    fmt: DecodeFormat, bits: int, geometry: GemmGeometry, *, k: int, bf16: bool, split_k: int
) -> GemmStep:
    """The :class:`GemmStep` of a ``[M, K] x [K, N]`` GEMM with ``split_k`` requested slices
    (``rows = ceil(K16 / split_k)``, ``splits = ceil(K16 / rows)``; stream-K: one slice)."""
    k_rows = k // 16
    rows_per_split = -(-k_rows // split_k)
    splits = -(-k_rows // rows_per_split)
    if geometry.stream_k and splits != 1:
        raise ValueError(f"split_k: the stream-K schedule splits K itself, got {split_k}")
    spec = gemm_spec(fmt, bits, geometry, bf16=bf16, write_partials=splits > 1)
    reduce = KernelSpec("reduce", bf16=bf16) if splits > 1 else None
    return GemmStep(spec, splits, rows_per_split, reduce)


def launch_gemm(
    step: GemmStep,
    *,
    a: torch.Tensor,
    payload: torch.Tensor,
    out: torch.Tensor,
    scratch: torch.Tensor | None,
    flags: torch.Tensor | None,
) -> None:
    """Launch ``step`` on checked buffers (no validation here): ``a [M, K]`` and ``out [M, N]``
    in the compute dtype, the int16 ``payload``; ``scratch`` holds the split-K slices (at least
    ``splits·M·N`` fp32) or the stream-K partials, ``flags`` the stream-K hand-off flags (one per
    CTA slot; the launch runs at most ``flags.numel()`` CTAs)."""
    spec = step.spec
    m, n = out.shape
    lut = _lut_addr(spec.fmt, a.device)
    if spec.geometry.stream_k:
        ctas = stream_k_ctas(spec, m, a.shape[1], n, flags.numel())
        need = stream_k_partials(spec, ctas)
        launch = StreamKGemmLaunch(
            a=a.view(torch.int32),
            payload=payload.view(torch.int32),
            out=out.view(torch.int32),
            partials=scratch.view(-1)[:need].view(ctas, need // ctas),
            flags=flags[:ctas],
            lut_addr=lut,
            ctas=ctas,
        )
        _kernel(spec, a.device)(*launch.args())
        return
    if step.splits == 1:
        whole = GemmLaunch(
            a=a.view(torch.int32),
            payload=payload.view(torch.int32),
            out=out.view(torch.int32),
            lut_addr=lut,
            k_rows_per_split=step.k_rows_per_split,
            splits=1,
        )
        _kernel(spec, a.device)(*whole.args())
        return
    partials = scratch.view(-1)[: step.splits * m * n].view(step.splits, m, n)
    split = GemmLaunch(
        a=a.view(torch.int32),
        payload=payload.view(torch.int32),
        out=partials,
        lut_addr=lut,
        k_rows_per_split=step.k_rows_per_split,
        splits=step.splits,
    )
    _kernel(spec, a.device)(*split.args())
    reduce = ReduceLaunch(partials=partials, out=out.view(torch.int32))
    _kernel(step.reduce, a.device)(*reduce.args())


def trellis_matmul(
    a: torch.Tensor,
    trellis: torch.Tensor,
    codebook: str,
    geometry: GemmGeometry | None = None,
    *,
    split_k: int = 1,
    out: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
    flags: torch.Tensor | None = None,
    tiles: tuple[int, int] | None = None,
    **fields,
) -> torch.Tensor:
    """``a [M, K] @ decode(trellis) -> [M, N]`` in ``a.dtype``, fp32 accumulation: a test and
    benchmark helper over the plan's own path (:func:`gemm_step`, :func:`launch_gemm`).

    The GEMM runs ``geometry`` (a :class:`~b12x.kernels.geometry.GemmGeometry`), or one built
    from ``tiles=(m_tiles, n_tiles)`` and :class:`GemmGeometry`'s other fields as keywords
    (default :func:`~b12x.kernels.geometry.choose_tiles` of M and N, as before the geometry
    object; a ``wgmma`` geometry needs its tiles). ``split_k``
    K slices; stream-K: ``scratch`` holds the CTAs' fp32 partials and ``flags`` (int32, zero)
    their hand-off flags (default one per SM). Missing buffers are allocated. Everything is
    validated before the first launch; a geometry the kernel would refuse raises ``ValueError``
    naming the field first.
    """
    from b12x.kernels.geometry import GemmGeometry, choose_tiles  # pure Python, no cutlass

    if geometry is None:
        if tiles is None and (fields.get("swap_ab") is True or fields.get("wgmma") is True):
            mainloop = "swap-AB" if fields.get("swap_ab") is True else "wgmma"
            raise ValueError(
                f"tiles: the {mainloop} mainloop takes its (m_tiles, n_tiles) explicitly"
            )
        m, n = a.shape[0], trellis.shape[1] * 16
        m_tiles, n_tiles = tiles if tiles is not None else choose_tiles(m, n)
        geometry = GemmGeometry(m_tiles=m_tiles, n_tiles=n_tiles, **fields)
    elif tiles is not None or fields:
        raise ValueError("geometry: pass a GemmGeometry or its fields, not both")
    shaped = isinstance(trellis, torch.Tensor) and trellis.ndim == 3  # int16 [K/16, N/16, 16b]
    if shaped:
        geometry.check(bits=trellis.shape[-1] // 16)
    if geometry.stream_k and split_k != 1:
        raise ValueError(f"split_k: the stream-K schedule takes 1, got split_k={split_k!r}")
    if shaped and geometry.cluster > 1:  # the cluster's CTAs along N: before any device check
        ctas = trellis.shape[1] * 16 // geometry.cta_n
        if ctas % geometry.cluster:
            raise ValueError(
                f"cluster: N={trellis.shape[1] * 16} is {ctas} CTAs of {geometry.cta_n} columns, "
                f"not a multiple of the cluster of {geometry.cluster}"
            )
    if not isinstance(a, torch.Tensor) or a.dtype not in _HALF_DTYPES:
        got = a.dtype if isinstance(a, torch.Tensor) else type(a).__name__
        raise TypeError(f"a: expected dtype torch.float16 or torch.bfloat16, got {got}")
    fmt, bits = _check_payload(trellis, codebook)
    _check_tensor("a", a, dtypes=_HALF_DTYPES, ndim=2, device=trellis.device)
    m, k = a.shape
    n = trellis.shape[1] * 16
    if k != trellis.shape[0] * 16:
        raise ValueError(f"a: K={k} does not match trellis K={trellis.shape[0] * 16}")
    if m == 0:
        raise ValueError("a: M must be positive")
    if n % geometry.cta_n != 0:
        raise ValueError(
            f"trellis: N={n} must be a multiple of {geometry.cta_n} for this tile shape"
        )
    if isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1:
        raise ValueError(f"split_k: expected a positive int, got {split_k!r}")
    step = gemm_step(fmt, bits, geometry, k=k, bf16=a.dtype == torch.bfloat16, split_k=split_k)
    if out is None:
        out = _allocate("out", "output", (m, n), a.dtype, a.device)
    _check_tensor("out", out, dtypes=(a.dtype,), ndim=2, device=a.device)
    if tuple(out.shape) != (m, n):
        raise ValueError(f"out: expected shape {(m, n)}, got {tuple(out.shape)}")
    if geometry.stream_k:
        scratch, flags = _stream_k_buffers(step.spec, a, n, scratch, flags)
    elif step.splits > 1:
        need = step.splits * m * n
        if scratch is None:
            scratch = _allocate("scratch", "scratch", (need,), torch.float32, a.device)
        _check_tensor("scratch", scratch, dtypes=(torch.float32,), device=a.device)
        if scratch.numel() < need:
            raise ValueError(f"scratch: needs {need} fp32 elements, has {scratch.numel()}")
    launch_gemm(step, a=a, payload=trellis, out=out, scratch=scratch, flags=flags)
    return out


def _stream_k_layout(spec: KernelSpec):
    from b12x.kernels.shared_layout import shared_decode_layout, swap_ab_layout

    g = spec.geometry
    geometry = dict(
        bits=spec.bits, m_tiles=g.m_tiles, n_tiles=g.n_tiles, warps=g.warps, rows=g.shared_rows,
        stages=g.smem_stages,
    )  # fmt: skip
    if g.swap_ab:
        return swap_ab_layout(**geometry, cluster=g.cluster)
    return shared_decode_layout(**geometry, m_warps=g.m_warps)


def _stream_k_units(spec: KernelSpec, m: int, k: int, n: int) -> int:
    """Units of work of a stream-K launch: tiles (pair tiles with clusters) x units per tile
    (:mod:`b12x.kernels.stream_k_schedule`)."""
    from b12x.kernels.stream_k_schedule import stream_k_units

    lay = _stream_k_layout(spec)
    g = spec.geometry
    tiles = (n // (16 * lay.cta_tiles * g.cluster)) * -(-m // lay.cta_m)
    return tiles * stream_k_units(k // 16, lay.period * g.shared_rows)


def stream_k_ctas(spec: KernelSpec, m: int, k: int, n: int, sm_count: int) -> int:
    """CTAs of a stream-K launch: one per SM, in whole clusters, at most one cluster per unit of
    work (every cluster's range is then non-empty; :mod:`b12x.kernels.stream_k`)."""
    cluster = spec.geometry.cluster
    return cluster * min(sm_count // cluster, _stream_k_units(spec, m, k, n))


def stream_k_partials(spec: KernelSpec, ctas: int) -> int:
    """fp32 elements of a stream-K launch's partials: one accumulator set per CTA."""
    lay = _stream_k_layout(spec)
    g = spec.geometry
    return ctas * g.m_tiles * lay.mma_tiles * 8 * 32 * g.warps


def check_stream_k(spec: KernelSpec, m: int, k: int, n: int, slots: int) -> int:
    """The CTAs of a stream-K launch of ``slots`` CTA slots, or ``ValueError``: no whole cluster
    fits, or the problem overflows the kernel's 32-bit unit math."""
    cluster = spec.geometry.cluster
    units = _stream_k_units(spec, m, k, n)
    groups = min(slots // cluster, units)
    if groups == 0:
        raise ValueError(f"flags: {slots} flags hold no cluster of {cluster} CTAs")
    if groups * (units + 1) >= 2**31:  # the kernel's 32-bit unit math (group x units)
        raise ValueError(f"a: M={m}, K={k}, N={n} is too large for the stream-K schedule")
    return cluster * groups


def _stream_k_buffers(spec, a, n, scratch, flags):
    """The stream-K launch's partials and flags for :func:`trellis_matmul` (checked, or
    allocated: one CTA slot per SM of the device without ``flags``)."""
    m, k = a.shape
    if flags is None:  # one CTA per SM of the device
        slots = torch.cuda.get_device_properties(a.device).multi_processor_count
    else:  # the caller's flags: one per CTA it provisioned (a plan: per SM of its device)
        _check_tensor("flags", flags, dtypes=(torch.int32,), ndim=1, device=a.device)
        slots = flags.numel()
    ctas = check_stream_k(spec, m, k, n, slots)
    need = stream_k_partials(spec, ctas)
    if scratch is None:
        scratch = _allocate("scratch", "scratch", (need,), torch.float32, a.device)
    _check_tensor("scratch", scratch, dtypes=(torch.float32,), device=a.device)
    if scratch.numel() < need:
        raise ValueError(f"scratch: stream-K needs {need} fp32 elements, has {scratch.numel()}")
    if flags is None:
        flags = torch.zeros(ctas, dtype=torch.int32, device=a.device)
    return scratch, flags


def _rotate(kind: str, x: torch.Tensor, scale: torch.Tensor, out_dtype, name: str, out):
    _check_tensor(name, x, dtypes=_HALF_DTYPES, ndim=2)
    _check_tensor("scale", scale, dtypes=(torch.float16,), ndim=1, device=x.device)
    if x.shape[1] % 128 != 0:
        raise ValueError(f"{name}: feature dim must be a multiple of 128, got {x.shape[1]}")
    if scale.shape[0] != x.shape[1]:
        raise ValueError(f"scale: expected {x.shape[1]} entries, got {scale.shape[0]}")
    if out_dtype not in _HALF_DTYPES:
        raise TypeError(f"out_dtype: expected float16 or bfloat16, got {out_dtype}")
    if out is None:
        out = _allocate("out", "output", tuple(x.shape), out_dtype, x.device)
    _check_tensor("out", out, dtypes=(out_dtype,), ndim=2, device=x.device)
    if out.shape != x.shape:
        raise ValueError(f"out: expected shape {tuple(x.shape)}, got {tuple(out.shape)}")
    spec = KernelSpec(kind, in_bf16=x.dtype == torch.bfloat16, out_bf16=out_dtype == torch.bfloat16)
    launch_rotation(spec, x, scale, out)
    return out


def launch_rotation(spec: KernelSpec, x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor):
    """Launch the rotation ``spec`` (``rotate_in``: scale = ``suh``; ``rotate_out``: ``svh``) on
    checked buffers (no validation here)."""
    fn = _kernel(spec, x.device)
    x_words, scale_words, out_words = (t.view(torch.int32) for t in (x, scale, out))
    if spec.kind == "rotate_in":
        fn(*InputRotationLaunch(x=x_words, suh=scale_words, out=out_words).args())
    else:
        fn(*OutputRotationLaunch(y=x_words, svh=scale_words, out=out_words).args())


def rotate_input(x, suh, *, out_dtype=torch.float16, out=None):
    """``fp16(H128(fp16(fp16(x) · suh)))`` per 128-block, cast to ``out_dtype``."""
    return _rotate("rotate_in", x, suh, out_dtype, "x", out)


def rotate_output(y, svh, *, out_dtype=torch.float16, out=None):
    """``fp16(fp16(H128(y)) · svh)`` per 128-block, cast to ``out_dtype``."""
    return _rotate("rotate_out", y, svh, out_dtype, "y", out)
