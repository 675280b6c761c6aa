"""Host wrappers that launch the trellis kernels on torch CUDA tensors.

Layout
------
* :func:`decode_weight` — payload ``int16[K/16, N/16, 16b]`` → fp16 (or bf16) ``[K, N]``.
* :func:`trellis_matmul` — already-rotated activations ``[M, K]`` (fp16/bf16) × decoded Wq →
  ``[M, N]`` in the activation dtype, with optional split-K over an fp32 scratch arena
  ``[S, M, N]`` reduced deterministically. The split is the caller's (default 1): the split-K
  rule is the plan's decision (:func:`b12x.ops.dense.split_k.split_k`), not a launcher's.
* :func:`rotate_input` / :func:`rotate_output` — the two H128 rotations of §3.2.
* :func:`lut_tensor` — the per-device uint8 table a codebook reads through its LUT slot.

Invariants
----------
* Every wrapper validates dtype, shape, contiguity, 16-byte alignment and device *before* any
  launch and raises ``TypeError``/``ValueError`` naming the argument.
* Caller-provided ``out`` / ``scratch`` buffers are used as given (no allocation); missing ones
  are allocated here (this module is not the capture-safe runtime; b12x/runtime owns that).
* Every kernel is resolved through :func:`_kernel`, i.e. :func:`b12x.launch.kinds.compiled`
  and the one runtime compile cache behind it: its structural key, its freeze switch and its
  capture check apply to every launch made here.
* This module imports nothing of :mod:`b12x.ops` (a layer contract in ``pyproject.toml``).
* Every launch binds its arguments by name in a launch record of :mod:`b12x.launch.records`
  (``fn(*GemmLaunch(a=..., ...).args())``): the positional order comes from the kernel's own
  ``__call__``, never from this module.
"""

from __future__ import annotations

import dataclasses
import functools

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
from b12x.launch.specs import KernelSpec

__all__ = [
    "device_arch",
    "lut_tensor",
    "decode_weight",
    "trellis_matmul",
    "rotate_input",
    "rotate_output",
    "choose_tiles",
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
    spec = KernelSpec("decode", fmt, bits, out_bf16=out.dtype == torch.bfloat16)
    fn = _kernel(spec, trellis.device)
    launch = DecodeLaunch(
        payload=trellis.view(torch.int32),
        out=out.view(torch.int16),
        lut_addr=_lut_addr(fmt, trellis.device),
    )
    fn(*launch.args())
    return out


def choose_tiles(m: int, n: int | None = None) -> tuple[int, int]:
    """(m_tiles, n_tiles) per warp. H200 sweep: 4 N16 tiles per warp is fastest when N allows;
    4 M16 blocks pair with 2 N16 tiles (4×4 exceeds 255 registers for sqg_fp16). Without ``n``
    the N-agnostic 2 is returned (valid for any N % 128 == 0)."""
    m_tiles = 1 if m <= 16 else 2 if m <= 32 else 4
    n_tiles = 4 if n is not None and n % 256 == 0 and m_tiles < 4 else 2
    return m_tiles, n_tiles


def trellis_matmul(
    a: torch.Tensor,
    trellis: torch.Tensor,
    codebook: str,
    *,
    split_k: int = 1,
    out: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
    tiles: tuple[int, int] | None = None,
    warps: int = 4,
    unroll: int = 1,
    depth: int = 1,
    smem_stages: int = 0,
    m_warps: int = 0,
    shared_rows: int = 2,
    wgmma: bool = False,
    swap_ab: bool = False,
    cluster: int = 1,
    stream_k: bool = False,
    flags: torch.Tensor | None = None,
) -> torch.Tensor:
    """``a [M, K] @ decode(trellis) -> [M, N]`` in ``a.dtype`` (fp16/bf16), fp32 accumulation.

    ``split_k`` K slices (default 1; :func:`b12x.ops.dense.split_k.split_k` is the rule that
    picks one). ``smem_stages`` (opt-in, default 0 = register stages of ``depth`` rows) selects the
    cp.async shared-memory ring with that many slots (2..4); ``depth`` is then unused.
    ``m_warps`` >= 1 selects the shared-decode mainloop (the CTA decodes each K16 row once into
    shared memory and multiplies it as ``m_warps`` x ``warps / m_warps`` warps, ``shared_rows``
    K16 rows per step, ``smem_stages`` 3..4 cp.async slots; :mod:`b12x.kernels.dense_gemm`);
    0 keeps the per-warp decode. ``wgmma`` (sm_90 only, ``m_warps == warps``) runs the shared
    decode's MMAs as Hopper warpgroup MMAs (:mod:`b12x.kernels.wgmma_decode`). ``swap_ab``
    (with ``wgmma``) runs the swap-AB mainloop instead: weights decoded into ``wgmma``'s register
    A operand, ``16·m_tiles`` tokens per CTA, ``smem_stages`` 4..8 slots
    (:mod:`b12x.kernels.wgmma_swap`); ``cluster`` 2 or 4 (with ``swap_ab``) makes that many CTAs
    along N share each token tile by TMA multicast (N / (16·n_tiles·warps) must divide by it).
    ``stream_k`` (with ``wgmma``, ``split_k`` 1) runs the ``wgmma`` mainloop (shared decode or
    swap-AB) on a stream-K schedule (:mod:`b12x.kernels.stream_k`): one CTA per SM shares
    every tile's K range;
    ``scratch`` then holds the CTAs' fp32 partials and ``flags`` (int32, zero on entry and on
    exit) their hand-off flags, one per CTA slot: the launch runs at most ``flags.numel()``
    CTAs (default: one per SM; both allocated when omitted). A geometry the kernel would
    refuse raises ``ValueError`` naming the field before anything else is checked.
    """
    from b12x.kernels.shared_layout import check_dense_mainloop  # pure Python, no cutlass

    if (swap_ab is True or wgmma is True) and tiles is None:
        mainloop = "swap-AB" if swap_ab is True else "wgmma"
        raise ValueError(f"tiles: the {mainloop} mainloop takes its (m_tiles, n_tiles) explicitly")
    shaped = isinstance(trellis, torch.Tensor) and trellis.ndim == 3  # int16 [K/16, N/16, 16b]
    check_dense_mainloop(
        swap_ab=swap_ab, wgmma=wgmma, bits=trellis.shape[-1] // 16 if shaped else None,
        m_tiles=tiles[0] if tiles else 1, n_tiles=tiles[1] if tiles else 1, warps=warps,
        m_warps=m_warps, rows=shared_rows, stages=smem_stages, cluster=cluster,
    )  # fmt: skip
    if stream_k is not False and (
        stream_k is not True or not wgmma or m_warps != warps or split_k != 1
    ):
        raise ValueError(
            "stream_k: True runs a wgmma mainloop (wgmma=True, m_warps == warps) with split_k "
            f"1; got stream_k={stream_k!r}, wgmma={wgmma!r}, m_warps={m_warps}, "
            f"warps={warps}, split_k={split_k!r}"
        )
    if shaped and cluster > 1:  # the cluster's CTAs along N: refused before any device check
        group = 16 * tiles[1] * warps
        ctas = trellis.shape[1] * 16 // group
        if ctas % cluster:
            raise ValueError(
                f"cluster: N={trellis.shape[1] * 16} is {ctas} CTAs of {group} columns, not a "
                f"multiple of the cluster of {cluster}"
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
    m_tiles, n_tiles = tiles if tiles is not None else choose_tiles(m, n)
    group = 16 * n_tiles * warps
    if n % group != 0:
        raise ValueError(f"trellis: N={n} must be a multiple of {group} for this tile shape")
    if isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1:
        raise ValueError(f"split_k: expected a positive int, got {split_k!r}")
    k_rows = k // 16
    rows_per_split = -(-k_rows // split_k)
    splits = -(-k_rows // rows_per_split)
    bf16 = a.dtype == torch.bfloat16
    if out is None:
        out = _allocate("out", "output", (m, n), a.dtype, a.device)
    _check_tensor("out", out, dtypes=(a.dtype,), ndim=2, device=a.device)
    if tuple(out.shape) != (m, n):
        raise ValueError(f"out: expected shape {(m, n)}, got {tuple(out.shape)}")
    lut = _lut_addr(fmt, a.device)
    spec = KernelSpec(
        "gemm",
        fmt,
        bits,
        bf16=bf16,
        m_tiles=m_tiles,
        n_tiles=n_tiles,
        warps=warps,
        write_partials=splits > 1,
        unroll=unroll,
        depth=depth,
        smem_stages=smem_stages,
        m_warps=m_warps,
        shared_rows=shared_rows,
        wgmma=wgmma,
        swap_ab=swap_ab,
        cluster=cluster,
    )
    if stream_k:
        return _stream_k_matmul(spec, a, trellis, out, lut, scratch, flags)
    if splits == 1:
        whole = GemmLaunch(
            a=a.view(torch.int32),
            payload=trellis.view(torch.int32),
            out=out.view(torch.int32),
            lut_addr=lut,
            k_rows_per_split=rows_per_split,
            splits=1,
        )
        _kernel(spec, a.device)(*whole.args())
        return out
    if scratch is None:
        scratch = _allocate("scratch", "scratch", (splits * m * n,), torch.float32, a.device)
    _check_tensor("scratch", scratch, dtypes=(torch.float32,), device=a.device)
    if scratch.numel() < splits * m * n:
        raise ValueError(f"scratch: needs {splits * m * n} fp32 elements, has {scratch.numel()}")
    partials = scratch.view(-1)[: splits * m * n].view(splits, m, n)
    split = GemmLaunch(
        a=a.view(torch.int32),
        payload=trellis.view(torch.int32),
        out=partials,
        lut_addr=lut,
        k_rows_per_split=rows_per_split,
        splits=splits,
    )
    _kernel(spec, a.device)(*split.args())
    reduce = ReduceLaunch(partials=partials, out=out.view(torch.int32))
    _kernel(KernelSpec("reduce", bf16=bf16), a.device)(*reduce.args())
    return out


def _stream_k_layout(spec: KernelSpec):
    from b12x.kernels.shared_layout import shared_decode_layout, swap_ab_layout

    geometry = dict(
        bits=spec.bits, m_tiles=spec.m_tiles, n_tiles=spec.n_tiles, warps=spec.warps,
        rows=spec.shared_rows, stages=spec.smem_stages,
    )  # fmt: skip
    if spec.swap_ab:
        return swap_ab_layout(**geometry, cluster=spec.cluster)
    return shared_decode_layout(**geometry, m_warps=spec.m_warps)


def _stream_k_units(spec: KernelSpec, m: int, k: int, n: int) -> int:
    """Units of work of a stream-K launch: tiles (pair tiles with clusters) x units per tile
    (:mod:`b12x.kernels.stream_k_schedule`)."""
    from b12x.kernels.stream_k_schedule import stream_k_units

    lay = _stream_k_layout(spec)
    tiles = (n // (16 * lay.cta_tiles * spec.cluster)) * -(-m // lay.cta_m)
    return tiles * stream_k_units(k // 16, lay.period * spec.shared_rows)


def stream_k_ctas(spec: KernelSpec, m: int, k: int, n: int, sm_count: int) -> int:
    """CTAs of a stream-K launch: one per SM, in whole clusters, at most one cluster per unit of
    work (every cluster's range is then non-empty; :mod:`b12x.kernels.stream_k`)."""
    return spec.cluster * min(sm_count // spec.cluster, _stream_k_units(spec, m, k, n))


def stream_k_partials(spec: KernelSpec, ctas: int) -> int:
    """fp32 elements of a stream-K launch's partials: one accumulator set per CTA."""
    lay = _stream_k_layout(spec)
    return ctas * spec.m_tiles * lay.mma_tiles * 8 * 32 * spec.warps


def _stream_k_matmul(spec, a, trellis, out, lut, scratch, flags):
    """The stream-K launch of :func:`trellis_matmul` (its buffers checked, or allocated)."""
    m, k = a.shape
    n = out.shape[1]
    if flags is None:  # one CTA per SM of the device
        slots = torch.cuda.get_device_properties(a.device).multi_processor_count
    else:  # the caller's flags: one per CTA it provisioned (a plan: per SM of its device)
        _check_tensor("flags", flags, dtypes=(torch.int32,), ndim=1, device=a.device)
        slots = flags.numel()
    units = _stream_k_units(spec, m, k, n)
    groups = min(slots // spec.cluster, units)
    if groups == 0:
        raise ValueError(f"flags: {slots} flags hold no cluster of {spec.cluster} CTAs")
    if groups * (units + 1) >= 2**31:  # the kernel's 32-bit unit math (group x units)
        raise ValueError(f"a: M={m}, K={k}, N={n} is too large for the stream-K schedule")
    ctas = spec.cluster * groups
    need = stream_k_partials(spec, ctas)
    if scratch is None:
        scratch = _allocate("scratch", "scratch", (need,), torch.float32, a.device)
    _check_tensor("scratch", scratch, dtypes=(torch.float32,), device=a.device)
    if scratch.numel() < need:
        raise ValueError(f"scratch: stream-K needs {need} fp32 elements, has {scratch.numel()}")
    if flags is None:
        flags = torch.zeros(ctas, dtype=torch.int32, device=a.device)
    launch = StreamKGemmLaunch(
        a=a.view(torch.int32),
        payload=trellis.view(torch.int32),
        out=out.view(torch.int32),
        partials=scratch.view(-1)[:need].view(ctas, need // ctas),
        flags=flags[:ctas],
        lut_addr=lut,
        ctas=ctas,
    )
    stream_spec = dataclasses.replace(spec, kind="gemm_stream_k")
    _kernel(stream_spec, a.device)(*launch.args())
    return out


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
    fn = _kernel(spec, x.device)
    x_words, scale_words, out_words = (t.view(torch.int32) for t in (x, scale, out))
    if kind == "rotate_in":
        fn(*InputRotationLaunch(x=x_words, suh=scale_words, out=out_words).args())
    else:
        fn(*OutputRotationLaunch(y=x_words, svh=scale_words, out=out_words).args())
    return out


def rotate_input(x, suh, *, out_dtype=torch.float16, out=None):
    """``fp16(H128(fp16(fp16(x) · suh)))`` per 128-block, cast to ``out_dtype``."""
    return _rotate("rotate_in", x, suh, out_dtype, "x", out)


def rotate_output(y, svh, *, out_dtype=torch.float16, out=None):
    """``fp16(fp16(H128(y)) · svh)`` per 128-block, cast to ``out_dtype``."""
    return _rotate("rotate_out", y, svh, out_dtype, "y", out)
