"""The dense EXL3 trellis linear layer: reconstruction and forward, exact and faithful (§3.2-3.3).

Tensors of one layer (:class:`TrellisLinear`, validated on construction):

* ``trellis`` int16 ``[K/16, N/16, 16*b]``: tile ``(kt, nt)`` covers ``W[16kt:16kt+16,
  16nt:16nt+16]``; ``b`` is the bit rate, legal for ``codebook``;
* ``suh`` fp16 ``[K]`` (input side), ``svh`` fp16 ``[N]`` (output side), finite;
* ``bias`` optional fp16 ``[N]``.

K (in features, reduction) and N (out features) are multiples of 128 because H128 is applied
blockwise on both sides. The layer's weight is ::

    W_hat = diag(suh) . Hk . Wq . Hn . diag(svh)          Hk, Hn = blockdiag(H128)
    y     = x @ W_hat (+ bias) = (((x * suh) @ Hk) @ Wq) @ Hn * svh (+ bias)

with ``Wq`` the decoded weight (:func:`decoded_weight`).

Two precisions, ``"exact"`` (float64) and ``"faithful"`` (the kernel's rounding points, §3.2
table, §3.3 buffers, step by step): :func:`forward`.


:func:`forward_decoded` runs the same pipeline on an already decoded weight and explicit scales,
so pair layers (:mod:`reference.pairs`) and MoE experts reuse it instead of duplicating it. Any
object with ``decode()``, ``suh``, ``svh`` and ``bias`` works as a ``layer`` here.
"""

from __future__ import annotations

import dataclasses

import torch

from reference import _checks
from reference.codebooks import validate_codebook_bits
from reference.hadamard import BLOCK, apply_blockwise, apply_blockwise_faithful
from reference.trellis import decode

PRECISIONS = ("exact", "faithful")
COMPUTE_DTYPES = (torch.float16, torch.bfloat16)
EXACT_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FAITHFUL_INPUT_DTYPES = (torch.float16, torch.bfloat16)


def validate_scales(suh: object, svh: object, bias: object, k: int, n: int) -> None:
    """Check ``suh`` fp16 ``[k]``, ``svh`` fp16 ``[n]`` (both finite) and ``bias`` fp16 ``[n]``."""
    for name, value, size in (("suh", suh, k), ("svh", svh, n), ("bias", bias, n)):
        if name == "bias" and value is None:
            continue
        _checks.check_dtype(value, torch.float16, name)
        if tuple(value.shape) != (size,):
            raise ValueError(f"{name}: expected shape ({size},), got {tuple(value.shape)}")
        if name != "bias":
            _checks.check_finite(value, name)


@dataclasses.dataclass(frozen=True, eq=False)
class TrellisLinear:
    """One EXL3 linear layer; see the module docstring for shapes. Validated on construction."""

    trellis: torch.Tensor
    suh: torch.Tensor
    svh: torch.Tensor
    codebook: str
    bias: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def bits(self) -> int:
        return self.trellis.shape[-1] // 16

    @property
    def k(self) -> int:
        return self.trellis.shape[0] * 16

    @property
    def n(self) -> int:
        return self.trellis.shape[1] * 16

    def validate(self) -> None:
        """Dtypes, shapes (K, N multiples of 128), finite scales, codebook/bits legality."""
        trellis = _checks.check_dtype(self.trellis, torch.int16, "trellis")
        if trellis.dim() != 3:
            raise ValueError(
                f"trellis: expected shape [K/16, N/16, 16*bits], got {tuple(trellis.shape)}"
            )
        words = trellis.shape[-1]
        if words == 0 or words % 16:
            raise ValueError(f"trellis: last dimension {words} is not 16*bits")
        for axis, name in ((0, "K"), (1, "N")):
            size = trellis.shape[axis] * 16
            if size == 0 or size % BLOCK:
                raise ValueError(
                    f"trellis: {name} = {size} is not a positive multiple of {BLOCK} "
                    f"(shape {tuple(trellis.shape)})"
                )
        if not isinstance(self.codebook, str):
            raise TypeError(f"codebook: expected a str, got {type(self.codebook).__name__}")
        validate_codebook_bits(self.codebook, self.bits)
        validate_scales(self.suh, self.svh, self.bias, self.k, self.n)

    def decode(self) -> torch.Tensor:
        """The decoded weight ``Wq`` as float16 ``[K, N]``."""
        return decode(self.trellis, self.codebook)


def decoded_weight(layer: TrellisLinear) -> torch.Tensor:
    """``Wq``: the layer's decoded trellis weight, float16 ``[K, N]``."""
    return layer.decode()


def reconstruct_decoded(weight: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor) -> torch.Tensor:
    """``diag(suh) . Hk . weight . Hn . diag(svh)`` in float64."""
    w = weight.to(torch.float64)
    w = apply_blockwise(w, dim=0)  # Hk . W (H128 is symmetric)
    w = apply_blockwise(w, dim=1)  # . Hn
    return suh.to(torch.float64)[:, None] * w * svh.to(torch.float64)[None, :]


def reconstruct(layer: TrellisLinear) -> torch.Tensor:
    """The layer's effective weight ``W_hat`` (float64 ``[K, N]``), ``y = x @ W_hat + bias``."""
    return reconstruct_decoded(layer.decode(), layer.suh, layer.svh)


def _round_product_f16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``fp16(a * b)`` for fp16 operands: the fp32 product is exact, so it is rounded once."""
    return (a.to(torch.float32) * b.to(torch.float32)).to(torch.float16)


def faithful_input_rotation(x: torch.Tensor, suh: torch.Tensor) -> torch.Tensor:
    """Steps 1-3: ``fp16(H128_fp32(fp16(fp16(x) * suh)))`` over the last dim (``rotated_f16``)."""
    return apply_blockwise_faithful(_round_product_f16(x.to(torch.float16), suh)).to(torch.float16)


def faithful_gemm_compute(
    rotated_f16: torch.Tensor, weight: torch.Tensor, *, compute_dtype: torch.dtype
) -> torch.Tensor:
    """Steps 4-5 up to the compute-dtype store: operands in ``compute_dtype``, fp32 accumulation,
    result rounded to the compute dtype (``gemm_output``, the ``gemm`` stage)."""
    a = rotated_f16.to(compute_dtype).to(torch.float32)
    b = weight.to(compute_dtype).to(torch.float32)
    return (a @ b).to(compute_dtype)


def faithful_gemm(
    rotated_f16: torch.Tensor, weight: torch.Tensor, compute_dtype: torch.dtype
) -> torch.Tensor:
    """Steps 4-5: operands in ``compute_dtype``, fp32 accumulation, result rounded to the compute
    dtype and then to fp16 (``gemm_output`` / ``gemm_output_f16``)."""
    return faithful_gemm_compute(rotated_f16, weight, compute_dtype=compute_dtype).to(torch.float16)


def faithful_output_rotation(
    gemm_f16: torch.Tensor, svh: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Steps 6-8: ``fp16(fp16(H128_fp32(gemm)) * svh)``, then ``fp16(. + bias)`` in fp32."""
    out = _round_product_f16(apply_blockwise_faithful(gemm_f16).to(torch.float16), svh)
    if bias is not None:
        out = (out.to(torch.float32) + bias.to(torch.float32)).to(torch.float16)
    return out


def _check_forward_args(
    x: object, k: int, precision: object, compute_dtype: object
) -> torch.Tensor:
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(
            f"compute_dtype: expected torch.float16 or torch.bfloat16, got {compute_dtype!r}"
        )
    allowed = EXACT_INPUT_DTYPES if precision == "exact" else FAITHFUL_INPUT_DTYPES
    x = _checks.check_dtype(x, allowed, "x")
    _checks.check_last_dim(x, k, "x")
    return x


def forward_decoded(
    x: torch.Tensor,
    weight: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    precision: str = "exact",
    compute_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """The layer pipeline over a decoded fp16 ``weight [K, N]`` (see the module docstring).

    ``x`` is ``[..., K]``. Exact: float64 result. Faithful: result in ``x.dtype``.
    """
    weight = _checks.check_dtype(weight, torch.float16, "weight")
    if weight.dim() != 2:
        raise ValueError(f"weight: expected shape [K, N], got {tuple(weight.shape)}")
    k, n = weight.shape
    validate_scales(suh, svh, bias, k, n)
    x = _check_forward_args(x, k, precision, compute_dtype)
    rows = x.reshape(-1, k)
    if precision == "exact":
        f64 = torch.float64
        rotated = apply_blockwise(rows.to(f64) * suh.to(f64))
        y = apply_blockwise(rotated @ weight.to(f64)) * svh.to(f64)
        if bias is not None:
            y = y + bias.to(f64)
    else:
        rotated_f16 = faithful_input_rotation(rows, suh)
        gemm_f16 = faithful_gemm(rotated_f16, weight, compute_dtype)
        y = faithful_output_rotation(gemm_f16, svh, bias).to(x.dtype)
    return y.reshape(*x.shape[:-1], n)


def forward(
    x: torch.Tensor,
    layer: TrellisLinear,
    precision: str = "exact",
    *,
    compute_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """``y = x @ W_hat (+ bias)`` for ``x [..., K]`` at ``precision`` ``"exact"`` (float64) or
    ``"faithful"`` (the kernel's rounding points, result in ``x.dtype``; ``x`` fp16 or bf16).

    Two precisions (:func:`forward`):

    * ``"exact"``: everything in float64 over the decoded fp16 weights; returns float64.
    * ``"faithful"``: the kernel's rounding points (§3.2 table, §3.3 buffers), step by step:

      1. ``x`` -> fp16 (the ``input_f16`` buffer when ``x`` is bf16);
      2. ``fp16(x * suh)``: fp16 x fp16 is exact in fp32, so one multiply in fp32 and one rounding
         reproduce ``__hmul2``;
      3. H128 with the fp32 butterfly (:func:`reference.hadamard.apply_blockwise_faithful`), rounded
         to fp16 (``rotated_f16``);
      4. for bf16 compute, both operands (``rotated_f16`` -> ``rotated_compute`` and the decoded
         fp16 ``Wq``) are rounded to bf16;
      5. GEMM with fp32 accumulation (a float32 matmul of the operand values), rounded to the
         compute dtype (``gemm_output``), then to fp16 for bf16 compute (``gemm_output_f16``);
      6. output H128 with the fp32 butterfly, rounded to fp16;
      7. ``fp16(. * svh)`` (one rounding, as in step 2);
      8. ``+ bias`` in fp32, rounded to fp16;
      9. cast to ``x.dtype`` (``output_f16`` -> ``output`` when ``x`` is bf16).

      The summation order inside the fp32 GEMM is torch's, not the kernel's; that is the one
      latitude a kernel has against this reference.
    """
    k = getattr(layer, "k", None)
    if k is None or not callable(getattr(layer, "decode", None)):
        raise TypeError(f"layer: expected a TrellisLinear-like layer, got {type(layer).__name__}")
    _check_forward_args(x, k, precision, compute_dtype)
    return forward_decoded(
        x,
        layer.decode(),
        layer.suh,
        layer.svh,
        layer.bias,
        precision=precision,
        compute_dtype=compute_dtype,
    )
