"""Tests for reference.pairs: QSRT pair payload layouts, decode, interleave, pair layers (§4.2-4.4).

Expected matrices are built tile by tile here: each 16x16 tile is cut from the payload at an
offset computed by hand from the spec's layout, decoded alone with reference.trellis.decode at
its record's rate, and placed at the logical position the spec names.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.pytest_plugin import scaled_examples
from reference import pairs
from reference.linear import forward, reconstruct
from reference.pairs import (
    PAIR_KINDS,
    PairedLinear,
    decode_pair,
    deinterleave_n_axis,
    interleave_n_axis,
    make_pair_payload,
    pair_forward,
    pair_payload_length,
    random_pair_payload,
)
from reference.trellis import decode, pack

RATES = {"P22": (2, 2), "P33": (3, 3), "P24": (2, 4), "P43": (4, 3), "P44": (4, 4)}


def tile_from_payload(payload, offset, bits, codebook):
    words = payload[offset : offset + 16 * bits].reshape(1, 1, 16 * bits)
    return decode(words, codebook)


def elementwise_decode(payload, kind, rate_axis, orth, codebook):
    """One pair, reference order, tile by tile (§4.2 / §4.4)."""
    b_lo, b_hi = RATES[kind]
    rec_words = [(orth // 16) * 8 * 16 * b for b in (b_lo, b_hi)]
    if rate_axis == "k":
        out = torch.empty(256, orth, dtype=torch.float16)
    else:
        out = torch.empty(orth, 256, dtype=torch.float16)
    for record, bits in enumerate((b_lo, b_hi)):
        base = 0 if record == 0 else rec_words[0]
        for a in range(8 if rate_axis == "k" else orth // 16):
            for b in range(orth // 16 if rate_axis == "k" else 8):
                if rate_axis == "k":  # a = K16 row inside the record, b = N16 tile
                    offset = base + (a * (orth // 16) + b) * 16 * bits
                    rows, cols = 16 * (8 * record + a), 16 * b
                else:  # a = K16 row, b = N16 tile inside the record
                    offset = base + (a * 8 + b) * 16 * bits
                    rows, cols = 16 * a, 16 * (8 * record + b)
                out[rows : rows + 16, cols : cols + 16] = tile_from_payload(
                    payload, offset, bits, codebook
                )
    return out


def test_pair_kind_vocabulary_matches_spec():
    assert PAIR_KINDS == RATES


@pytest.mark.parametrize("kind", sorted(RATES))
@pytest.mark.parametrize("orth", [128, 256, 3584])
def test_payload_length_rule(kind, orth):
    b_lo, b_hi = RATES[kind]
    assert pair_payload_length(kind, orth) == (orth // 16) * 8 * 16 * (b_lo + b_hi)


def test_payload_length_matches_atom_section_bytes():
    # §4.2: one atom's matrix section is 43,008 B at H = 3584 for a 6-bit pair; 8 atoms = 1 pair.
    for kind in ("P33", "P24"):
        assert pair_payload_length(kind, 3584) * 2 == 8 * 43008


@settings(deadline=None, max_examples=scaled_examples(12))
@given(
    kind=st.sampled_from(sorted(RATES)),
    rate_axis=st.sampled_from(["k", "n"]),
    orth=st.sampled_from([128, 256]),
    codebook=st.sampled_from(["mcg", "sqg_e4m3"]),
    seed=st.integers(0, 2**16),
)
def test_decode_pair_matches_elementwise_construction(kind, rate_axis, orth, codebook, seed):
    payload = random_pair_payload(kind, rate_axis, orth, torch.Generator().manual_seed(seed))
    got = decode_pair(payload, kind, rate_axis, orth, codebook)
    expected = elementwise_decode(payload, kind, rate_axis, orth, codebook)
    assert got.shape == ((256, orth) if rate_axis == "k" else (orth, 256))
    assert torch.equal(got, expected)


def test_prepared_n_layout_is_k16_major_low_then_high():
    kind, k = "P24", 256
    payload = random_pair_payload(kind, "n", k, torch.Generator().manual_seed(1))
    lo_row, hi_row = 8 * 16 * 2, 8 * 16 * 4
    record0 = payload[: (k // 16) * lo_row]
    record1 = payload[(k // 16) * lo_row :]
    expected = torch.cat(
        [
            torch.cat(
                [record0[kt * lo_row : (kt + 1) * lo_row], record1[kt * hi_row : (kt + 1) * hi_row]]
            )
            for kt in range(k // 16)
        ]
    )
    prepared = interleave_n_axis(payload, kind, k)
    assert torch.equal(prepared, expected)
    assert not torch.equal(prepared, payload)
    assert torch.equal(deinterleave_n_axis(prepared, kind, k), payload)
    ref = decode_pair(payload, kind, "n", k, "mcg")
    assert torch.equal(decode_pair(prepared, kind, "n", k, "mcg", layout="prepared"), ref)


@settings(deadline=None, max_examples=scaled_examples(10))
@given(
    kinds=st.lists(st.sampled_from(sorted(RATES)), min_size=1, max_size=3),
    k=st.sampled_from([128, 384]),
    seed=st.integers(0, 2**16),
)
def test_interleave_round_trip(kinds, k, seed):
    payload = random_pair_payload(kinds, "n", k, torch.Generator().manual_seed(seed))
    assert torch.equal(deinterleave_n_axis(interleave_n_axis(payload, kinds, k), kinds, k), payload)


def test_k_axis_prepared_layout_is_zero_copy():
    payload = random_pair_payload("P24", "k", 128, torch.Generator().manual_seed(2))
    assert pairs.to_prepared(payload, "P24", "k", 128) is payload
    assert torch.equal(
        decode_pair(payload, "P24", "k", 128, "mcg", layout="prepared"),
        decode_pair(payload, "P24", "k", 128, "mcg"),
    )


def test_k_axis_low_high_selection_discriminates():
    # P33: both planes have the same size, so swapping them is a valid payload; rows 0..127 must
    # follow record 0 and rows 128..255 record 1.
    payload = random_pair_payload("P33", "k", 128, torch.Generator().manual_seed(3))
    half = payload.numel() // 2
    swapped = torch.cat([payload[half:], payload[:half]])
    w = decode_pair(payload, "P33", "k", 128, "mcg")
    w_swapped = decode_pair(swapped, "P33", "k", 128, "mcg")
    assert not torch.equal(w, w_swapped)
    assert torch.equal(w_swapped[:128], w[128:]) and torch.equal(w_swapped[128:], w[:128])
    # P24: rows 0..127 are record 0 at 2 bits, rows 128..255 record 1 at 4 bits.
    p24 = random_pair_payload("P24", "k", 128, torch.Generator().manual_seed(4))
    lo_words = 8 * 8 * 16 * 2
    w24 = decode_pair(p24, "P24", "k", 128, "mcg")
    assert torch.equal(w24[:128], decode(p24[:lo_words].view(8, 8, 32), "mcg"))
    assert torch.equal(w24[128:], decode(p24[lo_words:].view(8, 8, 64), "mcg"))


def test_make_pair_payload_from_packed_symbols():
    g = torch.Generator().manual_seed(5)
    sym_lo = torch.randint(0, 4, (16, 8, 256), generator=g)  # n axis: [K/16, 8, 256], 2 bits
    sym_hi = torch.randint(0, 16, (16, 8, 256), generator=g)  # 4 bits
    rec0, rec1 = pack(sym_lo, 2), pack(sym_hi, 4)
    payload = make_pair_payload(rec0, rec1, "n")
    assert payload.numel() == pair_payload_length("P24", 256)
    got = decode_pair(payload, "P24", "n", 256, "sqg_e4m3")
    expected = torch.cat([decode(rec0, "sqg_e4m3"), decode(rec1, "sqg_e4m3")], dim=1)
    assert torch.equal(got, expected)


def test_several_pairs_concatenate_pair_major():
    kinds = ("P24", "P33")
    g = torch.Generator().manual_seed(6)
    p0 = random_pair_payload("P24", "n", 128, g)
    p1 = random_pair_payload("P33", "n", 128, g)
    payload = torch.cat([p0, p1])
    got = decode_pair(payload, kinds, "n", 128, "mcg")
    expected = torch.cat(
        [
            elementwise_decode(p0, "P24", "n", 128, "mcg"),
            elementwise_decode(p1, "P33", "n", 128, "mcg"),
        ],
        dim=1,
    )
    assert torch.equal(got, expected)
    # Prepared: per K16 row, pair 0 (low ‖ high) then pair 1 (low ‖ high).
    prepared = interleave_n_axis(payload, kinds, 128)
    row0 = torch.cat(
        [
            p0[: 8 * 32],
            p0[8 * 8 * 32 : 8 * 8 * 32 + 8 * 64],
            p1[: 8 * 48],
            p1[8 * 8 * 48 : 8 * 8 * 48 + 8 * 48],
        ]
    )
    assert torch.equal(prepared[: row0.numel()], row0)
    assert torch.equal(decode_pair(prepared, kinds, "n", 128, "mcg", layout="prepared"), got)


@pytest.mark.parametrize("rate_axis", ["k", "n"])
def test_pair_forward_exact_matches_explicit_reconstruction(rate_axis):
    g = torch.Generator().manual_seed(7)
    orth = 128
    k, n = (256, orth) if rate_axis == "k" else (orth, 256)
    payload = random_pair_payload("P24", rate_axis, orth, g)
    suh = (torch.randn(k, generator=g) * 0.05).to(torch.float16)
    svh = (torch.randn(n, generator=g) * 0.05).to(torch.float16)
    x = torch.randn(3, k, generator=g).to(torch.float16)
    wq = elementwise_decode(payload, "P24", rate_axis, orth, "mcg").double()
    h = torch.tensor(
        [[(-1.0) ** bin(i & j).count("1") for j in range(128)] for i in range(128)],
        dtype=torch.float64,
    ) / np.sqrt(128.0)
    hk, hn = torch.block_diag(*[h] * (k // 128)), torch.block_diag(*[h] * (n // 128))
    w_hat = torch.diag(suh.double()) @ hk @ wq @ hn @ torch.diag(svh.double())
    y = pair_forward(x, payload, "P24", rate_axis, suh, svh, "mcg")
    assert torch.allclose(y, x.double() @ w_hat, rtol=1e-10, atol=1e-12)
    layer = PairedLinear(payload, "P24", rate_axis, suh, svh, "mcg")
    assert torch.allclose(reconstruct(layer), w_hat, rtol=1e-12, atol=1e-15)
    faithful = pair_forward(x, payload, "P24", rate_axis, suh, svh, "mcg", "faithful")
    rel = (faithful.double() - y).norm() / y.norm()
    assert faithful.dtype == torch.float16 and 0 < rel < 4 * 2.0**-11


def test_two_k_axis_pairs_stack_on_the_reduction_axis():
    g = torch.Generator().manual_seed(9)
    p0, p1 = random_pair_payload("P24", "k", 128, g), random_pair_payload("P33", "k", 128, g)
    suh = (torch.randn(512, generator=g) * 0.05).to(torch.float16)
    svh = (torch.randn(128, generator=g) * 0.05).to(torch.float16)
    layer = PairedLinear(torch.cat([p0, p1]), ("P24", "P33"), "k", suh, svh, "mcg")
    assert (layer.k, layer.n) == (512, 128)
    wq = torch.cat(
        [
            elementwise_decode(p0, "P24", "k", 128, "mcg"),
            elementwise_decode(p1, "P33", "k", 128, "mcg"),
        ]
    )
    assert torch.equal(layer.decode(), wq)
    x = torch.randn(2, 512, generator=g).to(torch.float16)
    expected = forward(x, layer, "exact")
    assert torch.allclose(expected, x.double() @ reconstruct(layer), rtol=1e-10, atol=1e-12)


def test_prepared_layer_equals_reference_layer():
    g = torch.Generator().manual_seed(8)
    payload = random_pair_payload("P43", "n", 128, g)
    suh, svh = torch.ones(128, dtype=torch.float16), torch.ones(256, dtype=torch.float16)
    x = torch.randn(2, 128, generator=g).to(torch.float16)
    ref = forward(x, PairedLinear(payload, "P43", "n", suh, svh, "mcg"), "faithful")
    prepared = interleave_n_axis(payload, "P43", 128)
    layer = PairedLinear(prepared, "P43", "n", suh, svh, "mcg", layout="prepared")
    assert torch.equal(forward(x, layer, "faithful"), ref)


# ---- validation -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["P42", "p33", "P3", 33, [["P33"]], ()])
def test_rejects_illegal_kind(kind):
    with pytest.raises((ValueError, TypeError), match="kind"):
        pair_payload_length(kind, 128)


@pytest.mark.parametrize("orth", [0, 64, 100, 200, -128])
def test_rejects_illegal_orth(orth):
    with pytest.raises(ValueError, match="orth"):
        pair_payload_length("P33", orth)


def test_rejects_illegal_axis_layout_payload_and_codebook():
    payload = random_pair_payload("P33", "k", 128)
    with pytest.raises(ValueError, match="rate_axis"):
        decode_pair(payload, "P33", "m", 128, "mcg")
    with pytest.raises(ValueError, match="rate_axis"):
        random_pair_payload("P33", "K", 128)
    with pytest.raises(ValueError, match="layout"):
        decode_pair(payload, "P33", "k", 128, "mcg", layout="interleaved")
    with pytest.raises(ValueError, match="payload"):
        decode_pair(payload[:-1], "P33", "k", 128, "mcg")
    with pytest.raises(ValueError, match="payload"):
        decode_pair(payload, "P24", "k", 256, "mcg")
    with pytest.raises(TypeError, match="payload"):
        decode_pair(payload.to(torch.int32), "P33", "k", 128, "mcg")
    with pytest.raises(ValueError, match="codebook"):
        decode_pair(payload, "P33", "k", 128, "sqg_fp16")  # sqg_fp16 is K5/K6 only


def test_paired_linear_rejects_mismatched_scales():
    payload = random_pair_payload("P33", "k", 128)
    ones = torch.ones
    with pytest.raises(ValueError, match="suh"):
        PairedLinear(
            payload,
            "P33",
            "k",
            ones(128, dtype=torch.float16),
            ones(128, dtype=torch.float16),
            "mcg",
        )
    with pytest.raises(ValueError, match="svh"):
        PairedLinear(
            payload,
            "P33",
            "k",
            ones(256, dtype=torch.float16),
            ones(96, dtype=torch.float16),
            "mcg",
        )
    bad = ones(256, dtype=torch.float16)
    bad[0] = float("nan")
    with pytest.raises(ValueError, match="suh"):
        PairedLinear(payload, "P33", "k", bad, ones(128, dtype=torch.float16), "mcg")


def test_make_pair_payload_rejects_wrong_record_shapes():
    rec = torch.zeros(8, 8, 48, dtype=torch.int16)
    with pytest.raises(ValueError, match="record1"):
        make_pair_payload(rec, torch.zeros(8, 16, 48, dtype=torch.int16), "k")
    with pytest.raises(ValueError, match="record0"):
        make_pair_payload(torch.zeros(4, 8, 48, dtype=torch.int16), rec, "k")
