"""CPU proofs of the bit tricks in the kernels' decode (no GPU; the GPU tests check the kernels).

* Lane geometry: :func:`b12x.kernels.trellis_decode.lane_geometry` starts window 0 of every lane
  at the §1.4 bit ``(8l + 257)·b − 16`` and keeps ``e`` (bits left after the span in the loaded
  words) in ``[0, 32]``, the range the clamped funnel shift needs.
* Window plans: the funnel-shift + one-instruction-cut plan of every bitrate, run in pure Python
  (:func:`run_window_plan`, the instructions' semantics), equals the spec's window rule
  (``reference.bitstream.window_state``) for all 32 lanes on random and corner-case rings; the
  per-tile instruction budgets are pinned.
* ``prmt`` cut at bit 8: the selector :data:`b12x.kernels.ptx.PRMT_CUT8`, under PTX ``prmt``
  semantics (emulated here), yields ``(x >> 8) & 0xffff``.
* Pair sums (3INST, MCG): the fp16 half-sum of every one of the 65,536 states, computed as the
  kernels do (``fma(h, (1, -1), h.hi)`` / ``fma(h, (-1, 1), h.lo)`` then one ``add.f16x2`` merge;
  or ``add.f16`` then fp32 then bf16), equals the reference codebook value bit for bit, and no
  value is -0 (the premise that makes adding the +0 lane exact).
* The 16-bit mask of every cut is kept on purpose: with garbage above bit 15 the 3INST, MCG and
  MUL1 values change for most states (so no mask may be dropped).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from b12x.formats import FORMATS, LOP3_MASK, LOP3_XOR
from b12x.kernels import ptx
from b12x.kernels.trellis_decode import (
    _span,
    lane_geometry,
    lane_offsets,
    ring_words_per_lane,
    run_window_plan,
    window_plan,
)
from reference import bitstream
from reference.codebooks import state_values

BITS = range(1, 9)


def _plan_for(bits: int):
    offsets = lane_offsets(bits)
    return window_plan(bits, offsets[0] if len(offsets) == 1 else None)


@pytest.mark.parametrize("bits", BITS)
def test_lane_geometry_follows_the_window_rule_and_bounds_e(bits):
    ring = 8 * bits
    words = ring_words_per_lane(bits)
    for lane in range(32):
        first, off = lane_geometry(lane, bits)
        assert 0 <= first < ring
        assert (32 * first + off) % (32 * ring) == ((8 * lane + 257) * bits - 16) % (32 * ring)
        e = 32 * words - _span(bits) - off
        assert 0 <= e <= 32, (lane, off, e)


def _rings(bits: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1234 + bits)
    payloads = [torch.randint(-(2**15), 2**15, (16 * bits,), generator=gen) for _ in range(6)]
    payloads.append(torch.zeros(16 * bits, dtype=torch.int64))
    payloads.append(torch.full((16 * bits,), -1, dtype=torch.int64))  # all ones
    payloads.append(torch.tensor([0x5555, -0x5556] * (8 * bits)))  # alternating bit patterns
    return [bitstream.ring_u32(p.to(torch.int16)) for p in payloads]


@pytest.mark.parametrize("bits", BITS)
def test_window_plan_equals_the_spec_window_rule_for_every_lane(bits):
    plan = _plan_for(bits)
    words = ring_words_per_lane(bits)
    steps = torch.arange(256)
    for ring in _rings(bits):
        expected = bitstream.window_state(ring, steps, bits).tolist()
        values = [int(v) & 0xFFFFFFFF for v in ring.tolist()]
        for lane in range(32):
            first, off = lane_geometry(lane, bits)
            loaded = [values[(first + i) % (8 * bits)] for i in range(words)]
            e = 32 * words - _span(bits) - off
            got = run_window_plan(plan, loaded, e)
            assert got == expected[8 * lane : 8 * lane + 8], (bits, lane)


# Integer instructions per tile (funnel shifts + cuts); the pre-plan kernels spent 13 (K4),
# ~19 (K2, K6 with select-based 64-bit funnels) and 16-18 (K3) per tile.
PLAN_BUDGET = {1: 16, 2: 12, 3: 17, 4: 11, 5: 17, 6: 17, 7: 18, 8: 10}


@pytest.mark.parametrize("bits", BITS)
def test_window_plan_instruction_budget(bits):
    plan = _plan_for(bits)
    assert plan.instructions <= PLAN_BUDGET[bits], plan
    # Lane-dependent offsets buy their canonical registers with the lane's shift, nothing else.
    assert plan.lane_shift == (len(lane_offsets(bits)) > 1)
    assert all(f.const == 0 for f in plan.funnels if f.lane_shift)


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX ``prmt.b32`` default mode: byte i of the result is byte ``sel_i & 7`` of {b, a}, or
    that byte's sign replicated when ``sel_i & 8``."""
    source = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    out = 0
    for i in range(4):
        sel = (selector >> (4 * i)) & 0xF
        byte = (source >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def test_prmt_cut_at_bit_8():
    rng = np.random.default_rng(7)
    for x in [0, 0xFFFFFFFF, 0x80808080, 0x7F7F7F7F, *rng.integers(0, 2**32, 2000).tolist()]:
        assert _prmt(int(x), 0, ptx.PRMT_CUT8) == (int(x) >> 8) & 0xFFFF


def _halves(codebook: str):
    fmt = FORMATS[codebook]
    s = np.arange(65536, dtype=np.uint64)
    x = (s * fmt.hash_multiplier + fmt.hash_addend) & 0xFFFFFFFF
    h = (x & LOP3_MASK) ^ LOP3_XOR
    lo = (h & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
    hi = (h >> 16).astype(np.uint16).view(np.float16).astype(np.float64)
    return lo, hi


def _bits16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint16)


@pytest.mark.parametrize("codebook", ["3inst", "mcg"])
def test_pair_sum_forms_are_bit_exact_for_every_state(codebook):
    lo, hi = _halves(codebook)
    ref = state_values(codebook, 4).numpy().view(np.uint16)
    # fma(h, (1, -1), (h.hi, h.hi)): lane 0 = lo + hi rounded once (float64 holds the exact sum),
    # lane 1 = hi - hi; fma(h, (-1, 1), (h.lo, h.lo)): lane 0 = lo - lo, lane 1 = hi + lo.
    v0 = _bits16(lo * 1.0 + hi)
    v1 = _bits16(hi * 1.0 + lo)
    zero0 = _bits16(hi * -1.0 + hi)
    zero1 = _bits16(lo * -1.0 + lo)
    assert (zero0 == 0).all() and (zero1 == 0).all()  # +0, never -0
    assert (v0 == ref).all() and (v1 == ref).all()
    assert not (ref == 0x8000).any()  # no value is -0 ...
    merged = _bits16(v0.view(np.float16).astype(np.float64) + 0.0)
    assert (merged == ref).all()  # ... so the merge add of +0 changes no bit
    # bf16 form: add.rn.f16, exact widening to fp32, one RN rounding to bf16.
    via_fp32 = torch.from_numpy(v0.view(np.float16).astype(np.float32)).to(torch.bfloat16)
    want = torch.from_numpy(ref.view(np.float16)).to(torch.bfloat16)
    assert torch.equal(via_fp32.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("codebook", ["3inst", "mcg", "mul1"])
def test_window_mask_is_needed_by_every_hash(codebook):
    """Why every cut keeps its 16-bit mask: garbage above bit 15 of a state reaches bits 16..31
    of ``x = s·mult + add`` (the high fp16 half / the upper bytes of the MUL1 byte sum), so an
    unmasked cut would change values; checked on all 65,536 states with random garbage."""
    fmt = FORMATS[codebook]
    rng = np.random.default_rng(11)
    s = np.arange(65536, dtype=np.uint64)
    garbage = rng.integers(1, 2**16, 65536).astype(np.uint64) << np.uint64(16)

    def value(states):
        x = (states * np.uint64(fmt.hash_multiplier) + np.uint64(fmt.hash_addend)) & 0xFFFFFFFF
        if codebook == "mul1":
            return sum((x >> np.uint64(8 * i)) & 0xFF for i in range(4))
        h = (x & LOP3_MASK) ^ LOP3_XOR
        lo = (h & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
        hi = (h >> 16).astype(np.uint16).view(np.float16).astype(np.float64)
        return _bits16(lo + hi)

    changed = value(s) != value(s | garbage)
    assert changed.mean() > 0.5, changed.mean()
