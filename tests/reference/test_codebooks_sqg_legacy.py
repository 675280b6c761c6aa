"""Tests of the legacy SQG-Cheb graph (spec §2.6): §2.9 fingerprints, graph identities, and the
compact execution forms (2 KiB rank descriptor, 58 KiB state blob) against the plain rules.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from reference.codebooks import sqg_e4m3, sqg_legacy

STATES = 1 << 16
FINGERPRINTS = Path(__file__).resolve().parents[2] / "fixtures" / "fingerprints.json"


@functools.cache
def expected_fingerprint(table: str) -> str:
    return json.loads(FINGERPRINTS.read_text())["tables"][table]["sha256"]


def sha256(table: torch.Tensor) -> str:
    return hashlib.sha256(table.contiguous().numpy().tobytes()).hexdigest()


TABLES = {
    "legacy_sqg_cheb_direct_all": sqg_legacy.direct_table,
    "legacy_sqg_cheb_k2": lambda: sqg_legacy.state_bytes(2),
    "legacy_sqg_cheb_k3": lambda: sqg_legacy.state_bytes(3),
    "legacy_sqg_cheb_k4": lambda: sqg_legacy.state_bytes(4),
    "q8h4_k2_slice": sqg_legacy.q8h4_k2_state_bytes,
}


@pytest.mark.parametrize("table", sorted(TABLES))
def test_fingerprint(table: str) -> None:
    assert sha256(TABLES[table]()) == expected_fingerprint(table)


def test_unmasked_mixer_input_would_break_k4() -> None:
    # The mixer masks its input to w bits. Without that, 0x5105's bit 14 leaks into the K4
    # syndrome (w = 12) and the table no longer matches §2.9: the masking is load-bearing.
    w, bits = 12, 4
    cw = torch.arange(STATES)
    h, beta = cw >> bits, cw & 15
    a, b, (s0, s1, s2) = sqg_legacy.SYNDROME_MIXER
    mask = (1 << w) - 1
    r = h ^ sqg_legacy.SYNDROME_PRE_XOR  # not masked
    r = (r ^ (r >> s0)) & mask
    r = (r * (a | 1)) & mask
    r = (r ^ (r >> s1)) & mask
    r = (r * (b | 1)) & mask
    syndrome = (r ^ (r >> s2)) & 15
    phase, _ = sqg_legacy.legacy_graph_fields(cw, bits)
    stratum = (7 * (sqg_e4m3.bitrev(beta, bits) ^ syndrome)) & 15
    unmasked = sqg_e4m3.staircase_byte((stratum << w) | phase)
    assert sha256(unmasked) != expected_fingerprint("legacy_sqg_cheb_k4")


@pytest.mark.parametrize("w", [12, 13, 14])
def test_mixers_are_bijections_on_w_bits(w: int) -> None:
    v = torch.arange(1 << w)
    for a, b, shifts in (sqg_legacy.PHASE_MIXER, sqg_legacy.SYNDROME_MIXER):
        assert torch.equal(torch.sort(sqg_legacy.mix(v, a, b, shifts, w)).values, v)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_graph_is_a_bijection_with_one_phase_per_history(bits: int) -> None:
    w = 16 - bits
    ranks = sqg_legacy.legacy_graph_rank(torch.arange(STATES), bits)
    assert torch.equal(torch.sort(ranks).values, torch.arange(STATES))
    rows = ranks.reshape(1 << w, 1 << bits)
    phase = rows & ((1 << w) - 1)
    assert torch.equal(phase, phase[:, :1].expand_as(phase))
    strata = torch.sort(rows >> w, dim=1).values
    assert torch.equal(strata, torch.arange(1 << bits).expand_as(strata))


def test_q8h4_swap_and_profile() -> None:
    cw = torch.tensor([0b00100, 0b10000, 0b10100, 0b01011, 0xFFFF])
    assert sqg_legacy.q8h4_swap(cw).tolist() == [0b10000, 0b00100, 0b10100, 0b01011, 0xFFFF]
    assert not torch.equal(sqg_legacy.q8h4_k2_state_bytes(), sqg_legacy.state_bytes(2))


def test_rank_descriptor_matches_counting_staircase() -> None:
    desc = sqg_legacy.rank_descriptor()
    assert desc.shape == (1024,)
    assert int(desc[-1]) == 0x114A and int(desc[-1]) & 0xFF == 74  # spec §2.6
    assert int(desc.max()) < (1 << 14)
    m = torch.arange(1 << 15)
    cuts = list(sqg_e4m3.CHEB_TRANSITIONS)
    expected = torch.tensor([bisect.bisect_right(cuts, i) for i in range(1 << 15)])
    assert torch.equal(sqg_legacy.descriptor_code(m), expected)


def test_state_blob_decodes_to_the_graph() -> None:
    blob = sqg_legacy.state_blob()
    assert len(blob) == 58 * 1024
    words = torch.from_numpy(np.frombuffer(blob, dtype="<u2").astype(np.int64))
    start = 0
    for bits in (2, 3, 4):
        w = 16 - bits
        n = 1 << w
        entry = words[start : start + n]
        start += n
        cw = torch.arange(STATES)
        per_state = entry[cw >> bits]
        phase, syndrome = per_state & ((1 << w) - 1), per_state >> w
        rev = sqg_e4m3.bitrev(cw & ((1 << bits) - 1), bits)
        rank = (((7 * (rev ^ syndrome)) & ((1 << bits) - 1)) << w) | phase
        assert torch.equal(rank, sqg_legacy.legacy_graph_rank(cw, bits))
    assert torch.equal(words[start:], sqg_legacy.rank_descriptor())


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: sqg_legacy.state_bytes(5), ValueError),
        (lambda: sqg_legacy.legacy_graph_rank(torch.tensor([1 << 16]), 2), ValueError),
        (lambda: sqg_legacy.legacy_graph_rank(torch.tensor([1.0]), 2), TypeError),
        (lambda: sqg_legacy.descriptor_code(torch.tensor([1 << 15])), ValueError),
    ],
)
def test_bad_input(call, error) -> None:
    with pytest.raises(error):
        call()
