"""Layout checks (§1.2–§1.5): pack, states, windows and tile order, exact, on CPU.

Every expectation here is built independently of :mod:`reference` from the spec's rules:

* ``layout.worked_example`` — spec §1.3's b=3 example (stored words and states) from
  fixtures/fingerprints.json, through ``reference.trellis.pack`` / ``states``.
* ``layout.pack_round_trip`` — ``unpack_symbols(pack_symbols(s)) == s`` for b = 1..8.
* ``layout.states`` — states from the tail-biting rule of §1.3 computed here on the symbols
  (``OR_j sym[(t-j) mod 256] << j·b``, masked to 16 bits) equal ``reference.trellis.states``.
* ``layout.windows`` — the §1.4 window rule, evaluated here in Python integers on the u32 ring
  (the stream read MSB-first), equals the same states, and ``reference.bitstream.window_state``.
* ``layout.tile_order`` — ``matrix_to_tiles`` / ``tiles_to_matrix`` round trip, and the step map
  equals the §1.5 formula (lane, j) → (k_local, n_local) computed here.
* ``layout.decode_index_map`` — ``reference.trellis.decode`` of small random payloads equals
  the layer built element by element: ``W[16kt+k_local(t), 16nt+n_local(t)] =
  state_values(codebook, b)[state[kt, nt, t]]`` with this module's states and position map.
Inputs are small and seeded (deterministic); the whole family runs in about a second.
"""

from __future__ import annotations

import json

import torch

from oracle.checks.fingerprints import FINGERPRINTS_PATH
from oracle.report.report import CheckResult
from reference import bitstream, tile_order, trellis
from reference.codebooks import state_values

__all__ = ["expected_states", "run", "tile_positions"]

STEPS = 256
SEED = 20260
DECODE_CASES = (("3inst", 2), ("mcg", 6), ("mul1", 4), ("sqg_e4m3", 3), ("sqg_fp16", 5))


def expected_states(symbols: list[int], bits: int) -> list[int]:
    """§1.3: state[t] = OR_j sym[(t - j) mod 256] << (j·b), masked to 16 bits."""
    reach = -(-16 // bits)
    return [
        sum(symbols[(t - j) % STEPS] << (j * bits) for j in range(reach)) & 0xFFFF
        for t in range(STEPS)
    ]


def _ring_u32(symbols: list[int], bits: int) -> list[int]:
    """The stream (symbols MSB-first, §1.2) cut into u32 words MSB-first."""
    stream = 0
    for s in symbols:
        stream = (stream << bits) | s
    total = STEPS * bits
    return [(stream >> (total - 32 * (i + 1))) & 0xFFFFFFFF for i in range(total // 32)]


def _window_states(ring: list[int], bits: int) -> list[int]:
    """§1.4, literally."""
    w32 = len(ring)
    out = []
    for t in range(STEPS):
        b1 = (t + 257) * bits
        b0 = b1 - 16
        j0, j1 = b0 >> 5, (b1 - 1) >> 5
        s = (j1 + 1) * 32 - b1
        out.append((((ring[j0 % w32] << 32) | ring[j1 % w32]) >> s) & 0xFFFF)
    return out


def tile_positions() -> list[tuple[int, int]]:
    """§1.5: step t = 8·lane + j → (k_local, n_local)."""
    out = []
    for t in range(STEPS):
        lane, j = divmod(t, 8)
        r, g = lane % 4, lane // 4
        out.append(((2 * r, 2 * r + 1, 2 * r + 8, 2 * r + 9)[j % 4], g + 8 * (j // 4)))
    return out


def _symbols(gen: torch.Generator, bits: int, count: int = 1) -> torch.Tensor:
    return torch.randint(0, 1 << bits, (count, STEPS), generator=gen, dtype=torch.int64)


def _result(name: str, failures: list[str], **metrics) -> CheckResult:
    if failures:
        more = f" (+{len(failures) - 3} more)" if len(failures) > 3 else ""
        return CheckResult(name, "cpu", "fail", "; ".join(failures[:3]) + more, metrics)
    return CheckResult(name, "cpu", "pass", "", metrics)


def _u16(t: torch.Tensor) -> list[int]:
    return [v & 0xFFFF for v in t.reshape(-1).tolist()]


def _worked_example() -> CheckResult:
    ex = json.loads(FINGERPRINTS_PATH.read_text())["bitstream_worked_example"]
    bits = ex["bits"]
    sym = torch.arange(STEPS, dtype=torch.int64) % 8
    packed = trellis.pack(sym, bits)
    failures = []
    want_words = [int(w, 16) for w in ex["stored_u16_prefix"]]
    got_words = _u16(packed)[: len(want_words)]
    if got_words != want_words:
        failures.append(
            f"stored words {[hex(w) for w in got_words]} != spec {ex['stored_u16_prefix']}"
        )
    got_states = trellis.states(packed, bits).tolist()
    for t, want in ex["states"].items():
        if got_states[int(t)] != int(want, 16):
            failures.append(f"state[{t}] = {got_states[int(t)]:#06x} != spec {want}")
    return _result("layout.worked_example", failures)


def _pack_and_states(gen: torch.Generator) -> list[CheckResult]:
    pack_fail, state_fail, window_fail = [], [], []
    for bits in range(1, 9):
        sym = _symbols(gen, bits, 2)
        packed = bitstream.pack_symbols(sym, bits)
        if not torch.equal(bitstream.unpack_symbols(packed, bits), sym):
            pack_fail.append(f"b={bits}: unpack(pack(s)) != s")
        got = trellis.states(packed, bits)
        ring_ref = bitstream.ring_u32(packed)
        for row in range(sym.shape[0]):
            symbols = sym[row].tolist()
            want = expected_states(symbols, bits)
            if got[row].tolist() != want:
                state_fail.append(f"b={bits} row {row}: states differ from the §1.3 rule")
            ring = _ring_u32(symbols, bits)
            if _window_states(ring, bits) != want:
                window_fail.append(f"b={bits}: the §1.4 rule on the u32 ring disagrees with §1.3")
            if [v & 0xFFFFFFFF for v in ring_ref[row].tolist()] != ring:
                window_fail.append(
                    f"b={bits}: reference ring_u32 differs from the MSB-first stream"
                )
            ts = torch.arange(STEPS)
            ws = bitstream.window_state(ring_ref[row], ts, bits).tolist()
            if ws != want:
                window_fail.append(f"b={bits}: reference window_state differs from §1.3")
    return [
        _result("layout.pack_round_trip", pack_fail, bits="1..8"),
        _result("layout.states", state_fail, bits="1..8"),
        _result("layout.windows", window_fail, bits="1..8"),
    ]


def _tile_order(gen: torch.Generator) -> CheckResult:
    failures = []
    k_local, n_local = tile_order.step_to_tile_position()
    if list(zip(k_local.tolist(), n_local.tolist(), strict=True)) != tile_positions():
        failures.append("step_to_tile_position differs from the §1.5 formula")
    values = torch.randn(2, 3, STEPS, generator=gen)
    matrix = tile_order.tiles_to_matrix(values)
    if not torch.equal(tile_order.matrix_to_tiles(matrix), values):
        failures.append("matrix_to_tiles(tiles_to_matrix(v)) != v")
    for t, (kl, nl) in enumerate(tile_positions()[::37]):
        if matrix[1 * 16 + kl, 2 * 16 + nl] != values[1, 2, t * 37]:
            failures.append(f"tiles_to_matrix puts step {t * 37} of tile (1,2) elsewhere")
            break
    return _result("layout.tile_order", failures)


def _decode_index_map(gen: torch.Generator) -> CheckResult:
    kt_n, nt_n = 2, 3
    positions = tile_positions()
    failures = []
    for codebook, bits in DECODE_CASES:
        words = torch.randint(-(1 << 15), 1 << 15, (kt_n, nt_n, 16 * bits), generator=gen)
        payload = words.to(torch.int16)
        table = state_values(codebook, bits)
        rows, cols, states = [], [], []
        for kt in range(kt_n):
            for nt in range(nt_n):
                st = expected_states(_symbols_of(payload[kt, nt], bits), bits)
                for t, (kl, nl) in enumerate(positions):
                    rows.append(16 * kt + kl)
                    cols.append(16 * nt + nl)
                    states.append(st[t])
        want = torch.full((16 * kt_n, 16 * nt_n), float("nan"), dtype=torch.float16)
        want[torch.tensor(rows), torch.tensor(cols)] = table[torch.tensor(states)]
        got = trellis.decode(payload, codebook)
        if got.dtype != torch.float16 or not torch.equal(
            got.view(torch.int16), want.view(torch.int16)
        ):
            failures.append(f"{codebook} K{bits}: decode differs from the element-wise index map")
    return _result("layout.decode_index_map", failures, cases=len(DECODE_CASES))


def _symbols_of(tile_words: torch.Tensor, bits: int) -> list[int]:
    """Symbols of one stored tile, read per §1.2 (SWAP16: stream word j at index j ^ 1)."""
    stored = _u16(tile_words)
    stream = 0
    for j in range(len(stored)):
        stream = (stream << 16) | stored[j ^ 1]
    total = STEPS * bits
    return [(stream >> (total - bits * (t + 1))) & ((1 << bits) - 1) for t in range(STEPS)]


def run(ctx=None) -> list[CheckResult]:
    gen = torch.Generator().manual_seed(SEED)
    return [_worked_example(), *_pack_and_states(gen), _tile_order(gen), _decode_index_map(gen)]
