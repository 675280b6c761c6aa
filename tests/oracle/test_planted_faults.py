"""The planted-fault table: legitimate reorderings the judges must pass, kernel bugs
they must flag.

"Kernel outputs" are the reference's faithful chain (:mod:`reference.linear`,
:mod:`reference.moe` stage functions) with the GEMMs replayed in another fp32 order or with a
fault injected at one stage. Summation orders, emulated on exact float64 products (every product
of two fp16 or two bf16 values is exact in fp32):

==================  =========================================================================
``fp64_round``      float64 sum, one rounding (cuBLAS-like wide accumulation)
``reversed``        recursive fp32 (round to nearest) from k = K-1 down to 0
``pairwise``        fp32 pairwise tree
``tensor_core``     exact 16-wide K16 sums added into an fp32 accumulator **truncated toward
                    zero** (mma.sync-style normalisation)
``split_k{2,4,8}``  contiguous K splits, each recursive fp32, reduced in split order
``intra_cta{2,8}``  contiguous K16 slices per warp group, each tensor-core, partials added in
                    group order (b12x's MoE intra-CTA K split)
==================  =========================================================================

Faults: one wrong decoded weight, +1 ulp on every element, a round-toward-zero epilogue, one
16×16 output tile ×1.01, one K16 slice dropped in one N16 tile, a dropped top-8 route carrying
0.6 % of the weight, a token row ×1.01. Each case asserts the verdict and that the
element-wise model (a stage's set or its bias gate), not only the coarse gate, flagged it.
"""

from __future__ import annotations

import functools
import hashlib
import math

import pytest
import torch

from oracle.judge import envelope as env
from oracle.judge.tolerance import judge_gemm, judge_linear, judge_moe
from reference import linear as ref_linear
from reference import moe as ref_moe
from reference.hadamard import apply_blockwise_faithful
from reference.moe import TrellisExperts
from reference.trellis import decode

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
DTYPES = {"fp16": F16, "bf16": BF16}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Small tensors: one intra-op thread avoids oversubscribing the 2-core CI box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----------------------------------------------------------------------- summation orders


def _products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[K, M, N]`` products ``a[m, k]·b[k, n]`` in float64 (exact for compute-dtype values)."""
    return a.to(F64).t()[:, :, None] * b.to(F64)[:, None, :]


def _recursive(t: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    t32 = t.to(F32)  # exact
    acc = torch.zeros(t.shape[1:], dtype=F32)
    for k in reversed(range(t.shape[0])) if reverse else range(t.shape[0]):
        acc = acc + t32[k]
    return acc.to(F64)


def _pairwise(t: torch.Tensor) -> torch.Tensor:
    v = t.to(F32)
    while v.shape[0] > 1:
        if v.shape[0] % 2:
            v = torch.cat([v, torch.zeros_like(v[:1])])
        v = v[0::2] + v[1::2]
    return v[0].to(F64)


def _tensor_core(t: torch.Tensor) -> torch.Tensor:
    acc = torch.zeros(t.shape[1:], dtype=F64)
    for start in range(0, t.shape[0], 16):
        acc = env.round_values(acc + t[start : start + 16].sum(0), F32, mode="toward_zero")
    return acc


def _reduce(parts: list[torch.Tensor]) -> torch.Tensor:
    acc = torch.zeros_like(parts[0], dtype=F32)
    for part in parts:
        acc = acc + part.to(F32)
    return acc.to(F64)


def _split(t: torch.Tensor, splits: int, inner) -> torch.Tensor:
    rows = t.shape[0] // 16
    bounds = [16 * (rows * s // splits) for s in range(splits + 1)]
    return _reduce([inner(t[bounds[s] : bounds[s + 1]]) for s in range(splits)])


ORDERS = {
    "fp64_round": lambda t: t.sum(0),
    "reversed": lambda t: _recursive(t, reverse=True),
    "pairwise": _pairwise,
    "tensor_core": _tensor_core,
    "split_k2": lambda t: _split(t, 2, _recursive),
    "split_k4": lambda t: _split(t, 4, _recursive),
    "split_k8": lambda t: _split(t, 8, _recursive),
    "intra_cta2": lambda t: _split(t, 2, _tensor_core),
    "intra_cta8": lambda t: _split(t, 8, _tensor_core),
}


def _content(t: torch.Tensor) -> tuple:
    """A key for a tensor's dtype, shape and exact bytes."""
    t = t.detach().contiguous()
    digest = hashlib.blake2b(t.view(torch.uint8).numpy().tobytes(), digest_size=16).digest()
    return t.dtype, tuple(t.shape), digest


#: kernel_gemm's results by operand contents and arguments: a fault planted at one expert or at
#: the output stage leaves every other GEMM of the emulated kernel bit-identical, so each
#: distinct GEMM is emulated once per process (the emulation is a pure function of these).
_GEMMS: dict[tuple, torch.Tensor] = {}


def kernel_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    cd: torch.dtype,
    *,
    order: str = "tensor_core",
    epilogue: str = "nearest",
    drop_k16: tuple[int, int] | None = None,
) -> torch.Tensor:
    """An emulated GEMM kernel: compute-dtype operands, ``order`` accumulation, one rounding in
    ``epilogue`` mode. ``drop_k16 = (kt, nt)`` skips K16 slice ``kt`` in N16 tile ``nt``."""
    key = (_content(a), _content(b), cd, order, epilogue, drop_k16)
    if key not in _GEMMS:
        _GEMMS[key] = _emulated_gemm(a, b, cd, order, epilogue, drop_k16)
    return _GEMMS[key].clone()  # callers own their copy


def _emulated_gemm(a, b, cd, order, epilogue, drop_k16) -> torch.Tensor:
    a = env.round_values(a, cd)
    b = env.round_values(b, cd)
    t = _products(a, b)
    if drop_k16 is not None:
        kt, nt = drop_k16
        t[16 * kt : 16 * kt + 16, :, 16 * nt : 16 * nt + 16] = 0.0
    return env.round_to(ORDERS[order](t), cd, mode=epilogue)


def plus_one_ulp(y: torch.Tensor) -> torch.Tensor:
    y64 = y.to(F64)
    return env.round_to(y64 + env.ulp(y64, y.dtype), y.dtype)


def scaled(y: torch.Tensor, rows: slice, cols: slice, factor: float = 1.01) -> torch.Tensor:
    out = y.to(F64)
    out[rows, cols] = out[rows, cols] * factor
    return env.round_to(out, y.dtype)


def _element_gate_flagged(verdict, stage: str | None = None) -> bool:
    stages = verdict.details["stages"]
    names = [stage] if stage else list(stages)
    return any(stages[n]["reasons"] for n in names)


# ----------------------------------------------------------------------- judge_gemm


GEMM_KS = (128, 1024, 8192)


@functools.cache
def gemm_case(dtype_name: str, k: int, data: str = "randn"):
    """``x [M, K]``, a decoded trellis weight ``[K, N]`` (fp16), the float64 products and the
    faithful output (torch's fp32 GEMM)."""
    g = torch.Generator().manual_seed(k + (7 if dtype_name == "bf16" else 0))
    m, n = (8, 64) if k == 8192 else (16, 128)
    payload = torch.randint(-(2**15), 2**15, (k // 16, n // 16, 48), generator=g, dtype=torch.int32)
    weight = decode(payload.to(torch.int16), "mcg")
    x = torch.randn(m, k, generator=g)
    if data == "positive":  # every product >= 0: the accumulation error is all directed
        x, weight = x.abs(), weight.abs()
    cd = DTYPES[dtype_name]
    x = x.to(cd)
    return x, weight, cd


GEMM_LEGIT = [
    pytest.param(dt, k, order, data, id=f"{dt}-K{k}-{order}-{data}")
    for dt in DTYPES
    for k in GEMM_KS
    for order, data in [*((o, "randn") for o in ORDERS), ("tensor_core", "positive")]
    + [("reversed", "positive"), ("intra_cta8", "positive")]
]


@pytest.mark.parametrize("dtype_name, k, order, data", GEMM_LEGIT)
def test_gemm_legitimate_orders_pass(dtype_name, k, order, data):
    x, weight, cd = gemm_case(dtype_name, k, data)
    y = kernel_gemm(x, weight, cd, order=order)
    verdict = judge_gemm(y, x, weight, compute_dtype=cd)
    assert verdict.passed, verdict.reason
    assert verdict.metrics.envelope_violations == 0
    assert verdict.details["stages"]["gemm"]["bias_applied"]


def _gemm_fault(name: str, x, weight, cd) -> torch.Tensor:
    y = kernel_gemm(x, weight, cd)
    if name == "plus_one_ulp":
        return plus_one_ulp(y)
    if name == "round_toward_zero":
        return kernel_gemm(x, weight, cd, epilogue="toward_zero")
    if name == "tile_x1.01":
        return scaled(y, slice(0, 16), slice(16, 32))
    if name == "k16_dropped":
        return kernel_gemm(x, weight, cd, drop_k16=(x.shape[1] // 32, 1))
    raise AssertionError(name)


GEMM_FAULTS = ("plus_one_ulp", "round_toward_zero", "tile_x1.01", "k16_dropped")


@pytest.mark.parametrize("fault", GEMM_FAULTS)
@pytest.mark.parametrize("k", GEMM_KS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_gemm_faults_fail(dtype_name, k, fault):
    x, weight, cd = gemm_case(dtype_name, k)
    verdict = judge_gemm(_gemm_fault(fault, x, weight, cd), x, weight, compute_dtype=cd)
    assert not verdict.passed
    assert _element_gate_flagged(verdict, "gemm"), verdict.reason


def wrong_weight_trials(x, weight, cd, trials: int, seed: int):
    """Plant one wrong decoded weight (another value of the same matrix: one the decoder
    produces) at a random place, ``trials`` times. Returns per trial (caught, shift_over_noise):
    the largest ``|x[m, k]·Δw|`` over the affected column in units of that element's
    legitimate radius plus one ulp, the size a fault needs to leave the set."""
    g = torch.Generator().manual_seed(seed)
    a = env.round_values(x, cd)
    b = env.round_values(weight, cd)
    stage = env.stage_set("gemm", env.gemm_envelope(env.Bound.exact(a), b), cd)
    noise = stage.rad + env.ulp(stage.centre, cd)
    k, n = weight.shape
    flat = weight.reshape(-1)
    out = []
    for _ in range(trials):
        k0 = int(torch.randint(k, (1,), generator=g))
        n0 = int(torch.randint(n, (1,), generator=g))
        value = flat[int(torch.randint(flat.numel(), (1,), generator=g))]
        while value == weight[k0, n0]:
            value = flat[int(torch.randint(flat.numel(), (1,), generator=g))]
        bad = weight.clone()
        bad[k0, n0] = value
        y = (a.to(F32) @ env.round_values(bad, cd).to(F32)).to(cd)  # the kernel's GEMM
        caught = not judge_gemm(y, x, weight, compute_dtype=cd).passed
        delta = float(env.round_values(value.reshape(1), cd) - b[k0, n0])
        shift = (a[:, k0] * delta).abs()
        out.append((caught, float((shift / noise[:, n0]).max())))
    return out


WRONG_WEIGHT = [
    # dtype, K, rows M, trials, the least caught fraction asserted (measured in the docstring)
    ("fp16", 1024, 16, 60, 0.95),
    ("bf16", 1024, 16, 60, 0.9),
    ("fp16", 8192, 8, 30, 0.9),
    ("bf16", 8192, 8, 30, 0.85),
    ("fp16", 1024, 1, 60, 0.85),
    ("bf16", 1024, 1, 60, 0.7),
]


@pytest.mark.parametrize(
    "dtype_name, k, m, trials, least",
    WRONG_WEIGHT,
    ids=[f"{d}-K{k}-M{m}" for d, k, m, _, _ in WRONG_WEIGHT],
)
def test_gemm_one_wrong_weight_is_caught_unless_below_the_rounding_noise(
    dtype_name, k, m, trials, least
):
    """A wrong weight moves one output column by ``x[:, k0]·Δw``. It is caught whenever that
    shift exceeds the element's legitimate radius plus an ulp in some row; every miss is a
    trial whose shift stays below that noise in every row (a small ``|Δw|``: the replacement is
    a nearby codebook value; or small ``|x[:, k0]|``): no gate that passes every legitimate
    order can see it. More rows give the fault more chances. Measured caught fractions (200 /
    80 trials): M = 16: fp16 K1024 99.5 %, bf16 K1024 100 %; M = 8: fp16 K8192 100 %, bf16
    K8192 97.5 %; M = 1: fp16 K1024 97 %, bf16 K1024 86 %, fp16 K8192 91 %, bf16 K8192 74 %."""
    x, weight, cd = gemm_case(dtype_name, k)
    results = wrong_weight_trials(x[:m], weight, cd, trials, seed=k + m)
    caught = sum(c for c, _ in results) / trials
    assert caught >= least, (caught, results)
    for was_caught, size in results:
        if not was_caught:
            assert size < 1.0, f"a miss {size:.2f}× the noise: {results}"
        if size > 2.0:
            assert was_caught, results


# ----------------------------------------------------------------------- judge_linear


@functools.cache
def linear_case(dtype_name: str, k: int):
    g = torch.Generator().manual_seed(100 + k + (1 if dtype_name == "bf16" else 0))
    n, m = 256, 16
    payload = torch.randint(-(2**15), 2**15, (k // 16, n // 16, 64), generator=g, dtype=torch.int32)
    weight = decode(payload.to(torch.int16), "mcg")
    suh = ((torch.rand(k, generator=g) + 0.5) * torch.sign(torch.randn(k, generator=g))).half()
    svh = (torch.rand(n, generator=g) * 0.02 + 0.01).half()
    bias = (torch.randn(n, generator=g) * 0.05).half()
    x = torch.randn(m, k, generator=g).to(DTYPES[dtype_name])
    return x, weight, suh, svh, bias, DTYPES[dtype_name]


def linear_kernel(x, weight, suh, svh, bias, cd, *, order="tensor_core", fault=None):
    """The dense linear with its GEMM in ``order`` and an optional fault; returns ``(y,
    observed)``. Faults: ``wrong_weight``, ``gemm:*`` (at the GEMM stage: ``plus_one_ulp``,
    ``round_toward_zero``, ``tile_x1.01``, ``k16_dropped``), ``output:*`` (``plus_one_ulp``,
    ``round_toward_zero``, ``tile_x1.01``, ``row_x1.01``)."""
    rotated = ref_linear.faithful_input_rotation(x, suh)
    w = weight
    if fault == "wrong_weight":
        w = weight.clone()
        w[x.shape[1] // 3, 70] = (
            weight[5, 200] if weight[5, 200] != weight[x.shape[1] // 3, 70] else 0
        )
    epilogue = "toward_zero" if fault == "gemm:round_toward_zero" else "nearest"
    drop = (3, 2) if fault == "gemm:k16_dropped" else None
    gemm = kernel_gemm(rotated, w, cd, order=order, epilogue=epilogue, drop_k16=drop)
    if fault == "gemm:plus_one_ulp":
        gemm = plus_one_ulp(gemm)
    if fault == "gemm:tile_x1.01":
        gemm = scaled(gemm, slice(0, 16), slice(32, 48))
    o1 = apply_blockwise_faithful(gemm.to(F16)).to(F16)
    if fault == "output:round_toward_zero":  # the store epilogue truncates
        o2 = env.round_to(o1.to(F64) * svh.to(F64), F16, mode="toward_zero")
        o3 = env.round_to(env.round_values(o2.to(F64) + bias.to(F64), F32), F16, mode="toward_zero")
    else:
        o2 = (o1.to(F32) * svh.to(F32)).to(F16)
        o3 = (o2.to(F32) + bias.to(F32)).to(F16)
    y = o3.to(x.dtype)
    if fault == "output:plus_one_ulp":
        y = plus_one_ulp(y)
    if fault == "output:tile_x1.01":
        y = scaled(y, slice(0, 16), slice(128, 144))
    if fault == "output:row_x1.01":
        y = scaled(y, slice(5, 6), slice(None))
    return y, {"rotated": rotated, "gemm": gemm}


LINEAR_KS = (256, 2048)
OBSERVED = {"none": (), "all": ("rotated", "gemm")}


@pytest.mark.parametrize("seen", list(OBSERVED))
@pytest.mark.parametrize("order", ["tensor_core", "split_k4", "fp64_round"])
@pytest.mark.parametrize("k", LINEAR_KS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_linear_legitimate_orders_pass(dtype_name, k, order, seen):
    x, weight, suh, svh, bias, cd = linear_case(dtype_name, k)
    y, stages = linear_kernel(x, weight, suh, svh, bias, cd, order=order)
    observed = {name: stages[name] for name in OBSERVED[seen]}
    verdict = judge_linear(
        y, x=x, weight=weight, suh=suh, svh=svh, bias=bias, compute_dtype=cd, observed=observed
    )
    assert verdict.passed, verdict.reason
    reported = verdict.details["stages"]
    recovered = set() if "gemm" in observed else {"gemm_recovered"}
    assert set(reported) == {"rotated", "gemm", "output"} | recovered
    judged = set(observed) | {"output"} | recovered
    assert all(reported[s]["observed"] == (s in judged) for s in reported)


LINEAR_FAULTS = [
    # fault, observed stages, the stage whose gate must flag it
    ("wrong_weight", "none", "output"),
    ("wrong_weight", "all", "gemm"),
    ("gemm:plus_one_ulp", "all", "gemm"),
    ("gemm:round_toward_zero", "all", "gemm"),
    ("gemm:tile_x1.01", "none", "output"),
    ("gemm:tile_x1.01", "all", "gemm"),
    ("gemm:k16_dropped", "none", "output"),
    ("gemm:k16_dropped", "all", "gemm"),
    ("output:plus_one_ulp", "none", "output"),
    ("output:plus_one_ulp", "all", "output"),
    ("output:round_toward_zero", "none", "output"),
    ("output:round_toward_zero", "all", "output"),
    ("output:tile_x1.01", "none", "output"),
    ("output:row_x1.01", "all", "output"),
]


@pytest.mark.parametrize(
    "fault, seen, stage", LINEAR_FAULTS, ids=[f"{f}-observed_{s}" for f, s, _ in LINEAR_FAULTS]
)
@pytest.mark.parametrize("k", LINEAR_KS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_linear_faults_fail(dtype_name, k, fault, seen, stage):
    x, weight, suh, svh, bias, cd = linear_case(dtype_name, k)
    y, stages = linear_kernel(x, weight, suh, svh, bias, cd, fault=fault)
    observed = {name: stages[name] for name in OBSERVED[seen]}
    verdict = judge_linear(
        y, x=x, weight=weight, suh=suh, svh=svh, bias=bias, compute_dtype=cd, observed=observed
    )
    assert not verdict.passed
    assert _element_gate_flagged(verdict, stage), verdict.reason


@pytest.mark.parametrize("dtype_name, least_unobserved", [("fp16", 0.9), ("bf16", 0.7)])
def test_linear_one_wrong_weight_trials(dtype_name, least_unobserved):
    """One wrong decoded weight at random places in the dense linear (K = 2048, M = 16): with the
    GEMM stage observed every trial is caught; unobserved, the fault reaches ``y`` through the
    output H128 (spread over 128 outputs at 1/√128 of its size) against the rounding noise of
    the unobserved GEMM, and the smallest ones hide in it. Measured (30 trials): observed 100 %
    (fp16, bf16); unobserved fp16 97 %, bf16 80 % (the old floor-decided rule: 67 %, 0 %)."""
    x, weight, suh, svh, bias, cd = linear_case(dtype_name, 2048)
    g = torch.Generator().manual_seed(5)
    flat = weight.reshape(-1)
    caught = {"none": 0, "gemm": 0}
    trials = 16
    for _ in range(trials):
        k0, n0 = (
            int(torch.randint(2048, (1,), generator=g)),
            int(torch.randint(256, (1,), generator=g)),
        )
        value = flat[int(torch.randint(flat.numel(), (1,), generator=g))]
        bad = weight.clone()
        bad[k0, n0] = value if value != weight[k0, n0] else 0
        rotated = ref_linear.faithful_input_rotation(x, suh)
        gemm = ref_linear.faithful_gemm_compute(rotated, bad, compute_dtype=cd)
        y = ref_linear.faithful_output_rotation(gemm.to(F16), svh, bias).to(x.dtype)
        for seen, observed in (("none", {}), ("gemm", {"gemm": gemm})):
            verdict = judge_linear(
                y, x=x, weight=weight, suh=suh, svh=svh, bias=bias, compute_dtype=cd,
                observed=observed,
            )  # fmt: skip
            caught[seen] += not verdict.passed
    assert caught["gemm"] == trials
    assert caught["none"] >= least_unobserved * trials, caught


def _one_wrong_weight_at_one_row(dtype_name: str, trials: int, seed: int):
    """``trials`` single wrong decoded weights at random places (K = 2048, M = 1), each judged
    with the GEMM unobserved; yields ``(verdict, caught by the observed GEMM judge)``."""
    x, weight, suh, svh, bias, cd = linear_case(dtype_name, 2048)
    x = x[:1]
    g = torch.Generator().manual_seed(seed)
    flat = weight.reshape(-1)
    rotated = ref_linear.faithful_input_rotation(x, suh)
    for _ in range(trials):
        k0 = int(torch.randint(2048, (1,), generator=g))
        n0 = int(torch.randint(256, (1,), generator=g))
        value = flat[int(torch.randint(flat.numel(), (1,), generator=g))]
        bad = weight.clone()
        bad[k0, n0] = value if value != weight[k0, n0] else 0
        gemm = ref_linear.faithful_gemm_compute(rotated, bad, compute_dtype=cd)
        y = ref_linear.faithful_output_rotation(gemm.to(F16), svh, bias).to(x.dtype)
        args = dict(x=x, weight=weight, suh=suh, svh=svh, bias=bias, compute_dtype=cd)
        observed = judge_linear(y, **args, observed={"gemm": gemm})
        yield judge_linear(y, **args), not observed.passed


@pytest.mark.parametrize("dtype_name, least, only_recovered", [("fp16", 24, 3), ("bf16", 9, 0)])
def test_linear_one_wrong_weight_at_one_token_row(dtype_name, least, only_recovered):
    """At M = 1 the output H128 spreads a wrong GEMM value over 128 outputs at 1/√128 of its
    size; the judge undoes the rotation (``gemm_recovered``) and holds the GEMM values to their
    set widened by the output chain's rounding noise. 24 trials (seed 7): fp16 all caught, 3 of
    them by the recovered stage alone (the output check passes them), as many as with the GEMM
    observed; bf16 9 (observed: 21): the bf16 output cast rounds away what a small wrong weight
    adds. Every fault the recovered stage flags is one the observed GEMM judge flags too.
    Planted: the recovery's noise bound 100x wider fails the fp16 row."""
    caught = recovered_only = 0
    for verdict, observed_caught in _one_wrong_weight_at_one_row(dtype_name, 24, seed=7):
        stages = verdict.details["stages"]
        flagged = stages["gemm_recovered"]["violations"] > 0
        caught += not verdict.passed
        recovered_only += flagged and stages["output"]["violations"] == 0
        assert observed_caught or not flagged
    assert caught >= least and recovered_only >= only_recovered, (caught, recovered_only)


# ----------------------------------------------------------------------- judge_moe

H, I, E, TOP_K, M = 256, 256, 8, 8, 16


def _scales(g, rows, width):
    sign = torch.where(torch.rand(rows, width, generator=g) < 0.5, -1.0, 1.0)
    return (sign * (0.5 + torch.rand(rows, width, generator=g))).half()


@functools.cache
def moe_case(layout: str = "proj"):
    g = torch.Generator().manual_seed(11)

    def payload(*shape):
        return torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32).to(torch.int16)

    if layout == "packed":
        w13 = payload(E, H // 16, 2 * I // 16, 48)
        gate = _scales(g, E, H)
        up = gate
    else:
        w13 = payload(2, E, H // 16, I // 16, 48)
        gate, up = _scales(g, E, H), _scales(g, E, H)
    experts = TrellisExperts(
        w13, payload(E, I // 16, H // 16, 48), gate, up, _scales(g, E, 3 * I), _scales(g, 1, H),
        "mcg", layout,
    )  # fmt: skip
    x = (0.5 * torch.randn(M, H, generator=g)).half()
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(M)])
    weights = torch.rand(M, TOP_K, generator=g) + 0.2
    weights[3, 5] = 0.0  # token 3, slot 5 will carry 0.6 % of the token's weight
    weights[3, 5] = 0.006 / 0.994 * weights[3].sum()
    weights = weights / weights.sum(dim=1, keepdim=True)
    return experts, x, weights, ids


DROPPED_ROUTE = (3, 5)


def moe_kernel(x, experts, weights, ids, cd, *, order="tensor_core", fault=None):
    """The fused MoE with its GEMMs in ``order`` and an optional fault; returns ``(y,
    observed)`` with the route-order stages. Faults: ``wrong_weight:fc1`` / ``wrong_weight:fc2``
    (expert 2's decoded matrix), ``fc1:tile_x1.01``, ``fc2:round_toward_zero``,
    ``fc2:k16_dropped``, ``output:plus_one_ulp``, ``output:round_toward_zero``,
    ``dropped_route``, ``output:row_x1.01``."""
    m, top_k = ids.shape
    routes = m * top_k
    stages: dict[str, torch.Tensor] = {}
    terms = torch.zeros(routes, x.shape[1], dtype=F32)
    flat = ids.reshape(-1)
    for e in range(experts.num_experts):
        index = torch.nonzero(flat == e).flatten()
        if not index.numel():
            continue
        gate_w, up_w, down_w = experts.decode_expert(e)
        if e == 2 and fault == "wrong_weight:fc1":
            gate_w = gate_w.clone()
            gate_w[40, 17] = gate_w[41, 99] if gate_w[41, 99] != gate_w[40, 17] else 0
        if e == 2 and fault == "wrong_weight:fc2":
            down_w = down_w.clone()
            down_w[40, 17] = down_w[41, 99] if down_w[41, 99] != down_w[40, 17] else 0
        rot = experts.expert_rotations(e)
        x16 = x.index_select(0, index // top_k).to(F16)
        a_gate = ref_moe.faithful_rotate_input(x16, rot.gate_suh, compute_dtype=cd)
        shared = experts.w13_layout == "packed"
        a_up = (
            a_gate if shared else ref_moe.faithful_rotate_input(x16, rot.up_suh, compute_dtype=cd)
        )
        gate = kernel_gemm(a_gate, gate_w, cd, order=order)
        up = kernel_gemm(a_up, up_w, cd, order=order)
        fc1 = torch.cat([gate, up], dim=1)
        if fault == "fc1:tile_x1.01" and e == 2:
            fc1 = scaled(fc1, slice(0, 16), slice(16, 32))
        a2 = ref_moe.faithful_activate(fc1[:, :I], fc1[:, I:], rot, compute_dtype=cd)
        epilogue = "toward_zero" if fault == "fc2:round_toward_zero" else "nearest"
        drop = (2, 3) if fault == "fc2:k16_dropped" and e == 2 else None
        fc2 = kernel_gemm(a2, down_w, cd, order=order, epilogue=epilogue, drop_k16=drop)
        values = {"rotated_gate": a_gate, "rotated_up": a_up, "fc1": fc1, "activated": a2}
        values["fc2"] = fc2
        for name, value in values.items():
            if name not in stages:
                stages[name] = torch.zeros(routes, value.shape[1], dtype=cd)
            stages[name][index] = value
        terms[index] = ref_moe.faithful_route_term(fc2, rot.down_svh)
    acc = torch.zeros(m, x.shape[1], dtype=F32)
    w32 = weights.to(F32)
    for slot in range(top_k):
        term = terms.reshape(m, top_k, -1)[:, slot] * w32[:, slot : slot + 1]
        if fault == "dropped_route":
            term[DROPPED_ROUTE[0]] = 0.0 if slot == DROPPED_ROUTE[1] else term[DROPPED_ROUTE[0]]
        acc = acc + term
    mode = "toward_zero" if fault == "output:round_toward_zero" else "nearest"
    y = env.round_to(acc.to(F64), x.dtype, mode=mode)
    if fault == "output:plus_one_ulp":
        y = plus_one_ulp(y)
    if fault == "output:row_x1.01":
        y = scaled(y, slice(7, 8), slice(None))
    return y, stages


MOE_OBSERVED = {"none": (), "all": ref_moe.ROUTE_STAGES[:-1], "fc2": ("fc2",)}


@pytest.mark.parametrize(
    "dtype_name, layout, order, seen",
    [
        ("fp16", "proj", "tensor_core", "none"),
        ("fp16", "proj", "tensor_core", "all"),
        ("fp16", "packed", "split_k2", "none"),
        ("fp16", "packed", "reversed", "all"),
        ("bf16", "proj", "tensor_core", "all"),
        ("bf16", "packed", "intra_cta2", "none"),
    ],
)
def test_moe_legitimate_orders_pass(dtype_name, layout, order, seen):
    experts, x, weights, ids = moe_case(layout)
    cd = DTYPES[dtype_name]
    y, stages = moe_kernel(x, experts, weights, ids, cd, order=order)
    observed = {name: stages[name] for name in MOE_OBSERVED[seen]}
    verdict = judge_moe(
        y, x=x, experts=experts, topk_weights=weights, topk_ids=ids, compute_dtype=cd,
        observed=observed,
    )  # fmt: skip
    assert verdict.passed, verdict.reason
    assert verdict.details["stages"]["output"]["checked"] == y.numel()


MOE_FAULTS = [
    # fault, dtype, observed stages, the stage whose gate must flag it
    ("wrong_weight:fc1", "fp16", "all", "fc1"),
    ("wrong_weight:fc2", "fp16", "all", "fc2"),
    ("wrong_weight:fc2", "fp16", "none", "output"),
    ("wrong_weight:fc2", "bf16", "all", "fc2"),
    ("fc1:tile_x1.01", "fp16", "all", "fc1"),
    ("fc1:tile_x1.01", "bf16", "all", "fc1"),
    ("fc2:round_toward_zero", "fp16", "all", "fc2"),
    ("fc2:round_toward_zero", "bf16", "all", "fc2"),
    ("fc2:k16_dropped", "fp16", "none", "output"),
    ("fc2:k16_dropped", "bf16", "all", "fc2"),
    ("output:plus_one_ulp", "fp16", "none", "output"),
    ("output:plus_one_ulp", "bf16", "fc2", "output"),
    ("output:round_toward_zero", "fp16", "none", "output"),
    ("output:round_toward_zero", "bf16", "fc2", "output"),
    ("dropped_route", "fp16", "none", "output"),
    ("dropped_route", "fp16", "fc2", "output"),
    ("dropped_route", "bf16", "fc2", "output"),
    ("output:row_x1.01", "fp16", "none", "output"),
    ("output:row_x1.01", "bf16", "fc2", "output"),
]


@pytest.mark.parametrize(
    "fault, dtype_name, seen, stage",
    MOE_FAULTS,
    ids=[f"{f}-{d}-observed_{s}" for f, d, s, _ in MOE_FAULTS],
)
def test_moe_faults_fail(fault, dtype_name, seen, stage):
    experts, x, weights, ids = moe_case("proj")
    cd = DTYPES[dtype_name]
    y, stages = moe_kernel(x, experts, weights, ids, cd, fault=fault)
    observed = {name: stages[name] for name in MOE_OBSERVED[seen]}
    verdict = judge_moe(
        y, x=x, experts=experts, topk_weights=weights, topk_ids=ids, compute_dtype=cd,
        observed=observed,
    )  # fmt: skip
    assert not verdict.passed
    assert _element_gate_flagged(verdict, stage), verdict.reason


def test_the_dropped_route_carries_six_permille_of_the_weight_and_the_old_row_rule_missed_it():
    """The planted route is the issue's case: the b12x MoE tests' row rule (row error ≤ 1e-2 ×
    Σ|w|·‖route‖) accepts it, the judge does not (test_moe_faults_fail)."""
    experts, x, weights, ids = moe_case("proj")
    t, slot = DROPPED_ROUTE
    assert weights[t, slot] == pytest.approx(0.006, rel=1e-6)
    y, _ = moe_kernel(x, experts, weights, ids, F16, fault="dropped_route")
    outs, active = ref_moe.stack_route_outputs(x, experts, ids, precision="faithful")
    faithful = ref_moe.weighted_route_sum(outs, active, weights)
    scale = ref_moe.row_magnitude(outs, active, weights)
    row_err = (y.double() - faithful.double()).norm(dim=1)
    assert bool((row_err <= 1e-2 * scale + 1e-6).all())  # the old rule passes the bug
    assert math.isfinite(float(row_err[t])) and float(row_err[t]) > 0


def test_moe_one_wrong_fc1_weight_needs_fc1_observed():
    """One wrong FC1 weight of one expert (480 ulps in one fc1 column of its 16 routes) reaches
    the output through H128, SiLU, H128, FC2 and H128: spread over every output element, it
    moves ``y`` by less than the legitimate rounding noise (rel-L2 ~4e-4 against the faithful
    reference's ~6e-4), so only an observed ``fc1`` (or ``activated``) stage can show it. The
    judge catches it there."""
    experts, x, weights, ids = moe_case("proj")
    y, stages = moe_kernel(x, experts, weights, ids, F16, fault="wrong_weight:fc1")
    good, _ = moe_kernel(x, experts, weights, ids, F16)
    exact = ref_moe.stack_moe_forward(x, experts, weights, ids, precision="exact")
    shift = float((y.double() - good.double()).norm() / exact.norm())
    noise = float((good.double() - exact).norm() / exact.norm())
    assert 0 < shift < noise
    observed = {name: stages[name] for name in MOE_OBSERVED["all"]}
    verdict = judge_moe(
        y, x=x, experts=experts, topk_weights=weights, topk_ids=ids, compute_dtype=F16,
        observed=observed,
    )  # fmt: skip
    assert not verdict.passed and _element_gate_flagged(verdict, "fc1"), verdict.reason
