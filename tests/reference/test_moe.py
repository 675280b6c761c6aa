"""Fused trellis MoE reference (§3.4): exact forward vs a naive dense loop, inactive routes,
faithful rounding, near-cancelling rows and argument validation.

The independent expectation is built here: a Sylvester H128 from the popcount formula (not
reference.hadamard), dense per-expert matrices ``diag(suh) . Hk . Wq . Hn . diag(svh)`` from the
decoded tiles (FC1 gate/up decoded from the tile-column slices of the payload, not from the
module's own splitting), and a per-token, per-slot loop of ``silu(x Wg) * (x Wu) @ W2``: the §3.4
boundary algebra with the rotations folded into dense matrices.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from reference.moe import (
    TrellisExperts,
    expert_route_outputs,
    moe_forward,
    row_magnitude,
)
from reference.trellis import decode


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny float64 matmuls: one intra-op thread avoids oversubscribing the 2-core CI box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.cache
def sylvester_h128() -> torch.Tensor:
    h = [[(-1) ** bin(i & j).count("1") for j in range(128)] for i in range(128)]
    return torch.tensor(h, dtype=torch.float64) / math.sqrt(128)


def block_h(size: int) -> torch.Tensor:
    return torch.block_diag(*[sylvester_h128()] * (size // 128))


def random_scales(gen: torch.Generator, *shape: int) -> torch.Tensor:
    sign = torch.where(torch.rand(*shape, generator=gen) < 0.5, -1.0, 1.0)
    return (sign * (0.5 + torch.rand(*shape, generator=gen))).to(torch.float16)


def random_payload(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randint(-(2**15), 2**15, shape, generator=gen, dtype=torch.int64).to(torch.int16)


def make_experts(
    seed: int,
    num_experts: int,
    hidden: int,
    inter: int,
    *,
    layout: str,
    bits: int = 4,
    codebook: str = "mcg",
    broadcast: bool = False,
) -> TrellisExperts:
    gen = torch.Generator().manual_seed(seed)
    e, h16, i16, words = num_experts, hidden // 16, inter // 16, 16 * bits
    if layout == "packed":
        w13 = random_payload(gen, e, h16, 2 * i16, words)
        gate_suh = random_scales(gen, 1 if broadcast else e, hidden)
        up_suh = gate_suh.clone()
    else:
        w13 = random_payload(gen, 2, e, h16, i16, words)
        gate_suh = random_scales(gen, e, hidden)
        up_suh = random_scales(gen, 1 if broadcast else e, hidden)
    return TrellisExperts(
        w13=w13,
        w2=random_payload(gen, e, i16, h16, words),
        gate_suh=gate_suh,
        up_suh=up_suh,
        intermediate_rotations=random_scales(gen, e, 3 * inter),
        down_svh=random_scales(gen, 1 if broadcast else e, hidden),
        codebook=codebook,
        w13_layout=layout,
    )


def dense_linear(wq: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor) -> torch.Tensor:
    """``diag(suh) . Hk . Wq . Hn . diag(svh)``: the diagonal factors as row/column scalings."""
    k, n = wq.shape
    rotated = block_h(k) @ wq.double() @ block_h(n)
    return suh.double()[:, None] * rotated * svh.double()[None, :]


def dense_expert(ex: TrellisExperts, e: int):
    """(W_gate [H, I], W_up [H, I], W_down [I, H]) float64, built element-wise from the spec."""
    i = ex.intermediate_size
    i16 = i // 16
    if ex.w13_layout == "packed":
        wq_gate = decode(ex.w13[e, :, :i16].contiguous(), ex.codebook)
        wq_up = decode(ex.w13[e, :, i16:].contiguous(), ex.codebook)
    else:
        wq_gate = decode(ex.w13[0, e], ex.codebook)
        wq_up = decode(ex.w13[1, e], ex.codebook)
    wq_down = decode(ex.w2[e], ex.codebook)

    def row(table):
        return table[0] if table.shape[0] == 1 else table[e]

    rot = ex.intermediate_rotations[e]
    return (
        dense_linear(wq_gate, row(ex.gate_suh), rot[:i]),
        dense_linear(wq_up, row(ex.up_suh), rot[i : 2 * i]),
        dense_linear(wq_down, rot[2 * i :], row(ex.down_svh)),
    )


def naive_forward(x, ex: TrellisExperts, weights, ids) -> torch.Tensor:
    cache: dict[int, tuple] = {}
    out = torch.zeros(x.shape[0], ex.hidden_size, dtype=torch.float64)
    for t in range(x.shape[0]):
        xt = x[t].double()
        for s in range(ids.shape[1]):
            e = int(ids[t, s])
            if not 0 <= e < ex.num_experts:
                continue
            if e not in cache:
                cache[e] = dense_expert(ex, e)
            w_gate, w_up, w_down = cache[e]
            g, u = xt @ w_gate, xt @ w_up
            h = g * torch.sigmoid(g) * u
            out[t] += float(weights[t, s]) * (h @ w_down)
    return out


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def make_routes(seed, m, top_k, num_experts, dtype=torch.int64, inactive=True):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, num_experts, (m, top_k), generator=gen)
    if inactive and m > 1:
        ids[1, -1] = -1
    weights = torch.rand(m, top_k, generator=gen) + 0.1
    return weights, ids.to(dtype)


def make_x(seed, m, hidden):
    gen = torch.Generator().manual_seed(seed + 1000)
    return (0.5 * torch.randn(m, hidden, generator=gen)).to(torch.float16)


CASES = [
    # (num_experts, top_k, hidden, inter, broadcast, ids dtype)
    (8, 1, 128, 128, False, torch.int64),
    (8, 2, 256, 128, True, torch.int32),
    (8, 8, 128, 128, False, torch.int64),
    (64, 2, 256, 128, False, torch.int32),
    (64, 8, 128, 128, True, torch.int64),
]


@pytest.mark.parametrize("layout", ["packed", "proj"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"E{c[0]}-k{c[1]}-H{c[2]}-I{c[3]}")
def test_exact_forward_matches_naive_dense_loop(layout, case):
    num_experts, top_k, hidden, inter, broadcast, id_dtype = case
    seed = num_experts * 100 + top_k * 10 + hidden // 128
    ex = make_experts(seed, num_experts, hidden, inter, layout=layout, broadcast=broadcast)
    m = 5
    weights, ids = make_routes(seed, m, top_k, num_experts, id_dtype)
    x = make_x(seed, m, hidden)
    got = moe_forward(x, ex, weights, ids, precision="exact")
    assert got.dtype == torch.float64 and got.shape == (m, hidden)
    want = naive_forward(x, ex, weights, ids)
    assert rel_l2(got, want) < 1e-12
    assert float(want.norm()) > 0


def test_packed_layout_uses_columns_0_to_i_for_gate():
    """Swapping the two column halves of a packed w13 must change the result (gate != up)."""
    ex = make_experts(7, 4, 128, 128, layout="packed")
    i16 = ex.intermediate_size // 16
    swapped = TrellisExperts(
        w13=torch.cat([ex.w13[:, :, i16:], ex.w13[:, :, :i16]], dim=2),
        w2=ex.w2,
        gate_suh=ex.gate_suh,
        up_suh=ex.up_suh,
        intermediate_rotations=ex.intermediate_rotations,
        down_svh=ex.down_svh,
        codebook=ex.codebook,
        w13_layout="packed",
    )
    weights, ids = make_routes(7, 3, 2, 4, inactive=False)
    x = make_x(7, 3, 128)
    a = moe_forward(x, ex, weights, ids)
    b = moe_forward(x, swapped, weights, ids)
    assert rel_l2(a, naive_forward(x, ex, weights, ids)) < 1e-12
    assert rel_l2(b, a) > 1e-2


INACTIVE_INT64 = [-1, 16, 2**31, 2**32, -(2**33)]


@pytest.mark.parametrize("precision", ["exact", "faithful"])
def test_inactive_routes_contribute_exactly_zero(precision):
    num_experts = 16
    ex = make_experts(11, num_experts, 128, 128, layout="proj")
    weights, ids = make_routes(11, 6, 3, num_experts, inactive=False)
    x = make_x(11, 6, 128)
    # Baseline: slot 2 of every token is the -1 padding id.
    base_ids = ids.clone()
    base_ids[:, 2] = -1
    base = moe_forward(x, ex, weights, base_ids, precision=precision)
    # Removing the slot entirely (top_k 3 -> 2) gives the same bits.
    removed = moe_forward(x, ex, weights[:, :2], ids[:, :2], precision=precision)
    assert torch.equal(base, removed)
    for bad in INACTIVE_INT64:
        bad_ids = ids.clone()
        bad_ids[:, 2] = bad
        bad_weights = weights.clone()
        bad_weights[:, 2] = float("nan") if bad == 2**32 else 1e30
        snapshot = (x.clone(), bad_weights.clone(), bad_ids.clone())
        got = moe_forward(x, ex, bad_weights, bad_ids, precision=precision)
        assert torch.equal(got, base), bad
        assert torch.equal(x, snapshot[0])
        assert torch.equal(bad_weights.view(torch.int32), snapshot[1].view(torch.int32))
        assert torch.equal(bad_ids, snapshot[2])
    for bad in (-1, num_experts, -(2**31)):
        int32_ids = ids.to(torch.int32)
        int32_ids[:, 2] = bad
        assert torch.equal(moe_forward(x, ex, weights, int32_ids, precision=precision), base)


def test_fully_inactive_token_gives_a_zero_row():
    ex = make_experts(12, 8, 128, 128, layout="packed")
    weights, ids = make_routes(12, 4, 2, 8, inactive=False)
    ids[2] = torch.tensor([-1, 2**32])
    out = moe_forward(make_x(12, 4, 128), ex, weights, ids)
    assert torch.equal(out[2], torch.zeros(128, dtype=torch.float64))
    assert bool((out[[0, 1, 3]].abs().sum(dim=1) > 0).all())


@pytest.mark.parametrize("precision", ["exact", "faithful"])
def test_empty_batch(precision):
    ex = make_experts(13, 4, 128, 128, layout="proj")
    x = torch.zeros(0, 128, dtype=torch.float16)
    ids = torch.zeros(0, 2, dtype=torch.int64)
    out = moe_forward(x, ex, torch.zeros(0, 2), ids, precision=precision)
    assert out.shape == (0, 128)


@pytest.mark.parametrize("layout", ["packed", "proj"])
def test_faithful_is_close_to_exact_and_not_identical(layout):
    ex = make_experts(21, 8, 256, 128, layout=layout)
    weights, ids = make_routes(21, 8, 2, 8)
    x = make_x(21, 8, 256)
    exact = moe_forward(x, ex, weights, ids, precision="exact")
    fp16 = moe_forward(x, ex, weights, ids, precision="faithful")
    bf16 = moe_forward(x, ex, weights, ids, precision="faithful", compute_dtype=torch.bfloat16)
    assert fp16.dtype == torch.float32 and bf16.dtype == torch.float32
    err16, errbf = rel_l2(fp16, exact), rel_l2(bf16, exact)
    assert 0 < err16 < 1e-2
    assert not torch.equal(fp16.double(), exact)
    # bf16 operands carry 3 fewer mantissa bits than fp16: the error must grow accordingly.
    assert errbf < 5e-2 and errbf > 2 * err16


def replay_rounding_points(x, ex: TrellisExperts, weights, ids, elem) -> torch.Tensor:
    """§3.4's rounding points replayed per route with dense float64 H128 products (no butterfly,
    no fp32 GEMM): only the stores are rounded. Differs from a faithful pipeline by fp32-level
    noise and rare one-ulp store flips, but by ~1e-3 from one that skips a rounding point."""
    f64, i = torch.float64, ex.intermediate_size
    hb_h, hb_i = block_h(ex.hidden_size), block_h(i)

    def rnd(v, dtype):
        return v.to(dtype).to(f64)

    out = torch.zeros(x.shape[0], ex.hidden_size, dtype=f64)
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = int(ids[t, s])
            if not 0 <= e < ex.num_experts:
                continue
            rot = ex.expert_rotations(e)
            wq = [w.to(elem).to(f64) for w in ex.decode_expert(e)]
            x16 = rnd(x[t], torch.float16)
            a_g = rnd(rnd(x16 * rot.gate_suh.double(), torch.float16) @ hb_h, torch.float16)
            a_u = rnd(rnd(x16 * rot.up_suh.double(), torch.float16) @ hb_h, torch.float16)
            g = (rnd(rnd(a_g, elem) @ wq[0], elem) @ hb_i) * rot.gate_svh.double()
            u = (rnd(rnd(a_u, elem) @ wq[1], elem) @ hb_i) * rot.up_svh.double()
            a2 = rnd((g * torch.sigmoid(g) * u * rot.down_suh.double()) @ hb_i, elem)
            y_raw = rnd(a2 @ wq[2], elem)
            out[t] += float(weights[t, s]) * ((y_raw @ hb_h) * rot.down_svh.double())
    return out


@pytest.mark.parametrize("elem", [torch.float16, torch.bfloat16])
def test_faithful_rounding_points_match_an_independent_replay(elem):
    ex = make_experts(23, 4, 256, 128, layout="proj")
    weights, ids = make_routes(23, 6, 2, 4)
    x = make_x(23, 6, 256)
    exact = moe_forward(x, ex, weights, ids, precision="exact")
    faithful = moe_forward(x, ex, weights, ids, precision="faithful", compute_dtype=elem)
    replay = replay_rounding_points(x, ex, weights, ids, elem)
    close, far = rel_l2(faithful, replay), rel_l2(exact, replay)
    assert close < far / 10, (close, far)


def test_near_cancelling_rows_are_judged_against_route_magnitudes():
    """A row whose routes nearly cancel has a tiny exact norm, so its own rel-L2 says nothing.

    Expert 1 is expert 0 with ``down_svh`` negated and ``gate_svh`` perturbed by ~1e-3, so token
    0 (routes to 0 and 1, equal weights) nearly cancels while the rounding errors of the two
    routes stay uncorrelated. Per-row rel-L2 of that row blows up; the error normalised by the
    row's route magnitude ``sum_s |w_s| * ||c_s||`` (:func:`row_magnitude`) stays at the fp16
    level for every row. This is how worst rows must be judged.
    """
    base = make_experts(31, 4, 128, 128, layout="proj")
    gen = torch.Generator().manual_seed(31)
    inter = base.intermediate_size
    rotations = base.intermediate_rotations.clone()
    perturb = 1 + 1e-3 * torch.randn(inter, generator=gen)
    rotations[1] = rotations[0]
    rotations[1, :inter] = (rotations[0, :inter].double() * perturb).half()
    down_svh = base.down_svh.clone()
    down_svh[1] = -down_svh[0]
    proj = base.w13.clone()
    proj[:, 1] = proj[:, 0]
    w2 = base.w2.clone()
    w2[1] = w2[0]
    gate_suh, up_suh = base.gate_suh.clone(), base.up_suh.clone()
    gate_suh[1], up_suh[1] = gate_suh[0], up_suh[0]
    ex = TrellisExperts(proj, w2, gate_suh, up_suh, rotations, down_svh, "mcg", "proj")
    ids = torch.tensor([[0, 1], [2, 3], [0, 2], [1, 3]])
    weights = torch.full((4, 2), 0.5)
    x = make_x(31, 4, 128)
    exact = moe_forward(x, ex, weights, ids, precision="exact")
    faithful = moe_forward(x, ex, weights, ids, precision="faithful")
    routes, active = expert_route_outputs(x, ex, ids, precision="exact")
    magnitude = row_magnitude(routes, active, weights)
    assert magnitude.shape == (4,)
    assert float(exact[0].norm()) < 1e-2 * float(magnitude[0])  # it does nearly cancel
    row_err = (faithful.double() - exact).norm(dim=1)
    row_rel = row_err / exact.norm(dim=1)
    assert float(row_rel[0]) > 10 * float(row_rel[1:].max())
    assert float((row_err / magnitude).max()) < 1e-2


def test_row_magnitude_formula():
    routes = torch.tensor([[[3.0, 4.0], [1.0, 0.0]], [[0.0, 2.0], [6.0, 8.0]]], dtype=torch.float64)
    active = torch.tensor([[True, True], [True, False]])
    weights = torch.tensor([[-0.5, 2.0], [1.0, 7.0]])
    assert row_magnitude(routes, active, weights).tolist() == [0.5 * 5 + 2 * 1, 2.0]


def _replace(ex: TrellisExperts, **changes) -> TrellisExperts:
    fields = dict(
        w13=ex.w13,
        w2=ex.w2,
        gate_suh=ex.gate_suh,
        up_suh=ex.up_suh,
        intermediate_rotations=ex.intermediate_rotations,
        down_svh=ex.down_svh,
        codebook=ex.codebook,
        w13_layout=ex.w13_layout,
    )
    fields.update(changes)
    return TrellisExperts(**fields)


def test_bad_experts_name_the_argument():
    ex = make_experts(41, 2, 128, 128, layout="proj")
    with pytest.raises(ValueError, match="w13"):  # H = 64
        _replace(ex, w13=ex.w13[:, :, :4].contiguous())
    with pytest.raises(ValueError, match="w13"):  # I = 64
        _replace(ex, w13=ex.w13[:, :, :, :4].contiguous())
    with pytest.raises(ValueError, match="w2"):  # bits differ from w13
        _replace(ex, w2=ex.w2[..., :48].contiguous())
    nan = ex.gate_suh.clone()
    nan[1, 5] = float("nan")
    with pytest.raises(ValueError, match="gate_suh"):
        _replace(ex, gate_suh=nan)
    inf = ex.intermediate_rotations.clone()
    inf[0, 0] = float("inf")
    with pytest.raises(ValueError, match="intermediate_rotations"):
        _replace(ex, intermediate_rotations=inf)
    with pytest.raises(TypeError, match="down_svh"):
        _replace(ex, down_svh=ex.down_svh.float())
    with pytest.raises(ValueError, match="down_svh"):
        _replace(ex, down_svh=ex.down_svh[:, :64])
    with pytest.raises(ValueError, match="codebook"):
        _replace(ex, codebook="sqg_fp16")  # legal only at 5..6 bits
    with pytest.raises(ValueError, match="w13_layout"):
        _replace(ex, w13_layout="gated")
    with pytest.raises(ValueError, match="w13"):  # a proj tensor declared as packed
        _replace(ex, w13_layout="packed")
    packed = make_experts(41, 2, 128, 128, layout="packed")
    with pytest.raises(ValueError, match="up_suh"):
        _replace(packed, up_suh=-packed.up_suh)


def test_bad_forward_inputs_name_the_argument():
    ex = make_experts(42, 4, 128, 128, layout="packed")
    weights, ids = make_routes(42, 3, 2, 4)
    x = make_x(42, 3, 128)
    with pytest.raises(TypeError, match="topk_ids"):
        moe_forward(x, ex, weights, ids.float())
    with pytest.raises(ValueError, match="topk_weights"):
        moe_forward(x, ex, weights[:, :1], ids)
    with pytest.raises(ValueError, match="topk_ids"):
        moe_forward(x, ex, weights[0], ids[0])
    with pytest.raises(ValueError, match="topk_ids"):
        moe_forward(x[:2], ex, weights, ids)
    with pytest.raises(ValueError, match="x"):
        moe_forward(x[:, :64], ex, weights, ids)
    with pytest.raises(ValueError, match="precision"):
        moe_forward(x, ex, weights, ids, precision="fast")
    with pytest.raises(ValueError, match="compute_dtype"):
        moe_forward(x, ex, weights, ids, compute_dtype=torch.float32)
    with pytest.raises(TypeError, match="experts"):
        moe_forward(x, object(), weights, ids)


@pytest.mark.parametrize("layout", ["packed", "proj"])
@pytest.mark.parametrize(
    "expert, error, match",
    [(-1, ValueError, r"expert: -1 is outside \[0, 3\)"), (3, ValueError, r"outside \[0, 3\)"),
     (True, TypeError, "expert: expected int, got bool"), (1.0, TypeError, "got float")],
)  # fmt: skip
def test_an_expert_index_outside_the_stack_is_refused(layout, expert, error, match):
    """A negative index is refused, never read as the last expert (Python's -1)."""
    experts = make_experts(0, 3, 128, 128, layout=layout)
    with pytest.raises(error, match=match):
        experts.expert_rotations(expert)
    with pytest.raises(error, match=match):
        experts.decode_expert(expert)
    experts.expert_rotations(2)  # the last one is an expert


@pytest.mark.parametrize("weights", [None, "ones", [[1.0]]])
def test_forward_refuses_route_weights_that_are_not_a_tensor(weights):
    experts = make_experts(0, 3, 128, 128, layout="packed")
    x = torch.ones(1, 128, dtype=torch.float16)
    ids = torch.zeros(1, 1, dtype=torch.int64)
    with pytest.raises(TypeError, match="topk_weights"):
        moe_forward(x, experts, weights, ids)
