"""The one tolerance model (docs/oracle_contract.md §3), with its defaults as data.

Judges: :func:`judge_gemm`, :func:`judge_linear` and :func:`judge_moe` take the kernel output, the
operands (and optionally the kernel's intermediate stages, ``observed``) and decide from them
alone, computing every reference on the tensors' device. A case passes when **all** hold (every
number is reported in the :class:`Verdict`, pass or fail):

1. ``y`` has no NaN and no ±Inf (no tolerance waives it);
2. **element by element**, every judged stage lies in its *legitimate set*
   (:mod:`oracle.judge.envelope`); observed stages are judged from the *observed* previous stage, an
   unobserved one is composed into the next (wider, so observed stages are the sharper judges);
3. the **bias gate** of every judged stage (mean deviation in ulps within the directed-error
   allowance plus six standard errors: catches +1 ulp everywhere and round-toward-zero);
4. the **coarse gates** against the exact float64 reference ``e`` and the faithful ``f``: per
   ``row_block`` rows ``relL2_block(y, e) ≤ alpha · relL2_block(f, e)`` (``floor`` where the
   faithful error is exactly zero), and worst-row cosine ``≥ min_row_cosine``.

Stages: dense ``rotated``, ``gemm``, ``output``; MoE ``rotated_gate``, ``rotated_up``, ``fc1``,
``activated``, ``fc2``, ``output`` (route order; inactive routes' rows ignored).
``Verdict.details["stages"]`` maps each to its :class:`~oracle.judge.envelope.StageReport`.
:func:`judge` is the coarse gate alone; ``exact`` tolerances use :func:`judge_exact`. The full
notes: docs/notes/oracle.md.

Modules: this one holds the rules and the dense judges; :mod:`oracle.judge.verdicts` the
:class:`Tolerance` / :class:`Verdict` types, defaults and shared checks;
:mod:`oracle.judge.moe_judge` the MoE judge (re-exported here). :data:`DEFAULT_TOLERANCES` per
compute dtype; per-variant overrides live in :mod:`oracle.cases.variants` with a non-empty
reason; the element-wise model has no per-variant knobs (its constants:
:mod:`oracle.judge.envelope`).
"""

from __future__ import annotations

import math
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
    if "gemm" not in obs:
        widened, recovered = _recovered_gemm(gemm, y.reshape(m, n), svh, bias)
        reports["gemm_recovered"] = env.check_stage(widened, recovered)

    exact = ref_linear.forward_decoded(x, weight, suh, svh, bias, precision="exact")
    faithful = ref_linear.forward_decoded(
        x, weight, suh, svh, bias, precision="faithful", compute_dtype=cd
    )
    coarse = coarse_verdict(y.reshape(m, n), exact.reshape(m, n), faithful.reshape(m, n), tol)
    extra = {"compute_dtype": str(cd), "k": k, "observed": sorted(obs)}
    return summarise(reports, coarse, extra)


def _recovered_gemm(
    gemm: env.StageSet, y: torch.Tensor, svh: torch.Tensor, bias: torch.Tensor | None
) -> tuple[env.StageSet, torch.Tensor]:
    """The GEMM values recovered from the output, ``r = H128 · ((y - bias) / svh)`` (H128 is
    symmetric and orthogonal), and the GEMM stage's set in fp16 widened by what the output
    chain's roundings can move ``r``.

    The output check alone sees one GEMM value through the rotation, spread over 128 outputs at
    ``1/√128`` of its size, so a single wrong weight at one token row hides in it. Per output
    ``j``, ``(y_j - bias_j)/svh_j`` differs from ``(H128 · fp16(gemm))_j`` by round-to-nearest
    errors of at most half an ulp each (``fp16(h)``; ``fp16(h · svh)``, the fp32 and fp16 sums
    with the bias and the output cast, divided by ``|svh_j|``) plus the fp32 butterfly's
    directed error. Mixed back by H128 (entries ``±1/√128``), the zero-mean part is bounded like
    the GEMM's accumulation error (Azuma-Hoeffding, :data:`~oracle.judge.envelope.LAMBDA` times the
    quadrature sum), the butterfly's worst case through ``|H128|``. Magnitudes come from ``|y|``
    and ``|bias|`` with a 1 % margin (an ulp never shrinks as the magnitude grows)."""
    f16, f32 = torch.float16, torch.float32
    y64 = y.detach().to(torch.float64)
    scale = svh.to(torch.float64).abs()
    shift = torch.zeros_like(scale) if bias is None else bias.to(torch.float64)
    lo, hi = env.round_values(gemm.lo, f16), env.round_values(gemm.hi, f16)
    q = y64.abs() * 1.01 + env.ulp(y64, y.dtype)  # the fp16 sum before the output cast
    p = (q + shift.abs()) * 1.01  # fp16(h · svh)
    h = p / scale * 1.01  # fp16(h)
    halves = [env.ulp(p, f16), env.ulp(q, f16), env.ulp(q, f32)]
    if y.dtype != f16:
        halves.append(env.ulp(y64, y.dtype))
    square = (env.ulp(h, f16) / 2) ** 2 + sum((u / 2) ** 2 for u in halves) / scale**2
    butterfly = env.GAMMA_H * env.abs_h128(torch.maximum(lo.abs(), hi.abs()))
    zero_mean = (env.abs_h128(square) / math.sqrt(env.BLOCK)).sqrt()
    slack = env.LAMBDA * zero_mean + env.abs_h128(butterfly)
    recovered = env.exact_h128((y64 - shift) / svh.to(torch.float64))
    widened = env.StageSet(
        "gemm_recovered",
        f16,
        lo - slack,
        hi + slack,
        gemm.centre,
        torch.full_like(slack, math.inf),  # no bias gate: the recovery noise is not a shift
        torch.zeros_like(slack),
    )
    return widened, recovered


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
