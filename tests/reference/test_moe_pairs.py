"""reference.moe_pairs: the paired MoE equals the uniform one where the layout says it must, and
dynamic mode tables pick the kind per expert.

Expectations are built from other reference pieces, never from the function under test:
P33 ≡ uniform K3 is derived from reference.pairs' own record constructor (make_pair_payload)
and interleave; the forward is compared with reference.moe.moe_forward on a TrellisExperts.
"""

from __future__ import annotations

import pytest
import torch

from reference import pairs
from reference.moe import TrellisExperts, moe_forward
from reference.moe_pairs import (
    PairedExperts,
    expert_kinds,
    p33_from_uniform,
    paired_moe_forward,
    paired_route_outputs,
)
from reference.trellis import decode

H, I, E = 128, 256, 4
CB = "mcg"


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _payload(g, *shape):
    return torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32).to(torch.int16)


def _scales(g, rows, width):
    sign = torch.where(torch.rand(rows, width, generator=g) < 0.5, -1.0, 1.0)
    return (sign * (0.8 + 0.4 * torch.rand(rows, width, generator=g))).half()


def _uniform(layout, seed=0, e=E, i=I):
    g = _gen(seed)
    w13 = _payload(g, e, H // 16, 2 * i // 16, 48) if layout == "packed" else _payload(
        g, 2, e, H // 16, i // 16, 48)  # fmt: skip
    gate = _scales(g, e, H)
    up = gate if layout == "packed" else _scales(g, e, H)
    return TrellisExperts(
        w13, _payload(g, e, i // 16, H // 16, 48), gate, up, _scales(g, e, 3 * i),
        _scales(g, 1, H), CB, layout,
    )  # fmt: skip


def _routes(m, top_k, seed, e=E):
    g = _gen(seed)
    x = (0.5 * torch.randn(m, H, generator=g)).half()
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)])
    return x, torch.rand(m, top_k, generator=g), ids


@pytest.mark.parametrize("axis", ["k", "n"])
def test_p33_payload_is_the_uniform_payload_recut(axis):
    g = _gen(1)
    k, n = (512, 128) if axis == "k" else (128, 512)
    t = _payload(g, k // 16, n // 16, 48)
    # One pair = two 8-tile records cut from the uniform stack along the rate axis.
    records = []
    for p in range(2):
        if axis == "k":
            lo, hi = t[16 * p : 16 * p + 8], t[16 * p + 8 : 16 * p + 16]
        else:
            lo, hi = t[:, 16 * p : 16 * p + 8], t[:, 16 * p + 8 : 16 * p + 16]
        records.append(pairs.make_pair_payload(lo.contiguous(), hi.contiguous(), axis))
    reference_order = torch.cat(records)
    prepared = pairs.to_prepared(reference_order, ("P33", "P33"), axis, 128)
    assert torch.equal(prepared, t.reshape(-1))  # prepared P33 == flattened uniform K3
    assert torch.equal(p33_from_uniform(t, axis), prepared)
    assert torch.equal(p33_from_uniform(t, axis, layout="reference"), reference_order)
    for layout, payload in (("prepared", prepared), ("reference", reference_order)):
        got = pairs.decode_pair(payload, ("P33", "P33"), axis, 128, CB, layout=layout)
        assert torch.equal(got, decode(t, CB))


def _p33_stack(uniform, *, fc1=True, fc2=True, order="prepared"):
    e, i = uniform.num_experts, uniform.intermediate_size
    w13, w2 = uniform.w13, uniform.w2
    if fc1:
        if uniform.w13_layout == "packed":
            w13 = torch.stack([p33_from_uniform(w13[x], "n", layout=order) for x in range(e)])
        else:
            w13 = torch.stack([
                torch.stack([p33_from_uniform(w13[p, x], "n", layout=order) for x in range(e)])
                for p in (0, 1)
            ])  # fmt: skip
    if fc2:
        w2 = torch.stack([p33_from_uniform(w2[x], "k") for x in range(e)])
    assert i % 256 == 0
    return PairedExperts(
        w13, w2, uniform.gate_suh, uniform.up_suh, uniform.intermediate_rotations,
        uniform.down_svh, CB, uniform.w13_layout, "P33" if fc1 else None,
        "P33" if fc2 else None, fc1_order=order,
    )  # fmt: skip


@pytest.mark.parametrize(
    "layout, fc1, fc2, order",
    [
        ("proj", True, True, "prepared"),
        ("packed", True, True, "reference"),
        ("proj", True, False, "reference"),
        ("packed", False, True, "prepared"),
    ],
)
def test_p33_moe_equals_uniform_k3_moe(layout, fc1, fc2, order):
    uniform = _uniform(layout, seed=2)
    paired = _p33_stack(uniform, fc1=fc1, fc2=fc2, order=order)
    x, w, ids = _routes(5, 2, seed=3)
    ids[1, 0] = -1  # an inactive route
    for precision, dtype in (("exact", torch.float16), ("faithful", torch.bfloat16)):
        want = moe_forward(x, uniform, w, ids, precision=precision, compute_dtype=dtype)
        got = paired_moe_forward(x, paired, w, ids, precision=precision, compute_dtype=dtype)
        assert torch.equal(got, want), precision


def _dynamic_stack(layout, modes1, modes2, seed=4):
    g = _gen(seed)
    base = _uniform(layout, seed=seed)
    words = (H // 16) * (I // 256) * 128 * 6
    w13 = _payload(g, E, 2 * words) if layout == "packed" else _payload(g, 2, E, words)
    w2 = _payload(g, E, words)

    def stack(fc1, fc2, m1=None, m2=None):
        return PairedExperts(
            w13, w2, base.gate_suh, base.up_suh, base.intermediate_rotations, base.down_svh,
            CB, layout, fc1, fc2, m1, m2,
        )  # fmt: skip

    if modes1 is None:
        return stack, None
    return stack, stack("dynamic", "dynamic" if modes2 is not None else "P24", modes1, modes2)


@pytest.mark.parametrize("layout", ["proj", "packed"])
def test_modes_pick_the_kind_per_expert(layout):
    modes1 = torch.tensor([0, 1, 1, 0], dtype=torch.int32)
    modes2 = torch.tensor([1, 1, 0, 0], dtype=torch.int64)
    stack, dynamic = _dynamic_stack(layout, modes1, modes2)
    kinds = ("P33", "P24")
    assert expert_kinds(dynamic) == [
        (kinds[a], kinds[b]) for a, b in zip(modes1, modes2, strict=True)
    ]
    static = {(a, b): stack(a, b) for a in kinds for b in kinds}
    x, w, ids = _routes(8, 1, seed=5)
    ids[:, 0] = torch.arange(8) % E  # every expert, top-1: each row is one expert's output
    got = paired_moe_forward(x, dynamic, w, ids, precision="exact")
    # Same batch, same grouping per expert: each row equals the static stack of its modes.
    full = {key: paired_moe_forward(x, s, w, ids, precision="exact") for key, s in static.items()}
    for t in range(8):
        e = int(ids[t, 0])
        assert torch.equal(got[t], full[kinds[modes1[e]], kinds[modes2[e]]][t]), t
    # The kinds really differ on the same payload (the modes are not a no-op).
    p33 = paired_moe_forward(x, static["P33", "P33"], w, ids, precision="exact")
    p24 = paired_moe_forward(x, static["P24", "P24"], w, ids, precision="exact")
    assert not torch.allclose(p33, p24)


def test_p24_records_decode_at_their_own_rates():
    stack, _ = _dynamic_stack("proj", None, None, seed=6)
    experts = stack("P24", "P24")
    gate, up, down = experts.decode_expert(2)
    lo2, hi2 = pairs.split_records(experts.w2[2], "P24", "k", H)[0]
    assert torch.equal(down[:128], decode(lo2, CB)) and torch.equal(down[128:], decode(hi2, CB))
    ref_up = pairs.deinterleave_n_axis(experts.w13[1, 2], "P24", H)
    lo1, hi1 = pairs.split_records(ref_up, "P24", "n", H)[0]
    assert torch.equal(up[:, :128], decode(lo1, CB)) and torch.equal(up[:, 128:], decode(hi1, CB))


def test_route_outputs_mark_inactive_routes():
    stack, _ = _dynamic_stack("proj", None, None, seed=7)
    x, _, ids = _routes(3, 2, seed=8)
    ids[0, 1] = E  # the drop bucket
    outs, active = paired_route_outputs(x, stack("P24", "P24"), ids)
    assert not active[0, 1] and torch.equal(outs[0, 1], torch.zeros(H, dtype=outs.dtype))
    assert bool(active.sum() == 5)


def test_paired_experts_reject_bad_inputs():
    stack, dynamic = _dynamic_stack("proj", torch.zeros(E, dtype=torch.int32), None, seed=9)
    ok = dict(vars(dynamic))
    ok.pop("_uniform")

    def build(**changes):
        return PairedExperts(**{**ok, "fc2_pair": "P24", **changes})

    build()  # valid
    with pytest.raises(ValueError, match="fc1_pair"):
        build(fc1_pair="P55")
    with pytest.raises(ValueError, match="fc1_modes: mode values"):
        build(fc1_modes=torch.tensor([0, 2, 0, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match="fc1_modes: expected shape"):
        build(fc1_modes=torch.zeros(E + 1, dtype=torch.int32))
    with pytest.raises(TypeError, match="fc1_modes"):
        build(fc1_modes=torch.zeros(E))
    with pytest.raises(ValueError, match="fc2_modes: only a dynamic"):
        build(fc2_modes=torch.zeros(E, dtype=torch.int32))
    with pytest.raises(ValueError, match="w2: expected shape"):
        build(fc2_pair="P44")  # 8 bits per coefficient pair, the payload holds 6
    with pytest.raises(ValueError, match="w13: expected shape"):
        build(w13=ok["w13"][:, :, :-16].contiguous())
    half = ok["intermediate_rotations"][:, : 3 * 128].contiguous()
    with pytest.raises(ValueError, match="whole number of pairs"):
        build(intermediate_rotations=half)
    with pytest.raises(ValueError, match="w2: an unpaired FC2"):
        build(fc2_pair=None)  # a pair payload where the uniform [E, I/16, H/16, 16b] belongs
    with pytest.raises(ValueError, match="rate_axis"):
        p33_from_uniform(torch.zeros(16, 16, 48, dtype=torch.int16), "m")
