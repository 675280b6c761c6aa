"""Tests of the SQG codebooks: ``sqg_e4m3`` (K2-K4, spec §2.5) and ``sqg_fp16`` (K5/K6, §2.7).

Ground truth, in order of strength:

* the §2.9 SHA-256 fingerprints, read from ``fixtures/fingerprints.json``;
* the sample decode tables of §2.5 and §2.7 and the T12 sample entries, typed in from the spec;
* independent constructions written here in plain Python / numpy (the device BFI form of the
  xorshift pair, the device T12 index, a ``collections.Counter`` modal table, torch's own
  ``float8_e4m3fn`` decoder, ``statistics.NormalDist`` quantiles);
* math identities the spec states (bijection, sign symmetry, strata of successors).

Every table is built once per session (``functools.cache`` in the modules and here).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch

from reference.codebooks import sqg_e4m3, sqg_fp16

STATES = 1 << 16
FINGERPRINTS = Path(__file__).resolve().parents[2] / "fixtures" / "fingerprints.json"


def sha256(data: bytes | torch.Tensor) -> str:
    if isinstance(data, torch.Tensor):
        data = data.contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------------------------
# Independent element-wise constructions (numpy / plain Python), written from the spec's text.
# ----------------------------------------------------------------------------------------------


def bfi(src: np.ndarray, dst: np.ndarray, pos: int, length: int) -> np.ndarray:
    """PTX ``bfi``: insert the low ``length`` bits of ``src`` into ``dst`` at bit ``pos``."""
    field = ((1 << length) - 1) << pos
    return (dst & ~np.uint64(field)) | ((src << np.uint64(pos)) & np.uint64(field))


def xorshift_two_line(h: np.ndarray, w: int) -> np.ndarray:
    hm = np.uint64((1 << w) - 1)
    m = h ^ (h >> np.uint64(11))
    return m ^ ((m << np.uint64(11)) & hm)


def xorshift_bfi_form(h: np.ndarray, w: int) -> np.ndarray:
    t = h >> np.uint64(11)
    return bfi(h, h, 11, w - 11) ^ t


def bitrev_py(x: int, bits: int) -> int:
    return int(format(x, f"0{bits}b")[::-1], 2)


@functools.cache
def device_graph(bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, stratum, rank) of every codeword, the way the device computes them (§2.5, §2.7)."""
    w = 16 - bits
    cw = np.arange(STATES, dtype=np.uint64)
    h = cw >> np.uint64(bits)
    beta = (cw & np.uint64((1 << bits) - 1)).astype(np.int64)
    m = xorshift_bfi_form(h, w) if w > 11 else h  # §2.7: the device skips it for w <= 11
    p = (np.uint64(0x3FA7D929) * m + np.uint64(0xC928FD8E)) & np.uint64(0xFFFFFFFF)
    rev = np.array([bitrev_py(b, bits) for b in range(1 << bits)], dtype=np.uint64)[beta]
    stratum = rev ^ (p >> np.uint64(32 - bits))
    rank = (stratum << np.uint64(w)) | (p & np.uint64((1 << w) - 1))
    return p, stratum, rank.astype(np.int64)


def staircase_py(rank: int) -> int:
    negative = rank < 0x8000
    m = (rank & 0x7FFF) ^ (0x7FFF if negative else 0)
    code = sum(1 for cut in sqg_e4m3.CHEB_TRANSITIONS if cut <= m)
    return code | 0x80 if negative and code else code


def e4m3_value_torch(codes: torch.Tensor) -> torch.Tensor:
    """torch's own float8_e4m3fn decoder, an independent check of ``e4m3fn_to_float``."""
    return codes.view(torch.float8_e4m3fn).to(torch.float32)


@functools.cache
def modal_t12_py(tie_by: str) -> bytes:
    """T12 by ``collections.Counter``; ties to the smallest byte code or the smallest value."""
    value_of = e4m3_value_torch(torch.arange(256, dtype=torch.uint8)).tolist()
    stair = [staircase_py(r) for r in range(STATES)]
    out = bytearray()
    for i in range(4096):
        counts = collections.Counter(stair[16 * i : 16 * i + 16])
        top = max(counts.values())
        tied = [b for b, c in counts.items() if c == top]
        out.append(min(tied) if tie_by == "code" else min(tied, key=lambda b: value_of[b]))
    return bytes(out)


@functools.cache
def law_by_rank(bits: int) -> torch.Tensor:
    """sqg_fp16 value indexed by rank instead of state (the graph is a bijection)."""
    rank = torch.from_numpy(device_graph(bits)[2])
    law = torch.empty(STATES, dtype=torch.float16)
    law[rank] = sqg_fp16.values(bits)
    return law


# ----------------------------------------------------------------------------------------------
# Fingerprints (§2.9)
# ----------------------------------------------------------------------------------------------

FINGERPRINT_TABLES = {
    "xor_cheb_t12": lambda: sqg_e4m3.t12_table(),
    "xor_cheb_direct_all": lambda: sqg_e4m3.direct_table(),
    "xor_cheb_direct_k2": lambda: sqg_e4m3.direct_table()[0:STATES],
    "xor_cheb_direct_k3": lambda: sqg_e4m3.direct_table()[STATES : 2 * STATES],
    "xor_cheb_direct_k4": lambda: sqg_e4m3.direct_table()[2 * STATES :],
    "d3l_descriptor": lambda: sqg_fp16.descriptor_bytes(),
    "d3l_k5_fp16_lut": lambda: sqg_fp16.values(5),
    "d3l_k6_fp16_lut": lambda: sqg_fp16.values(6),
}


@functools.cache
def expected_fingerprint(table: str) -> str:
    """The §2.9 digest of ``table`` as transcribed into fixtures/fingerprints.json."""
    digest = json.loads(FINGERPRINTS.read_text())["tables"][table]["sha256"]
    assert len(digest) == 64
    return digest


@pytest.mark.parametrize("table", sorted(FINGERPRINT_TABLES))
def test_fingerprint(table: str) -> None:
    assert sha256(FINGERPRINT_TABLES[table]()) == expected_fingerprint(table)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_state_bytes_is_the_direct_rate_slice(bits: int) -> None:
    start = (bits - 2) << 16
    assert torch.equal(sqg_e4m3.state_bytes(bits), sqg_e4m3.direct_table()[start : start + STATES])


# ----------------------------------------------------------------------------------------------
# Spec sample tables
# ----------------------------------------------------------------------------------------------

E4M3_SAMPLES = [  # §2.5: (b, state, byte, value)
    (2, 0x0000, 0x46, 3.5),
    (2, 0x0001, 0x91, -0.03515625),
    (2, 0x1234, 0x31, 0.5625),
    (2, 0xFFFF, 0xBA, -1.25),
    (3, 0x0000, 0x3D, 1.625),
    (3, 0x0001, 0xB0, -0.5),
    (3, 0x1234, 0x38, 1.0),
    (3, 0xFFFF, 0xB9, -1.125),
    (4, 0x0000, 0x3A, 1.25),
    (4, 0x0001, 0xB4, -0.75),
    (4, 0x1234, 0xB4, -0.75),
    (4, 0xFFFF, 0xB9, -1.125),
]


@pytest.mark.parametrize(("bits", "state", "byte", "value"), E4M3_SAMPLES)
def test_e4m3_sample_decodes(bits: int, state: int, byte: int, value: float) -> None:
    assert int(sqg_e4m3.state_bytes(bits)[state]) == byte
    assert int(sqg_e4m3.direct_table()[((bits - 2) << 16) | state]) == byte
    assert float(sqg_e4m3.values(bits)[state]) == value


FP16_SAMPLES = [  # §2.7: (b, state, fp16 bits, printed value)
    (5, 0x0000, 0x3D1D, 1.2783),
    (5, 0x0001, 0xBA32, -0.7744),
    (5, 0x1234, 0x4323, 3.5684),
    (5, 0xFFFF, 0xBCF3, -1.2373),
    (6, 0x0000, 0x3CC8, 1.1953),
    (6, 0x0001, 0xBABC, -0.8418),
    (6, 0x1234, 0x36EF, 0.43335),
    (6, 0xFFFF, 0x3DB8, 1.4297),
]


@pytest.mark.parametrize(("bits", "state", "half_bits", "printed"), FP16_SAMPLES)
def test_fp16_sample_decodes(bits: int, state: int, half_bits: int, printed: float) -> None:
    table = sqg_fp16.values(bits)
    assert int(table.view(torch.int16)[state]) & 0xFFFF == half_bits
    assert float(table[state]) == pytest.approx(printed, abs=6e-5)


# ----------------------------------------------------------------------------------------------
# The XOR graph (§2.4, §2.5, §2.7)
# ----------------------------------------------------------------------------------------------


def test_bitrev_small_cases() -> None:
    x = torch.tensor([0b01, 0b10, 0b011, 0b0001], dtype=torch.int64)
    assert sqg_e4m3.bitrev(x[:2], 2).tolist() == [0b10, 0b01]
    assert sqg_e4m3.bitrev(x[2:3], 3).tolist() == [0b110]
    assert sqg_e4m3.bitrev(x[3:], 4).tolist() == [0b1000]


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_bfi_form_of_xorshift_pair_equals_two_line_form(bits: int) -> None:
    w = 16 - bits
    h = np.arange(STATES, dtype=np.uint64) >> np.uint64(bits)
    assert np.array_equal(xorshift_bfi_form(h, w), xorshift_two_line(h, w))


@pytest.mark.parametrize("w", [10, 11, 12, 13, 14])
def test_xorshift_pair_is_identity_exactly_when_w_le_11(w: int) -> None:
    h = np.arange(1 << w, dtype=np.uint64)
    is_identity = np.array_equal(xorshift_two_line(h, w), h)
    assert is_identity == (w <= 11)
    # A bijection on w bits either way.
    assert np.array_equal(np.sort(xorshift_two_line(h, w)), h)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6])
def test_rank_matches_device_form(bits: int) -> None:
    ranks = sqg_e4m3.xor_graph_rank(torch.arange(STATES), bits)
    assert ranks.dtype == torch.int64
    assert np.array_equal(ranks.numpy(), device_graph(bits)[2])


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6])
def test_rank_spot_values_by_hand(bits: int) -> None:
    # cw = 0: h = 0, beta = 0, m = 0, p = 0xC928FD8E; stratum = top b bits of p.
    w = 16 - bits
    p = 0xC928FD8E
    expected = ((p >> (32 - bits)) << w) | (p & ((1 << w) - 1))
    assert int(sqg_e4m3.xor_graph_rank(torch.tensor([0]), bits)[0]) == expected


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_device_t12_index_equals_rank_shift(bits: int) -> None:
    w = 16 - bits
    p, stratum, rank = device_graph(bits)
    index = (stratum << np.uint64(w - 4)) | ((p >> np.uint64(4)) & np.uint64((1 << (w - 4)) - 1))
    assert np.array_equal(index.astype(np.int64), rank >> 4)
    t12 = sqg_e4m3.t12_table()
    assert torch.equal(sqg_e4m3.state_bytes(bits), t12[torch.from_numpy(index.astype(np.int64))])


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6])
def test_graph_is_a_bijection(bits: int) -> None:
    ranks = sqg_e4m3.xor_graph_rank(torch.arange(STATES), bits)
    assert torch.equal(torch.sort(ranks).values, torch.arange(STATES))


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6])
def test_successors_of_a_history_fill_all_strata_with_one_phase(bits: int) -> None:
    w = 16 - bits
    ranks = sqg_e4m3.xor_graph_rank(torch.arange(STATES), bits).reshape(1 << w, 1 << bits)
    phase = ranks & ((1 << w) - 1)
    assert torch.equal(phase, phase[:, :1].expand_as(phase))
    strata = torch.sort(ranks >> w, dim=1).values
    assert torch.equal(strata, torch.arange(1 << bits).expand_as(strata))


# ----------------------------------------------------------------------------------------------
# Staircase, E4M3 decode, T12, direct table (§2.5)
# ----------------------------------------------------------------------------------------------


def test_cut_points_shape() -> None:
    cuts = sqg_e4m3.CHEB_TRANSITIONS
    assert len(cuts) == 77
    assert list(cuts) == sorted(set(cuts))
    assert cuts[:3] == (17, 51, 85) and cuts[-3:] == (32753, 32764, 32767)


def test_staircase_matches_counting_definition() -> None:
    ranks = torch.arange(STATES)
    expected = torch.tensor([staircase_py(r) for r in range(STATES)], dtype=torch.uint8)
    got = sqg_e4m3.staircase_byte(ranks)
    assert got.dtype == torch.uint8
    assert torch.equal(got, expected)
    assert int(got[0xFFFF]) == 77 and int(got[0]) == 0x80 | 77  # m = 32767 at both ends
    assert not {0x7F, 0xFF, 0x80} & set(got.tolist())


def test_e4m3_decode_matches_torch_float8_for_all_codes() -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    got = sqg_e4m3.e4m3fn_to_float(codes)
    want = e4m3_value_torch(codes)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.isnan(got).tolist().count(True) == 2  # 0x7F and 0xFF
    ok = ~torch.isnan(want)
    assert torch.equal(got[ok], want[ok])
    assert float(got[0x4D]) == 6.5 and float(got[0x4B]) == 5.5 and float(got[0x01]) == 2.0**-9
    assert sqg_e4m3.e4m3_to_float is sqg_e4m3.e4m3fn_to_float


def test_t12_spec_facts() -> None:
    t12 = sqg_e4m3.t12_table()
    assert t12.dtype == torch.uint8 and t12.shape == (4096,)
    assert t12[0:4].tolist() == [0xCB, 0xCA, 0xCA, 0xC9]
    assert t12[2048:2052].tolist() == [0x00, 0x01, 0x01, 0x02]
    assert int(t12[4095]) == 0x4B
    present = set(t12.tolist())
    assert len(present) == 151
    assert present == {0} | set(range(1, 76)) | {0x80 | c for c in range(1, 76)}
    mags = e4m3_value_torch(t12).abs()
    assert float(mags.max()) == 5.5
    assert not (mags == 6.5).any()


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_direct_slice_histogram_is_16_times_t12(bits: int) -> None:
    t12_hist = torch.bincount(sqg_e4m3.t12_table().to(torch.int64), minlength=256)
    hist = torch.bincount(sqg_e4m3.state_bytes(bits).to(torch.int64), minlength=256)
    assert torch.equal(hist, 16 * t12_hist)
    assert int(hist[0x7F]) == int(hist[0xFF]) == int(hist[0x80]) == 0


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_e4m3_values_are_exact_widening_and_stats(bits: int) -> None:
    vals = sqg_e4m3.values(bits)
    assert vals.dtype == torch.float16 and vals.shape == (STATES,)
    assert torch.equal(vals, e4m3_value_torch(sqg_e4m3.state_bytes(bits)).to(torch.float16))
    v64 = vals.to(torch.float64)
    assert abs(float(v64.mean())) < 5e-5
    assert abs(math.sqrt(float((v64 * v64).mean())) - 1.4986) < 5e-5


def test_t12_tie_rule_is_smallest_byte_code() -> None:
    by_code, by_value = modal_t12_py("code"), modal_t12_py("value")
    assert bytes(sqg_e4m3.t12_table().numpy()) == by_code
    assert sha256(by_code) == expected_fingerprint("xor_cheb_t12")
    # The other reading of "numerically smallest" gives a different table: the choice matters.
    assert sha256(by_value) != expected_fingerprint("xor_cheb_t12")


def test_tables_are_returned_as_independent_copies() -> None:
    for get in (sqg_e4m3.t12_table, sqg_e4m3.direct_table, lambda: sqg_e4m3.state_bytes(2)):
        first = get()
        first.fill_(0)
        assert get().any()
    for get in (lambda: sqg_e4m3.values(3), lambda: sqg_fp16.values(5)):
        first = get()
        first.fill_(0)
        assert get().abs().max() > 1


# ----------------------------------------------------------------------------------------------
# D3L (§2.7)
# ----------------------------------------------------------------------------------------------


def test_descriptor_table_layout() -> None:
    raw = sqg_fp16.descriptor_bytes()
    assert isinstance(raw, bytes) and len(raw) == 416
    assert len(sqg_fp16.D3L_DESCRIPTORS) == 104
    assert raw[:4] == bytes([0x7D, 0x46, 0x00, 0x00])  # little-endian base 0x467D, slope 0
    base, slope = sqg_fp16.descriptor_tensors()
    assert float(base[0]) == 6.48828125 and float(slope[0]) == 0.0
    assert float(base[103]) == pytest.approx(4.53e-6, rel=2e-3)
    assert float(slope[103]) == pytest.approx(5.74e-5, rel=2e-3)


# (magnitude index m, descriptor index, x), worked by hand from §2.7 with v = 65535 - 2m
D3L_COORDINATE_CASES = [
    (32767, 0, 0),  # v = 1: e = 0, the extreme tail
    (32766, 1, 0),  # v = 3
    (32765, 2, 0),  # v = 5
    (32764, 3, 0),  # v = 7
    (32763, 4, 0),  # v = 9: e = 3
    (32760, 7, 0),  # v = 15: last exact-head descriptor
    (32759, 8, 0),  # v = 17: e = 4, sh = 1, sub = 0
    (32758, 9, 0),  # v = 19: sub = 1
    (32751, 16, 1),  # v = 33: e = 5, sh = 2, sub = 0, x = (32 + 4 - 1 - 33) >> 1
    (32750, 16, 0),  # v = 35
    (16383, 96, 2047),  # v = 32769: e = 15, sh = 12, sub = 0, x = (32768 + 4095 - 32769) >> 1
    (0, 103, 0),  # v = 65535: sub = 7, x = 0
]


@pytest.mark.parametrize(("m", "idx", "x"), D3L_COORDINATE_CASES)
def test_d3l_coordinates_worked_cases(m: int, idx: int, x: int) -> None:
    ranks = torch.tensor([0x8000 | m, 0x7FFF ^ m])  # the positive and the negative rank of m
    got_idx, got_x = sqg_fp16.d3l_coordinates(ranks)
    assert got_idx.tolist() == [idx, idx]
    assert got_x.tolist() == [x, x]


def test_d3l_coordinates_cover_the_table() -> None:
    idx, x = sqg_fp16.d3l_coordinates(torch.arange(STATES))
    assert sorted(set(idx.tolist())) == list(range(104))
    assert int(x.min()) == 0 and int(x.max()) == 2047


@pytest.mark.parametrize("bits", [5, 6])
def test_fp32_then_fp16_equals_single_rounding_for_all_ranks(bits: int) -> None:
    exact = sqg_fp16.values(bits).view(torch.int16)
    assert torch.equal(sqg_fp16.values_fp32_path(bits).view(torch.int16), exact)


def test_fma_emulation_rounds_once() -> None:
    # base = 1 + 2^-10 (0x3C01), slope = 97 * 2^-24 (0x0061), x = 929: the exact result is
    # 1 + 13 * 2^-11 + 2^-24, just above the midpoint of 0x3C06 and 0x3C07, so a single
    # rounding gives 0x3C07, while rounding to fp32 first lands on the midpoint and ties to 0x3C06.
    base = torch.tensor([0x3C01], dtype=torch.int16).view(torch.float16)
    slope = torch.tensor([0x0061], dtype=torch.int16).view(torch.float16)
    x = torch.tensor([929])
    single = sqg_fp16._fma_f16_single_rounding(slope, x, base)
    assert int(single.view(torch.int16)[0]) == 0x3C07
    via_fp32 = (slope.float() * x.float() + base.float()).to(torch.float16)
    assert int(via_fp32.view(torch.int16)[0]) == 0x3C06


def test_d3l_law_is_the_same_function_of_rank_at_k5_and_k6() -> None:
    assert torch.equal(law_by_rank(5).view(torch.int16), law_by_rank(6).view(torch.int16))


def test_d3l_law_shape() -> None:
    law = law_by_rank(5)
    bits = law.view(torch.int16).to(torch.int32) & 0xFFFF
    assert torch.equal(bits ^ 0x8000, bits.flip(0))  # v(r) = -v(65535 - r), bit for bit
    v = law.to(torch.float64)
    assert float(v.max()) == 6.48828125 and float(v.min()) == -6.48828125
    # Nearly monotone in rank: the frozen descriptors are fitted per segment, so at a few
    # segment joins the value steps back by one fp16 ulp (e.g. ranks 1919 -> 1920). The spec
    # does not promise monotonicity; pin that any step back is small and only at a join.
    idx, _ = sqg_fp16.d3l_coordinates(torch.arange(STATES))
    back = torch.nonzero(v[1:] < v[:-1]).flatten()
    assert bool((idx[back] != idx[back + 1]).all())
    assert float((v[back] - v[back + 1]).max()) <= 2.0**-9
    assert abs(math.sqrt(float((v * v).mean())) - 1.5) < 5e-5


def test_d3l_law_tracks_the_normal_quantile() -> None:
    r = torch.arange(STATES, dtype=torch.float64)
    target = 1.5 * torch.special.ndtri((r + 0.5) / STATES)
    err = law_by_rank(6).to(torch.float64) - target
    assert math.sqrt(float((err * err).mean())) < 7e-4
    assert float(err.abs().max()) <= 4e-3
    # Cross-check the target itself at a few ranks with the standard library.
    normal = statistics.NormalDist()
    for rank in (0, 1, 12345, 32767, 65535):
        assert float(target[rank]) == pytest.approx(1.5 * normal.inv_cdf((rank + 0.5) / STATES))


# ----------------------------------------------------------------------------------------------
# Registry and argument validation
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("codebook", "bits"), [("sqg_e4m3", b) for b in (2, 3, 4)] + [("sqg_fp16", b) for b in (5, 6)]
)
def test_registry_serves_these_tables(codebook: str, bits: int) -> None:
    from reference.codebooks import state_values

    module = sqg_e4m3 if codebook == "sqg_e4m3" else sqg_fp16
    assert torch.equal(
        state_values(codebook, bits).view(torch.int16), module.values(bits).view(torch.int16)
    )


@pytest.mark.parametrize(
    ("call", "error", "needle"),
    [
        (lambda: sqg_e4m3.xor_graph_rank(torch.arange(4), 7), ValueError, "bits"),
        (lambda: sqg_e4m3.xor_graph_rank(torch.arange(4), 1), ValueError, "bits"),
        (lambda: sqg_e4m3.xor_graph_rank(torch.arange(4), 2.0), TypeError, "bits"),
        (lambda: sqg_e4m3.xor_graph_rank(torch.zeros(4), 2), TypeError, "cw"),
        (lambda: sqg_e4m3.xor_graph_rank([0, 1], 2), TypeError, "cw"),
        (lambda: sqg_e4m3.xor_graph_rank(torch.tensor([65536]), 2), ValueError, "cw"),
        (lambda: sqg_e4m3.xor_graph_rank(torch.tensor([-1]), 2), ValueError, "cw"),
        (lambda: sqg_e4m3.staircase_byte(torch.tensor([70000])), ValueError, "rank"),
        (lambda: sqg_e4m3.e4m3fn_to_float(torch.arange(3)), TypeError, "codes"),
        (lambda: sqg_e4m3.values(5), ValueError, "bits"),
        (lambda: sqg_e4m3.state_bytes(1), ValueError, "bits"),
        (lambda: sqg_fp16.values(4), ValueError, "bits"),
        (lambda: sqg_fp16.values(True), TypeError, "bits"),
        (lambda: sqg_fp16.d3l_coordinates(torch.tensor([1.0])), TypeError, "rank"),
        (lambda: sqg_fp16.d3l_coordinates(torch.tensor([65536])), ValueError, "rank"),
    ],
)
def test_bad_input_is_rejected_with_the_argument_named(call, error, needle) -> None:
    with pytest.raises(error, match=needle):
        call()
