"""The dense trellis linear ``y = ((x ⊙ suh)·H128) · Wq · H128 ⊙ svh (+ bias)`` (spec §3.2–3.3).

Layout
------
:func:`trellis_linear` validates every input, then runs three launches (or two callbacks and a
GEMM): the input rotation ``rotated = fp16(H128(fp16(fp16(x)·suh)))`` (in the compute dtype),
the trellis GEMM with in-register decode (fp32 accumulation, optional split-K, result rounded to
the compute dtype), and the output rotation ``fp16(fp16(H128(gemm))·svh)`` cast to ``x.dtype``.
The GEMM may instead decode Wq once (:func:`b12x.kernels.host.decode_weight`) and call cuBLAS
(``path="decode_matmul"``). ``path="auto"`` follows the declared dispatch table
(:func:`auto_path`, i.e. :func:`b12x.dense.dispatch.explain`): decode_matmul for
M ≥ ``DECODE_MATMUL_MIN_M`` (64, the measured H200 crossover) unless the K6/MCG small-M row
(capability (12, 0), M ≤ 128) comes first; the K6 and generic rows both run the fused GEMM here.
``split_k`` applies to the fused GEMM only (``None`` = the host heuristic).

Invariants
----------
* Nothing is launched before all checks pass: dtype, shape, contiguity, 16-byte alignment,
  device and codebook/bits legality each raise a ``TypeError``/``ValueError`` naming the
  argument.
* The external H128 callback follows exllamav3's ``had_r_128(input, output, pre_scale,
  post_scale, scale)`` contract (or an object exposing ``.had_r_128``) and is called as
  ``(x_f16, rotated_f16, suh, None, 1.0)`` and ``(gemm_f16, out_f16, None, svh, 1.0)``.
"""

from __future__ import annotations

import torch

from b12x.dense import dispatch
from b12x.dense.dispatch import DECODE_MATMUL_MIN_M  # the table's one decode_matmul threshold
from b12x.formats import resolve_format
from b12x.kernels import host

__all__ = ["DECODE_MATMUL_MIN_M", "PATHS", "auto_path", "trellis_linear", "validate_linear_inputs"]

PATHS = ("auto", "fused", "decode_matmul")
_HALF = (torch.float16, torch.bfloat16)


def _tensor(name, t, dtypes, ndim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    if t.data_ptr() % 16 != 0:
        raise ValueError(f"{name}: data pointer must be 16-byte aligned")


def validate_linear_inputs(x, trellis, suh, svh, *, codebook, compute_dtype, bias=None):
    """All checks of :func:`trellis_linear`; returns ``(fmt, bits, M, K, N)``."""
    _tensor("x", x, _HALF, 2)
    _tensor("trellis", trellis, (torch.int16,), 3)
    _tensor("suh", suh, (torch.float16,), 1)
    _tensor("svh", svh, (torch.float16,), 1)
    if bias is not None:
        _tensor("bias", bias, (torch.float16,), 1)
    if compute_dtype not in _HALF:
        raise TypeError(
            f"compute_dtype: expected torch.float16 or torch.bfloat16, got {compute_dtype}"
        )
    if trellis.shape[-1] % 16 != 0 or trellis.shape[-1] == 0:
        raise ValueError(f"trellis: last dim must be 16·bits, got {trellis.shape[-1]}")
    bits = trellis.shape[-1] // 16
    fmt = resolve_format(codebook, bits)
    k, n = trellis.shape[0] * 16, trellis.shape[1] * 16
    if k == 0 or n == 0 or k % 128 or n % 128:
        raise ValueError(f"trellis: K={k} and N={n} must be positive multiples of 128")
    m = x.shape[0]
    if m == 0:
        raise ValueError("x: needs at least one row")
    if x.shape[1] != k:
        raise ValueError(f"x: expected {k} features (trellis K), got {x.shape[1]}")
    if suh.shape[0] != k:
        raise ValueError(f"suh: expected {k} entries, got {suh.shape[0]}")
    if svh.shape[0] != n:
        raise ValueError(f"svh: expected {n} entries, got {svh.shape[0]}")
    if bias is not None and bias.shape[0] != n:
        raise ValueError(f"bias: expected {n} entries, got {bias.shape[0]}")
    tensors = {"x": x, "trellis": trellis, "suh": suh, "svh": svh}
    if bias is not None:
        tensors["bias"] = bias
    for name, t in tensors.items():
        if not t.is_cuda:
            raise ValueError(f"{name}: expected a CUDA tensor, got device {t.device}")
        if t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device}, got {t.device}")
    return fmt, bits, m, k, n


def _resolve_callback(hadamard_128):
    if hadamard_128 is None:
        return None
    fn = getattr(hadamard_128, "had_r_128", hadamard_128)
    if not callable(fn):
        raise TypeError("hadamard_128: expected a callable or an object with .had_r_128")
    return fn


def auto_path(
    *,
    m: int,
    bits: int,
    codebook: str,
    compute_dtype: torch.dtype,
    external_rotation: bool,
    capability: tuple[int, int],
) -> str:
    """``"decode_matmul"`` where the dispatch table selects that row, else ``"fused"``."""
    case = {
        "capability": tuple(capability),
        "m": m,
        "bits": bits,
        "codebook": codebook,
        "compute_dtype": compute_dtype,
        "external_rotation": external_rotation,
    }
    return "decode_matmul" if dispatch.explain(case).path == "decode_matmul" else "fused"


def trellis_linear(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    *,
    codebook: str,
    compute_dtype: torch.dtype = torch.float16,
    split_k: int | None = None,
    bias: torch.Tensor | None = None,
    hadamard_128=None,
    path: str = "auto",
) -> torch.Tensor:
    """The dense EXL3 trellis linear on the GPU; returns ``[M, N]`` in ``x.dtype``."""
    if path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    fmt, bits, m, _, _ = validate_linear_inputs(
        x, trellis, suh, svh, codebook=codebook, compute_dtype=compute_dtype, bias=bias
    )
    if split_k is not None and (
        isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1
    ):
        raise ValueError(f"split_k: expected a positive int or None, got {split_k!r}")
    had = _resolve_callback(hadamard_128)
    if path == "auto":
        path = auto_path(
            m=m,
            bits=bits,
            codebook=fmt.name,
            compute_dtype=compute_dtype,
            external_rotation=had is not None,
            capability=torch.cuda.get_device_capability(x.device),
        )

    if had is None:
        rotated = host.rotate_input(x, suh, out_dtype=compute_dtype)
    else:
        rotated_f16 = torch.empty(x.shape, dtype=torch.float16, device=x.device)
        had(x.to(torch.float16), rotated_f16, suh, None, 1.0)
        rotated = rotated_f16.to(compute_dtype)

    if path == "decode_matmul":
        weight = host.decode_weight(trellis, codebook).to(compute_dtype)
        gemm = torch.matmul(rotated, weight)
    else:
        gemm = host.trellis_matmul(rotated, trellis, codebook, split_k=split_k)

    if had is None:
        out = host.rotate_output(
            gemm, svh, out_dtype=torch.float16 if bias is not None else x.dtype
        )
    else:
        out = torch.empty(gemm.shape, dtype=torch.float16, device=x.device)
        had(gemm.to(torch.float16), out, None, svh, 1.0)
    if bias is not None:
        out = (out.to(torch.float32) + bias.to(torch.float32)).to(torch.float16)
    return out.to(x.dtype)
