"""The one tolerance model (design §6, docs/oracle_contract.md §3), with its defaults as data.

Judges
------
:func:`judge_gemm`, :func:`judge_linear` and :func:`judge_moe` take the kernel output, the
operands (and optionally the kernel's intermediate stages, ``observed``) and decide from them
alone; they compute every reference they need on the tensors' device. A case passes when **all**
of these hold (every number is reported in the :class:`Verdict`, pass or fail):

1. ``y`` has no NaN and no ±Inf (always; no tolerance waives it);
2. **element by element**, every judged stage lies in its *legitimate set*: the values a correct
   kernel can store from the same inputs (:mod:`oracle.judge.envelope`: a GEMM stage's set comes
   from the partial-sum bound of fp32 accumulation in any contiguous-K order, tensor-core truncation
   included; an fp32 chain stage's from its evaluation error bound). Observed stages are judged
   from the *observed* previous stage, so one error is reported where it happens and does not
   compound; a stage that was not observed is composed with the next one (its legitimate
   values carried through: worst case through ``|H|``, zero-mean parts in quadrature, see
   :mod:`oracle.judge.envelope`), which is wider, so observed stages are the sharper judges;
3. the **bias gate** of every judged stage: the mean deviation from the exact centre in ulps, and
   its ``sign(centre)``-weighted version, stay within the directed-error allowance plus six
   standard errors (catches +1 ulp everywhere and a round-toward-zero epilogue, which can stay
   inside the sets);
4. the **coarse gates** against the exact float64 reference ``e`` and the faithful reference
   ``f`` (the kernel's rounding points, :mod:`reference`): for every block of ``row_block``
   consecutive rows, ``relL2_block(y, e) ≤ alpha · relL2_block(f, e)``; a block where the
   faithful error is exactly zero (nothing rounded) uses ``floor`` instead, and only then;
   and ``worst-row cosine(y, e) ≥ min_row_cosine``.

Stages (route order ``r = t·top_k + j`` for the MoE; rows of inactive routes are ignored):

* dense linear: ``rotated`` (``[M, K]`` fp16), ``gemm`` (``[M, N]`` compute dtype), ``output``;
* MoE: ``rotated_gate``, ``rotated_up`` (``[R, H]``), ``fc1`` (``[R, 2I]`` gate | up),
  ``activated`` (``[R, I]``), ``fc2`` (``[R, H]``), all compute dtype, and ``output`` (``[M, H]``,
  ``x.dtype``).

``Verdict.details["stages"]`` maps each stage to its :class:`~oracle.judge.envelope.StageReport`
(``observed: False`` and ``composed_into`` for the stages the kernel did not expose).

:func:`judge` is the coarse gate alone on precomputed references (kept for existing callers);
``exact`` tolerances (decode, layout, replay vs eager) use :func:`judge_exact` (``torch.equal``
semantics).

Modules
-------
This module holds the rules above and the dense judges; :mod:`oracle.judge.verdicts` the
:class:`Tolerance` / :class:`Verdict` types, the defaults and the argument checks and verdict
building every judge shares; :mod:`oracle.judge.moe_judge` the MoE judge. ``judge_moe``,
``MOE_STAGES`` and the verdict types are re-exported here (the public names did not move).

Defaults
--------
:data:`DEFAULT_TOLERANCES` per compute dtype; per-variant overrides live in
:mod:`oracle.cases.variants` and must carry a non-empty reason (:meth:`Tolerance.override` enforces
it). The element-wise model has no per-variant knobs: its constants (λ, κ, γ_H, the bias z) are
derivations, documented in
:mod:`oracle.judge.envelope`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from oracle.judge import envelope as env
from oracle.judge.metrics import Metrics, compute_metrics
from oracle.judge.moe_judge import MOE_STAGES, judge_moe
from oracle.judge.verdicts import (
    DEFAULT_TOLERANCES,
    Tolerance,
    Verdict,
    check_device,
    check_shape,
    check_tensor_arg,
    coarse_verdict,
    compute_dtype_arg,
    default_tolerance,
    float_tensor,
    judged_stage,
    observed_stages,
    operand_bound,
    stage_values,
    summarise,
    tolerance_arg,
)
from reference import linear as ref_linear

__all__ = [
    "DEFAULT_TOLERANCES",
    "LINEAR_STAGES",
    "MOE_STAGES",
    "Tolerance",
    "Verdict",
    "default_tolerance",
    "judge",
    "judge_exact",
    "judge_gemm",
    "judge_linear",
    "judge_moe",
]

LINEAR_STAGES = ("rotated", "gemm")
"""Observable stages of the dense linear (``observed`` keys of :func:`judge_linear`)."""


def judge(
    y: torch.Tensor,
    exact: torch.Tensor,
    faithful: torch.Tensor | None,
    tol: Tolerance | None = None,
) -> Verdict:
    """The coarse gates alone (module docstring, rules 1 and 4) on precomputed references.

    ``tol`` defaults to the fp16 default. Without a faithful reference the bound is the floor.
    New callers judge kernels with :func:`judge_gemm` / :func:`judge_linear` / :func:`judge_moe`.
    """
    check_tensor_arg(y, "y", "judge")
    check_tensor_arg(exact, "exact", "judge")
    if faithful is not None:
        check_tensor_arg(faithful, "faithful", "judge")
    if tol is None:
        tol = DEFAULT_TOLERANCES["fp16"]
    if not isinstance(tol, Tolerance):
        raise TypeError(f"judge: tol must be a Tolerance, got {type(tol).__name__}")
    if tol.exact:
        return judge_exact(y, exact)
    reasons, details, metrics = coarse_verdict(y, exact, faithful, tol)
    return Verdict(passed=not reasons, reasons=tuple(reasons), metrics=metrics, details=details)


# ------------------------------------------------------------------------------ judge_gemm


def judge_gemm(
    y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    compute_dtype: torch.dtype,
    tolerance: Tolerance | None = None,
) -> Verdict:
    """Judge a rotation-less GEMM ``y ≈ x @ weight`` (``x [..., K]``, ``weight [K, N]``, any float
    dtypes; both are used as compute-dtype values, correctly rounded).

    ``y [..., N]`` is in ``compute_dtype``, or fp16 for a bf16 GEMM whose result is stored as
    fp16 (the dense path's ``gemm_output_f16``). Stage ``gemm`` (the element-wise set and the bias
    gate) plus the coarse gates against ``x @ weight`` in float64 (exact) and an fp32 torch GEMM
    of the compute-dtype operands (faithful). ``tolerance`` (coarse gates) defaults to the compute
    dtype's default."""
    fn = "judge_gemm"
    cd = compute_dtype_arg(compute_dtype, fn)
    tol = tolerance_arg(tolerance, cd, fn)
    weight = float_tensor(weight, "weight", fn)
    if weight.dim() != 2:
        raise ValueError(f"{fn}: weight must have shape [K, N], got {list(weight.shape)}")
    k, n = weight.shape
    x = float_tensor(x, "x", fn)
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{fn}: x must have shape [..., {k}], got {list(x.shape)}")
    allowed = (cd, torch.float16) if cd == torch.bfloat16 else (cd,)
    y = float_tensor(y, "y", fn, allowed)
    check_shape(y, (*x.shape[:-1], n), "y", fn)
    device = weight.device
    check_device(x, device, "x", fn)
    check_device(y, device, "y", fn)
    then = (torch.float16,) if y.dtype != cd else ()
    a = stage_values(x.reshape(-1, k), cd)
    b = env.round_to(weight.detach(), cd)
    stage = env.stage_set("gemm", env.gemm_envelope(env.Bound.exact(a), b), cd, then=then)
    reports = {"gemm": env.check_stage(stage, y.reshape(-1, n))}
    exact = x.reshape(-1, k).to(torch.float64) @ weight.to(torch.float64)
    faithful = (a.to(torch.float32) @ b.to(torch.float32)).to(cd).to(y.dtype)
    del a, b
    coarse = coarse_verdict(y.reshape(-1, n), exact, faithful, tol)
    return summarise(reports, coarse, {"compute_dtype": str(cd), "k": k})


# ------------------------------------------------------------------------------ judge_linear


def judge_linear(
    y: torch.Tensor,
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    bias: torch.Tensor | None = None,
    compute_dtype: torch.dtype,
    observed: Mapping[str, torch.Tensor] | None = None,
    tolerance: Tolerance | None = None,
) -> Verdict:
    """Judge the dense EXL3 linear (``reference.linear.forward_decoded``'s faithful chain).

    ``x [..., K]`` fp16/bf16, ``weight`` the decoded fp16 ``[K, N]``, ``suh`` fp16 ``[K]``, ``svh``
    fp16 ``[N]``, ``bias`` fp16 ``[N]`` or None; ``y [..., N]`` in ``x.dtype``. ``observed`` may
    hold the kernel's ``rotated`` (``[M, K]`` fp16) and ``gemm`` (``[M, N]`` compute dtype) with
    ``M`` the flattened rows of ``x``. Stages:

    * ``rotated``: ``fp16(H128_fp32(fp16(fp16(x) · suh)))``; the product rounding is exact, the
      butterfly judged by its fp32 bound;
    * ``gemm``: the GEMM model of :func:`judge_gemm` on the observed ``rotated`` (or, unobserved,
      on its legitimate interval);
    * ``output``: ``x.dtype(fp16(fp16(fp16(H128_fp32(fp16(gemm))) · svh) + bias))``: the H128
      interval is carried through the monotone scalings end by end.
    """
    fn = "judge_linear"

    cd = compute_dtype_arg(compute_dtype, fn)
    tol = tolerance_arg(tolerance, cd, fn)
    weight = float_tensor(weight, "weight", fn, (torch.float16,))
    if weight.dim() != 2 or weight.shape[0] % 128 or weight.shape[1] % 128 or not weight.numel():
        raise ValueError(
            f"{fn}: weight must have shape [K, N] with K, N positive multiples of 128, got "
            f"{list(weight.shape)}"
        )
    k, n = weight.shape
    x = float_tensor(x, "x", fn, (torch.float16, torch.bfloat16))
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{fn}: x must have shape [..., {k}], got {list(x.shape)}")
    y = float_tensor(y, "y", fn, (x.dtype,))
    check_shape(y, (*x.shape[:-1], n), "y", fn)
    suh = float_tensor(suh, "suh", fn, (torch.float16,))
    svh = float_tensor(svh, "svh", fn, (torch.float16,))
    check_shape(suh, (k,), "suh", fn)
    check_shape(svh, (n,), "svh", fn)
    if bias is not None:
        bias = float_tensor(bias, "bias", fn, (torch.float16,))
        check_shape(bias, (n,), "bias", fn)
    obs = observed_stages(observed, LINEAR_STAGES, fn)
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    shapes = {"rotated": ((m, k), (torch.float16,)), "gemm": ((m, n), (cd,))}
    device = weight.device
    named = {"x": x, "y": y, "suh": suh, "svh": svh, "bias": bias}
    for name, value in obs.items():
        shape, dtypes = shapes[name]
        named[f"observed[{name!r}]"] = float_tensor(value, f"observed[{name!r}]", fn, dtypes)
        check_shape(value, shape, f"observed[{name!r}]", fn)
    for name, value in named.items():
        if value is not None:
            check_device(value, device, name, fn)

    f16 = torch.float16
    x16 = rows.to(f16)  # fp16 / bf16 -> fp16: one rounding
    product = (x16.to(torch.float32) * suh.to(torch.float32)).to(f16)  # exact product, rounded once
    rotated = env.stage_set("rotated", env.h128_bound(env.Bound.exact(product)), f16)
    reports = {"rotated": judged_stage(rotated, obs.get("rotated"), "gemm")}
    a = operand_bound(rotated, obs.get("rotated"), cd)
    gemm = env.stage_set("gemm", env.gemm_envelope(a, weight.to(cd)), cd)
    reports["gemm"] = judged_stage(gemm, obs.get("gemm"), "output")
    g16 = operand_bound(gemm, obs.get("gemm"), f16)
    output = _linear_output(env.h128_bound(g16), g16.sys, svh, bias, x.dtype)
    reports["output"] = env.check_stage(output, y.reshape(m, n))

    exact = ref_linear.forward_decoded(x, weight, suh, svh, bias, precision="exact")
    faithful = ref_linear.forward_decoded(
        x, weight, suh, svh, bias, precision="faithful", compute_dtype=cd
    )
    coarse = coarse_verdict(y.reshape(m, n), exact.reshape(m, n), faithful.reshape(m, n), tol)
    extra = {"compute_dtype": str(cd), "k": k, "observed": sorted(obs)}
    return summarise(reports, coarse, extra)


def _linear_output(
    rotated: env.Bound,
    gemm_sys: torch.Tensor,
    svh: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> env.StageSet:
    """``out(fp16(fp16(fp16(h) · svh) + bias))`` for ``h`` the fp32 H128 bound: every step after
    the first rounding is monotone in its input, so both ends of the set are mapped exactly.

    The bias allowance is the dual of the linear map ``g -> svh ⊙ H·g`` applied to the GEMM's
    directed error bound ``gemm_sys`` (zero when the GEMM stage was observed): a statistic
    ``Σ_j w_j (y_j - c_j)`` can move by at most ``Σ_i gemm_sys_i · |(H (w ⊙ svh))_i|``."""
    f16, f32 = torch.float16, torch.float32
    first = env.stage_set("output", rotated, f16)
    scale = svh.to(torch.float64)
    ends = [env.round_values(first.lo * scale, f16), env.round_values(first.hi * scale, f16)]
    if bias is not None:
        shift = bias.to(torch.float64)
        ends = [env.round_values(env.round_values(e + shift, f32), f16) for e in ends]
    ends = [env.round_values(e, out_dtype) for e in ends]
    lo, hi = torch.minimum(*ends), torch.maximum(*ends)
    centre = rotated.centre * scale + (0.0 if bias is None else bias.to(torch.float64))

    def dual(weight: torch.Tensor) -> torch.Tensor:
        return (gemm_sys * env.exact_h128(weight * scale).abs()).sum()

    return env.StageSet(
        "output",
        out_dtype,
        lo,
        hi,
        centre,
        rotated.radius * scale.abs(),
        rotated.sys * scale.abs(),
        dual=dual if bool(gemm_sys.any()) else None,
    )


def judge_exact(a: torch.Tensor, b: torch.Tensor) -> Verdict:
    """``torch.equal`` semantics (same shape, same dtype, every element equal; NaN != NaN).

    On mismatch the reasons give the count and the first mismatching index (row-major)."""
    check_tensor_arg(a, "a", "judge_exact")
    check_tensor_arg(b, "b", "judge_exact")
    reasons: list[str] = []
    details: dict[str, Any] = {"mismatches": 0, "first_mismatch": None}
    same_shape = tuple(a.shape) == tuple(b.shape)
    if a.dtype != b.dtype:
        reasons.append(f"dtype {a.dtype} != {b.dtype}")
    if not same_shape:
        reasons.append(f"shape {tuple(a.shape)} != {tuple(b.shape)}")
        metrics = _metrics_of_flat_prefix(a, b)
        return Verdict(False, tuple(reasons), metrics, details)
    a_d, b_d = a.detach(), b.detach().to(a.device)  # compared where `a` lives
    common = torch.promote_types(a_d.dtype, b_d.dtype)
    mismatch = a_d.to(common) != b_d.to(common)
    count = int(mismatch.sum())
    if count:
        first = torch.nonzero(mismatch.reshape(-1))[0].item()
        index = (
            tuple(int(i) for i in torch.unravel_index(torch.tensor(first), a.shape))
            if a.dim()
            else ()
        )
        details.update(mismatches=count, first_mismatch=list(index))
        reasons.append(
            f"{count} of {a.numel()} elements differ; first at index {index}: "
            f"{a_d.reshape(-1)[first].item()!r} != {b_d.reshape(-1)[first].item()!r}"
        )
    metrics = compute_metrics(a_d, b_d)
    return Verdict(passed=not reasons, reasons=tuple(reasons), metrics=metrics, details=details)


def _metrics_of_flat_prefix(a: torch.Tensor, b: torch.Tensor) -> Metrics:
    """Metrics when shapes differ: compare the common flat prefix, so a report still has numbers."""
    n = min(a.numel(), b.numel())
    return compute_metrics(a.detach().cpu().reshape(-1)[:n], b.detach().cpu().reshape(-1)[:n])
