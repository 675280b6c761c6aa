"""The one tolerance model (design §6, docs/oracle_contract.md §3), with its defaults as data.

Judges
------
:func:`judge_gemm`, :func:`judge_linear` and :func:`judge_moe` take the kernel output, the
operands (and optionally the kernel's intermediate stages, ``observed``) and decide from them
alone; they compute every reference they need on the tensors' device. A case passes when **all**
of these hold (every number is reported in the :class:`Verdict`, pass or fail):

1. ``y`` has no NaN and no ±Inf (always; no tolerance waives it);
2. **element by element**, every judged stage lies in its *legitimate set*: the values a correct
   kernel can store from the same inputs (:mod:`oracle.envelope`: a GEMM stage's set comes from
   the partial-sum bound of fp32 accumulation in any contiguous-K order, tensor-core truncation
   included; an fp32 chain stage's from its evaluation error bound). Observed stages are judged
   from the *observed* previous stage, so one error is reported where it happens and does not
   compound; a stage that was not observed is composed with the next one (its legitimate
   values carried through: worst case through ``|H|``, zero-mean parts in quadrature, see
   :mod:`oracle.envelope`), which is wider, so observed stages are the sharper judges;
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

``Verdict.details["stages"]`` maps each stage to its :class:`~oracle.envelope.StageReport`
(``observed: False`` and ``composed_into`` for the stages the kernel did not expose).

:func:`judge` is the coarse gate alone on precomputed references (kept for existing callers);
``exact`` tolerances (decode, layout, replay vs eager) use :func:`judge_exact` (``torch.equal``
semantics).

Defaults
--------
:data:`DEFAULT_TOLERANCES` per compute dtype; per-variant overrides live in :mod:`oracle.variants`
and must carry a non-empty reason (:meth:`Tolerance.override` enforces it). The element-wise model
has no per-variant knobs: its constants (λ, κ, γ_H, the bias z) are derivations, documented in
:mod:`oracle.envelope`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from oracle import envelope as env
from oracle.metrics import Metrics, as_rows, compute_metrics, row_block_rel_l2

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
MOE_STAGES = ("rotated_gate", "rotated_up", "fc1", "activated", "fc2")
"""Observable stages of the fused MoE (``observed`` keys of :func:`judge_moe`)."""
COMPUTE_DTYPES = (torch.float16, torch.bfloat16)
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


MAX_LISTED_BLOCKS = 4  # failing row blocks listed by name in a verdict's reasons


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Gate parameters. ``reason`` says where the numbers come from (never empty)."""

    alpha: float = 2.0
    floor: float = 1e-3
    min_row_cosine: float = 0.999
    row_block: int = 16
    reason: str = "default"
    exact: bool = False

    def __post_init__(self) -> None:
        for arg in ("alpha", "floor", "min_row_cosine"):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Tolerance: {arg} must be a number, got {type(value).__name__}")
            if not math.isfinite(value):
                raise ValueError(f"Tolerance: {arg} must be finite, got {value}")
        if self.alpha <= 0:
            raise ValueError(f"Tolerance: alpha must be > 0, got {self.alpha}")
        if self.floor < 0:
            raise ValueError(f"Tolerance: floor must be >= 0, got {self.floor}")
        if not -1.0 <= self.min_row_cosine <= 1.0:
            raise ValueError(
                f"Tolerance: min_row_cosine must be in [-1, 1], got {self.min_row_cosine}"
            )
        if (
            isinstance(self.row_block, bool)
            or not isinstance(self.row_block, int)
            or self.row_block < 1
        ):
            raise ValueError(f"Tolerance: row_block must be a positive int, got {self.row_block!r}")
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError("Tolerance: reason must be a non-empty string")
        if not isinstance(self.exact, bool):
            raise TypeError(f"Tolerance: exact must be a bool, got {type(self.exact).__name__}")

    def override(self, *, reason: str, **changes: Any) -> Tolerance:
        """A copy with ``changes`` applied. ``reason`` is mandatory, non-empty and not "default"."""
        if not isinstance(reason, str) or not reason.strip() or reason.strip() == "default":
            raise ValueError("Tolerance.override: reason must say why (non-empty, not 'default')")
        allowed = {f.name for f in dataclasses.fields(self)} - {"reason"}
        unknown = set(changes) - allowed
        if unknown:
            raise ValueError(f"Tolerance.override: unknown fields {sorted(unknown)}")
        return dataclasses.replace(self, reason=reason, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: Per compute dtype defaults. Measured with reference.linear (random payloads, M 1..129, K/N
#: 256..1280, mcg/sqg_e4m3/3inst): the faithful dense path's rel-L2 against exact is
#: 4.5e-4..5.3e-4 in fp16 and 3.0e-3..3.7e-3 in bf16, worst-row cosine >= 0.9999999 / 0.999993.
#: alpha = 2: a legitimate kernel's rel-L2 against exact is another draw of the same rounding
#: noise (ratio ~1 +- a few % per 16-row block). The floors (~2 ulps relative) apply only to a
#: row block whose faithful error is exactly zero (nothing rounded, e.g. exactly representable
#: results), where a kernel that sums in another order may still flip a rounding; they never
#: decide a normal case (the element-wise model is the sharp gate). The cosine limits leave
#: ~100x headroom in (1 - cos).
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "fp16": Tolerance(
        alpha=2.0,
        floor=1e-3,
        min_row_cosine=0.9999,
        row_block=16,
        reason="default fp16: alpha 2 (design §6); floor ~2 ulps, only where faithful == exact",
    ),
    "bf16": Tolerance(
        alpha=2.0,
        floor=8e-3,
        min_row_cosine=0.999,
        row_block=16,
        reason="default bf16: alpha 2 (design §6); floor ~2 ulps, only where faithful == exact",
    ),
}


def default_tolerance(dtype: str) -> Tolerance:
    """The default for compute dtype ``"fp16"`` or ``"bf16"``."""
    try:
        return DEFAULT_TOLERANCES[dtype]
    except (KeyError, TypeError):
        raise ValueError(
            f"default_tolerance: dtype must be one of {tuple(DEFAULT_TOLERANCES)}, got {dtype!r}"
        ) from None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Outcome of one judgement: passed, the reasons it failed (empty when passed), metrics."""

    passed: bool
    reasons: tuple[str, ...]
    metrics: Metrics
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reasons": list(self.reasons),
            "metrics": self.metrics.to_dict(),
            "details": dict(self.details),
        }


def _check_tensor(t: Any, arg: str, fn: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {arg} must be a torch.Tensor, got {type(t).__name__}")


# ------------------------------------------------------------------------------ coarse gate


def _coarse(
    y: torch.Tensor, exact: torch.Tensor, faithful: torch.Tensor | None, tol: Tolerance
) -> tuple[list[str], dict[str, Any], Metrics]:
    """The design §6 coarse gates (module docstring, rule 4) and the metrics with their bounds."""
    metrics = compute_metrics(y, exact, faithful)  # validates shapes
    reasons: list[str] = []
    if metrics.nan_count or metrics.inf_count:
        reasons.append(f"non-finite output: {metrics.nan_count} NaN, {metrics.inf_count} Inf")
    y_blocks = row_block_rel_l2(y, exact, tol.row_block)
    if faithful is not None:
        f_blocks = row_block_rel_l2(faithful, exact, tol.row_block)
        bound = torch.where(
            f_blocks > 0, tol.alpha * f_blocks, torch.full_like(f_blocks, tol.floor)
        )
    else:
        bound = torch.full_like(y_blocks, tol.floor)
    bad = ~(y_blocks <= bound)  # NaN counts as bad
    bad_blocks = torch.nonzero(bad).flatten().tolist()
    if bad_blocks:
        listed = ", ".join(
            f"rows {b * tol.row_block}..{b * tol.row_block + tol.row_block - 1}: "
            f"{float(y_blocks[b]):.3g} > {float(bound[b]):.3g}"
            for b in bad_blocks[:MAX_LISTED_BLOCKS]
        )
        more = len(bad_blocks) - MAX_LISTED_BLOCKS
        tail = f", +{more} more" if more > 0 else ""
        reasons.append(
            f"rel-L2 over the bound alpha={tol.alpha:g}·faithful (floor={tol.floor:g} only where "
            f"the faithful error is zero) in {len(bad_blocks)} of {bad.numel()} row blocks "
            f"({listed}{tail})"
        )
    if not metrics.worst_row_cosine >= tol.min_row_cosine:
        reasons.append(
            f"worst-row cosine {metrics.worst_row_cosine:.6g} < {tol.min_row_cosine:g} "
            f"(row {metrics.worst_row})"
        )
    ratios = torch.where(bound > 0, y_blocks / bound.clamp_min(1e-300), y_blocks * math.inf)
    ratios = torch.nan_to_num(ratios, nan=math.inf)
    worst = int(torch.argmax(ratios)) if ratios.numel() else 0
    metrics = metrics.with_bounds(
        coarse_bound=float(bound[worst]) if bound.numel() else None,
        coarse_ratio=float(ratios[worst]) if ratios.numel() else None,
    )
    details = {
        "tolerance": tol.to_dict(),
        "failing_row_blocks": bad_blocks,
        "floor_blocks": int((bound == tol.floor).sum()) if faithful is not None else bad.numel(),
        "rows": int(as_rows(exact).shape[0]),
    }
    return reasons, details, metrics


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
    _check_tensor(y, "y", "judge")
    _check_tensor(exact, "exact", "judge")
    if faithful is not None:
        _check_tensor(faithful, "faithful", "judge")
    if tol is None:
        tol = DEFAULT_TOLERANCES["fp16"]
    if not isinstance(tol, Tolerance):
        raise TypeError(f"judge: tol must be a Tolerance, got {type(tol).__name__}")
    if tol.exact:
        return judge_exact(y, exact)
    reasons, details, metrics = _coarse(y, exact, faithful, tol)
    return Verdict(passed=not reasons, reasons=tuple(reasons), metrics=metrics, details=details)


# ------------------------------------------------------------------------------ validation


def _float_tensor(value: Any, arg: str, fn: str, dtypes: tuple | None = None) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{fn}: {arg} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{fn}: {arg} must be a floating tensor, got {value.dtype}")
    if dtypes is not None and value.dtype not in dtypes:
        wanted = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{fn}: {arg} must have dtype {wanted}, got {value.dtype}")
    return value


def _check_shape(value: torch.Tensor, shape: tuple[int, ...], arg: str, fn: str) -> None:
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{fn}: {arg} must have shape {list(shape)}, got {list(value.shape)}")


def _check_device(value: torch.Tensor, device: torch.device, arg: str, fn: str) -> None:
    if value.device != device:
        raise ValueError(f"{fn}: {arg} must be on {device}, got {value.device}")


def _compute_dtype(value: Any, fn: str) -> torch.dtype:
    if value not in COMPUTE_DTYPES:
        raise ValueError(
            f"{fn}: compute_dtype must be torch.float16 or torch.bfloat16, got {value!r}"
        )
    return value


def _tolerance(value: Any, compute_dtype: torch.dtype, fn: str) -> Tolerance:
    if value is None:
        return default_tolerance(_DTYPE_NAMES[compute_dtype])
    if not isinstance(value, Tolerance):
        raise TypeError(f"{fn}: tolerance must be a Tolerance, got {type(value).__name__}")
    return value


def _observed(value: Any, names: tuple[str, ...], fn: str) -> dict[str, torch.Tensor]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{fn}: observed must be a mapping of stage name -> tensor")
    unknown = set(value) - set(names)
    if unknown:
        raise ValueError(f"{fn}: observed has unknown stages {sorted(unknown)} (known: {names})")
    return dict(value)


# ------------------------------------------------------------------------------ verdicts


def _summarise(
    reports: dict[str, env.StageReport],
    coarse: tuple[list[str], dict[str, Any], Metrics],
    extra: dict[str, Any],
) -> Verdict:
    coarse_reasons, details, metrics = coarse
    reasons = list(coarse_reasons)
    for report in reports.values():
        reasons.extend(report.reasons)
    judged = [r for r in reports.values() if r.observed]
    bias = [r for r in judged if r.bias_applied]
    closest = None
    if bias:

        def margin(r: env.StageReport) -> float:
            worst = max(abs(r.bias_mean_ulp), abs(r.bias_signed_mean_ulp))
            return worst / r.bias_bound_ulp if r.bias_bound_ulp > 0 else math.inf

        closest = max(bias, key=margin)
    metrics = metrics.with_bounds(
        envelope_checked=sum(r.checked for r in judged),
        envelope_violations=sum(r.violations for r in judged),
        envelope_worst_ratio=max((r.worst_ratio for r in judged), default=0.0),
        envelope_worst_excess_ulp=max((r.worst_excess_ulp for r in judged), default=0.0),
        bias_mean_ulp=(
            None
            if closest is None
            else max(closest.bias_mean_ulp, closest.bias_signed_mean_ulp, key=abs)
        ),
        bias_bound_ulp=None if closest is None else closest.bias_bound_ulp,
    )
    details = {
        **details,
        **extra,
        "stages": {name: report.to_dict() for name, report in reports.items()},
        "model": {
            "lambda": env.LAMBDA,
            "kappa": env.KAPPA,
            "gamma_h": env.GAMMA_H,
            "bias_z": env.BIAS_Z,
            "bias_min_elements": env.BIAS_MIN_ELEMENTS,
        },
    }
    return Verdict(passed=not reasons, reasons=tuple(reasons), metrics=metrics, details=details)


def _values(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` rounded (correctly) into ``dtype``, as float64."""
    return env.round_values(t.detach(), dtype)


def _judged(
    stage: env.StageSet,
    observed: torch.Tensor | None,
    composed_into: str,
    rows: torch.Tensor | None = None,
) -> env.StageReport:
    if observed is None:
        return env.StageReport.not_observed(stage.name, composed_into)
    return env.check_stage(stage, observed, rows=rows)


def _operand(stage: env.StageSet, observed: torch.Tensor | None, dtype: torch.dtype) -> env.Bound:
    """The next stage's input in ``dtype``: the observed values, or (unobserved) the value a
    legitimate kernel stored, as :meth:`~oracle.envelope.StageSet.stored` models it."""
    if observed is not None:
        return env.Bound.exact(_values(observed, dtype))
    return stage.stored(dtype)


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
    cd = _compute_dtype(compute_dtype, fn)
    tol = _tolerance(tolerance, cd, fn)
    weight = _float_tensor(weight, "weight", fn)
    if weight.dim() != 2:
        raise ValueError(f"{fn}: weight must have shape [K, N], got {list(weight.shape)}")
    k, n = weight.shape
    x = _float_tensor(x, "x", fn)
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{fn}: x must have shape [..., {k}], got {list(x.shape)}")
    allowed = (cd, torch.float16) if cd == torch.bfloat16 else (cd,)
    y = _float_tensor(y, "y", fn, allowed)
    _check_shape(y, (*x.shape[:-1], n), "y", fn)
    device = weight.device
    _check_device(x, device, "x", fn)
    _check_device(y, device, "y", fn)
    then = (torch.float16,) if y.dtype != cd else ()
    a = _values(x.reshape(-1, k), cd)
    b = env.round_to(weight.detach(), cd)
    stage = env.stage_set("gemm", env.gemm_envelope(env.Bound.exact(a), b), cd, then=then)
    reports = {"gemm": env.check_stage(stage, y.reshape(-1, n))}
    exact = x.reshape(-1, k).to(torch.float64) @ weight.to(torch.float64)
    faithful = (a.to(torch.float32) @ b.to(torch.float32)).to(cd).to(y.dtype)
    del a, b
    coarse = _coarse(y.reshape(-1, n), exact, faithful, tol)
    return _summarise(reports, coarse, {"compute_dtype": str(cd), "k": k})


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
    from reference import linear as ref_linear

    cd = _compute_dtype(compute_dtype, fn)
    tol = _tolerance(tolerance, cd, fn)
    weight = _float_tensor(weight, "weight", fn, (torch.float16,))
    if weight.dim() != 2 or weight.shape[0] % 128 or weight.shape[1] % 128 or not weight.numel():
        raise ValueError(
            f"{fn}: weight must have shape [K, N] with K, N positive multiples of 128, got "
            f"{list(weight.shape)}"
        )
    k, n = weight.shape
    x = _float_tensor(x, "x", fn, (torch.float16, torch.bfloat16))
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{fn}: x must have shape [..., {k}], got {list(x.shape)}")
    y = _float_tensor(y, "y", fn, (x.dtype,))
    _check_shape(y, (*x.shape[:-1], n), "y", fn)
    suh = _float_tensor(suh, "suh", fn, (torch.float16,))
    svh = _float_tensor(svh, "svh", fn, (torch.float16,))
    _check_shape(suh, (k,), "suh", fn)
    _check_shape(svh, (n,), "svh", fn)
    if bias is not None:
        bias = _float_tensor(bias, "bias", fn, (torch.float16,))
        _check_shape(bias, (n,), "bias", fn)
    obs = _observed(observed, LINEAR_STAGES, fn)
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    shapes = {"rotated": ((m, k), (torch.float16,)), "gemm": ((m, n), (cd,))}
    device = weight.device
    named = {"x": x, "y": y, "suh": suh, "svh": svh, "bias": bias}
    for name, value in obs.items():
        shape, dtypes = shapes[name]
        named[f"observed[{name!r}]"] = _float_tensor(value, f"observed[{name!r}]", fn, dtypes)
        _check_shape(value, shape, f"observed[{name!r}]", fn)
    for name, value in named.items():
        if value is not None:
            _check_device(value, device, name, fn)

    f16 = torch.float16
    x16 = rows.to(f16)  # fp16 / bf16 -> fp16: one rounding
    product = (x16.to(torch.float32) * suh.to(torch.float32)).to(f16)  # exact product, rounded once
    rotated = env.stage_set("rotated", env.h128_bound(env.Bound.exact(product)), f16)
    reports = {"rotated": _judged(rotated, obs.get("rotated"), "gemm")}
    a = _operand(rotated, obs.get("rotated"), cd)
    gemm = env.stage_set("gemm", env.gemm_envelope(a, weight.to(cd)), cd)
    reports["gemm"] = _judged(gemm, obs.get("gemm"), "output")
    g16 = _operand(gemm, obs.get("gemm"), f16)
    output = _linear_output(env.h128_bound(g16), g16.sys, svh, bias, x.dtype)
    reports["output"] = env.check_stage(output, y.reshape(m, n))

    exact = ref_linear.forward_decoded(x, weight, suh, svh, bias, precision="exact")
    faithful = ref_linear.forward_decoded(
        x, weight, suh, svh, bias, precision="faithful", compute_dtype=cd
    )
    coarse = _coarse(y.reshape(m, n), exact.reshape(m, n), faithful.reshape(m, n), tol)
    extra = {"compute_dtype": str(cd), "k": k, "observed": sorted(obs)}
    return _summarise(reports, coarse, extra)


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


# ------------------------------------------------------------------------------ judge_moe


def _expert_source(experts: Any, topk_ids: torch.Tensor, fn: str):
    """``(ids, num_experts, source)`` for a reference stack: ``source(e)`` is expert ``e``'s
    ``(decoded weights, rotations, shared_input)``, called once per routed expert.

    ``MixedTierExperts`` routes by global ids: they are mapped to combined ids (``-1`` inactive)
    and each combined expert takes its payload from its tier and its rotations from the combined
    tables (:mod:`reference.tiers`). Any other stack must expose ``hidden_size``,
    ``num_experts``, ``w13``, ``w13_layout``, ``decode_expert(e)`` and ``expert_rotations(e)``."""
    from reference.tiers import MixedTierExperts

    if isinstance(experts, MixedTierExperts):
        ids = experts.combined_ids(topk_ids)

        def mixed_source(combined: int):
            tier, local = experts.tier_of(combined)
            stack = experts.tier0 if tier == 0 else experts.tier1
            rotations = experts.rotations.expert(combined)
            return stack.decode_expert(local), rotations, stack.w13_layout == "packed"

        return ids, experts.num_combined_experts, mixed_source
    required = ("hidden_size", "num_experts", "w13", "w13_layout")
    methods = ("decode_expert", "expert_rotations")
    missing = [a for a in required if not hasattr(experts, a)]
    missing += [a for a in methods if not callable(getattr(experts, a, None))]
    if missing:
        raise TypeError(
            f"{fn}: experts must be a reference expert stack (TrellisExperts, PairedExperts, "
            f"MixedTierExperts); {type(experts).__name__} lacks {missing}"
        )
    shared = experts.w13_layout == "packed"

    def source(expert: int):
        return experts.decode_expert(expert), experts.expert_rotations(expert), shared

    return topk_ids, experts.num_experts, source


class _RouteStages:
    """Route-order ``[R, F]`` legitimate sets of the observed MoE stages, filled per expert."""

    def __init__(self, routes: int, device: torch.device, wanted) -> None:
        self.routes, self.device, self.wanted = routes, device, set(wanted)
        self.parts: dict[str, dict[str, torch.Tensor]] = {}
        self.dtypes: dict[str, torch.dtype] = {}

    def put(self, stage: env.StageSet, index: torch.Tensor) -> None:
        if stage.name not in self.wanted:
            return  # only observed stages are judged per element (memory stays bounded)
        fields = ("lo", "hi", "centre", "rad", "sys")
        if stage.name not in self.parts:
            width = stage.lo.shape[1]
            self.parts[stage.name] = {
                f: torch.zeros(self.routes, width, dtype=torch.float64, device=self.device)
                for f in fields
            }
            self.dtypes[stage.name] = stage.dtype
        for f in fields:
            self.parts[stage.name][f].index_copy_(0, index, getattr(stage, f))

    def stage(self, name: str) -> env.StageSet | None:
        if name not in self.parts:
            return None
        p = self.parts[name]
        return env.StageSet(
            name, self.dtypes[name], p["lo"], p["hi"], p["centre"], p["rad"], p["sys"]
        )


def judge_moe(
    y: torch.Tensor,
    *,
    x: torch.Tensor,
    experts: Any,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    compute_dtype: torch.dtype,
    observed: Mapping[str, torch.Tensor] | None = None,
    tolerance: Tolerance | None = None,
) -> Verdict:
    """Judge the fused MoE (``reference.moe``'s faithful chain, §3.4) output ``y [M, H]``.

    ``x [M, H]`` fp16/bf16 (fp32 accepted), ``y`` in ``x.dtype``; ``topk_ids`` int32/int64
    ``[M, top_k]`` (global ids for ``MixedTierExperts``; ids outside the expert range are
    inactive and must contribute exactly zero), ``topk_weights [M, top_k]`` (used as fp32).
    ``observed`` may hold any of :data:`MOE_STAGES`, ``[M·top_k, F]`` in the compute dtype, in
    route order ``r = t·top_k + j`` (rows of inactive routes are ignored). Per route: the input
    rotations and the boundary (H128, ``svh``, SiLU with an approximate exp, ``down_suh``, H128)
    by their fp32 bounds, FC1 and FC2 by the GEMM model; per token: the fp32 top-k sum from +0
    and the store to ``x.dtype``."""
    fn = "judge_moe"
    from reference import moe as ref_moe
    from reference.routing import check_route_ids

    cd = _compute_dtype(compute_dtype, fn)
    tol = _tolerance(tolerance, cd, fn)
    x = _float_tensor(x, "x", fn, (torch.float16, torch.bfloat16, torch.float32))
    hidden = getattr(experts, "hidden_size", None)
    if x.dim() != 2 or (hidden is not None and x.shape[1] != hidden):
        raise ValueError(f"{fn}: x must have shape [M, {hidden}], got {list(x.shape)}")
    m, h = x.shape
    y = _float_tensor(y, "y", fn, (x.dtype,))
    _check_shape(y, (m, h), "y", fn)
    check_route_ids(topk_ids, "topk_ids")
    if topk_ids.shape[0] != m:
        raise ValueError(
            f"{fn}: topk_ids must have {m} rows (one per token), got {topk_ids.shape[0]}"
        )
    topk_weights = _float_tensor(topk_weights, "topk_weights", fn)
    _check_shape(topk_weights, tuple(topk_ids.shape), "topk_weights", fn)
    ids, num_experts, source = _expert_source(experts, topk_ids, fn)
    stack_device = getattr(getattr(experts, "tier0", experts), "w13", None)
    if isinstance(stack_device, torch.Tensor) and stack_device.device != x.device:
        raise ValueError(
            f"{fn}: experts must be on x's device {x.device}, got {stack_device.device}"
        )
    obs = _observed(observed, MOE_STAGES, fn)
    top_k = topk_ids.shape[1]
    routes = m * top_k
    device = x.device
    for name, value in (("y", y), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        _check_device(value, device, name, fn)
    for name, value in obs.items():
        arg = f"observed[{name!r}]"
        _float_tensor(value, arg, fn, (cd,))
        _check_device(value, device, arg, fn)
        if value.dim() != 2 or value.shape[0] != routes:
            raise ValueError(
                f"{fn}: {arg} must have shape [{routes}, F] (route order), got {list(value.shape)}"
            )

    flat_ids = ids.reshape(-1).to(torch.int64)
    active = (flat_ids >= 0) & (flat_ids < num_experts)
    weights32 = topk_weights.reshape(-1).to(torch.float32).to(torch.float64)
    weights32 = torch.where(active, weights32, torch.zeros_like(weights32))  # NaN never leaks
    sets = _RouteStages(routes, device, obs)
    fields = ("centre", "sound", "det", "var", "sys")
    terms = {f: torch.zeros(routes, h, dtype=torch.float64, device=device) for f in fields}
    fc2_sys, route_svh = torch.zeros_like(terms["sys"]), torch.zeros_like(terms["sys"])
    references = {  # the exact and faithful chains' unweighted route terms
        "exact": torch.zeros(routes, h, dtype=torch.float64, device=device),
        "faithful": torch.zeros(routes, h, dtype=torch.float32, device=device),
    }
    for expert in torch.unique(flat_ids[active]).tolist():
        index = torch.nonzero(active & (flat_ids == expert)).flatten()
        rows = x.index_select(0, index // top_k)
        decoded = source(expert)  # decoded once: the envelope and both references read it
        term, y_raw_sys, svh = _moe_expert(rows, decoded, index, obs, sets, cd)
        term = term.scale(weights32[index].unsqueeze(1))
        for f in fields:
            terms[f].index_copy_(0, index, getattr(term, f))
        fc2_sys.index_copy_(0, index, y_raw_sys)
        route_svh.index_copy_(0, index, svh.to(torch.float64).expand(index.numel(), h))
        weights_fp16, rotations, shared_input = decoded
        for precision, out in references.items():
            out.index_copy_(0, index, ref_moe.expert_route_term(
                rows, weights_fp16, rotations, shared_input=shared_input, precision=precision,
                compute_dtype=cd,
            ))  # fmt: skip
    output = _moe_reduce(env.Bound(**terms), active, m, top_k, x.dtype)
    if bool(fc2_sys.any()):
        token = torch.arange(routes, device=device) // top_k
        route_weight = weights32.abs().unsqueeze(1)

        def dual(weight: torch.Tensor) -> torch.Tensor:
            adjoint = env.exact_h128(weight.index_select(0, token) * route_svh).abs()
            return (fc2_sys * route_weight * adjoint).sum()

        output = dataclasses.replace(output, dual=dual)

    reports: dict[str, env.StageReport] = {}
    following = {
        "rotated_gate": "fc1",
        "rotated_up": "fc1",
        "fc1": "activated",
        "activated": "fc2",
        "fc2": "output",
    }
    for name in MOE_STAGES:
        stage = sets.stage(name)
        if name in obs and stage is not None:
            reports[name] = env.check_stage(stage, obs[name], rows=active)
        else:
            reports[name] = env.StageReport.not_observed(name, following[name])
    reports["output"] = env.check_stage(output, y)

    # reference.moe's step 5 over the route terms: its exact and faithful forwards, bit for bit
    slots = active.reshape(m, top_k)
    exact, faithful32 = (
        ref_moe.weighted_route_sum(references[p].reshape(m, top_k, h), slots, topk_weights)
        for p in ("exact", "faithful")
    )
    faithful = faithful32.to(x.dtype)  # fp32 -> x.dtype: one correct rounding
    coarse = _coarse(y, exact, faithful, tol)
    extra = {
        "compute_dtype": str(cd),
        "observed": sorted(obs),
        "active_routes": int(active.sum()),
        "routes": routes,
    }
    return _summarise(reports, coarse, extra)


def _moe_expert(rows, expert_data, index, obs, sets, cd):
    """Stages of one expert's routes; stores the stages' sets in ``sets``. Returns the route term
    ``H128(fc2) · down_svh`` as an fp32 :class:`~oracle.envelope.Bound` (before the weight), the
    directed error bound of the fc2 operand (zero when observed) and ``down_svh``."""
    (w_gate, w_up, w_down), rot, shared = expert_data
    f16 = torch.float16
    then = () if cd == f16 else (cd,)
    inter = w_gate.shape[1]

    def seen(name: str, cols: slice | None = None) -> torch.Tensor | None:
        value = obs.get(name)
        if value is None:
            return None
        value = value.index_select(0, index)
        return value if cols is None else value[:, cols]

    x16 = env.round_to(rows, f16) if rows.dtype != f16 else rows
    rotated = {}
    for name, suh in (("rotated_gate", rot.gate_suh), ("rotated_up", rot.up_suh)):
        if name == "rotated_up" and shared:
            rotated[name] = dataclasses.replace(rotated["rotated_gate"], name=name)
        else:
            product = (x16.to(torch.float32) * suh.to(torch.float32)).to(f16)
            bound = env.h128_bound(env.Bound.exact(product))
            rotated[name] = env.stage_set(name, bound, f16, then=then)
        sets.put(rotated[name], index)
    a_gate = _operand(rotated["rotated_gate"], seen("rotated_gate"), cd)
    # packed: one rotation feeds both halves (an observed rotated_up is judged against it)
    a_up = a_gate if shared else _operand(rotated["rotated_up"], seen("rotated_up"), cd)
    gate = env.stage_set("fc1", env.gemm_envelope(a_gate, w_gate.to(cd)), cd)
    up = env.stage_set("fc1", env.gemm_envelope(a_up, w_up.to(cd)), cd)
    fc1 = env.StageSet(
        "fc1",
        cd,
        *(
            torch.cat([getattr(gate, f), getattr(up, f)], dim=1)
            for f in ("lo", "hi", "centre", "rad", "sys")
        ),
    )
    sets.put(fc1, index)
    g_in = _operand(gate, seen("fc1", slice(0, inter)), cd)
    u_in = _operand(up, seen("fc1", slice(inter, 2 * inter)), cd)
    g = env.h128_bound(g_in).scale(rot.gate_svh)
    u = env.h128_bound(u_in).scale(rot.up_svh)
    a = g.silu().times(u).scale(rot.down_suh)
    activated = env.stage_set("activated", env.h128_bound(a), cd)
    sets.put(activated, index)
    a2 = _operand(activated, seen("activated"), cd)
    fc2 = env.stage_set("fc2", env.gemm_envelope(a2, w_down.to(cd)), cd)
    sets.put(fc2, index)
    y_raw = _operand(fc2, seen("fc2"), cd)
    return env.h128_bound(y_raw).scale(rot.down_svh), y_raw.sys, rot.down_svh


def _moe_reduce(terms: env.Bound, active, m, top_k, out_dtype) -> env.StageSet:
    """The fp32 top-k sum from +0 over the active slots (weighted terms, ``[M·top_k, H]``), then
    one rounding to ``out_dtype``. Inactive slots contribute exactly zero (their terms are 0)."""
    h = terms.centre.shape[1]
    count = active.reshape(m, top_k).sum(dim=1, keepdim=True).to(torch.float64)
    per_route = env.Bound(*(t.reshape(m, top_k, h) for t in dataclasses.astuple(terms)))
    bound = env.sum_bounds(per_route, dim=1, count=count)
    return env.stage_set("output", bound, out_dtype)


def judge_exact(a: torch.Tensor, b: torch.Tensor) -> Verdict:
    """``torch.equal`` semantics (same shape, same dtype, every element equal; NaN != NaN).

    On mismatch the reasons give the count and the first mismatching index (row-major)."""
    _check_tensor(a, "a", "judge_exact")
    _check_tensor(b, "b", "judge_exact")
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
