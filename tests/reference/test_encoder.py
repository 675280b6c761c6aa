"""Tests for reference.encoder: the tail-biting Viterbi encoder (spec §1.3, §1.5, §1.7).

Expectations are built independently of the encoder:

* tail-biting and state structure from the §1.3 definitions, written here with plain shifts and
  ``torch.roll`` (consecutive overlap, wrap-around overlap, cyclic states of the symbols);
* decoded values from an element-wise §1.5 position map written here, and the codebook LUT;
* optimality from a plain state-based dynamic program in numpy float64 (a different recursion
  from the encoder's edge-based one), from exhaustive single-symbol perturbations, a greedy
  path and random tiles, all restricted to the encoder's own end edge (pass 2 is optimal among
  closing paths through that edge);
* quality against the Gaussian distortion-rate bound ``D(R) = σ²·2^(−2R)``, i.e. −6.02·K dB.

The encoder is a loop of many small torch ops; this module runs torch single-threaded (restored
afterwards), which is markedly faster than two contending threads on a 2-core machine.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reference import bitstream, encoder, tile_order, trellis
from reference.codebooks import CODEBOOKS, legal_bits, state_values

EDGE_BITS = {b: 16 - b for b in range(1, 9)}


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _codebook_rms(codebook: str, bits: int) -> float:
    return float(state_values(codebook, bits).double().pow(2).mean().sqrt())


def _gaussian(shape: tuple[int, ...], scale: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


def _plain_cyclic_states(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """§1.3 by its shift-register definition: state[t] = (state[t−1] << b | sym[t]) & 0xFFFF.

    Run the register over two laps; the second lap has forgotten the arbitrary start.
    """
    state = torch.zeros(symbols.shape[:-1], dtype=torch.int64)
    out = torch.empty_like(symbols, dtype=torch.int64)
    for lap in range(2):
        for t in range(256):
            state = ((state << bits) | symbols[..., t]) & 0xFFFF
            if lap == 1:
                out[..., t] = state
    return out


def _fragment_position(step: int) -> tuple[int, int]:
    lane, j = divmod(step, 8)
    r = lane % 4
    rows = (2 * r, 2 * r + 1, 2 * r + 8, 2 * r + 9)
    return rows[j % 4], lane // 4 + (8 if j >= 4 else 0)


def _assert_tail_biting(states: torch.Tensor, bits: int) -> None:
    edge_mask = (1 << EDGE_BITS[bits]) - 1
    assert int(states.min()) >= 0 and int(states.max()) <= 0xFFFF
    following = torch.roll(states, shifts=-1, dims=-1)  # state[t+1], wrapping 255 -> 0
    assert torch.equal(following >> bits, states & edge_mask)


def _path_cost(tile: torch.Tensor, states: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    return (lut.double()[states] - tile.double()).pow(2).sum(dim=-1)


# ---------------------------------------------------------------- encode -> decode consistency


@pytest.mark.parametrize(
    ("codebook", "bits"), [("mcg", 2), ("3inst", 3), ("mul1", 4), ("sqg_e4m3", 3), ("sqg_fp16", 6)]
)
def test_encode_decode_consistency(codebook: str, bits: int) -> None:
    values = _gaussian((2, 32, 16), _codebook_rms(codebook, bits), seed=bits)
    states = encoder.encode(values, bits, codebook, returns="states")
    payload = encoder.encode(values, bits, codebook)
    assert states.dtype == torch.int64 and states.shape == (2, 2, 1, 256)
    assert payload.dtype == torch.int16 and payload.shape == (2, 2, 1, 16 * bits)

    _assert_tail_biting(states, bits)
    symbols = states & ((1 << bits) - 1)
    assert torch.equal(_plain_cyclic_states(symbols, bits), states)
    assert torch.equal(bitstream.unpack_symbols(payload, bits), symbols)
    assert torch.equal(trellis.states(payload, bits), states)

    lut = state_values(codebook, bits)
    decoded = trellis.decode(payload, codebook)
    expected = torch.empty(2, 32, 16, dtype=torch.float16)
    for e in range(2):
        for kt in range(2):
            for t in range(256):
                k, n = _fragment_position(t)
                expected[e, 16 * kt + k, n] = lut[states[e, kt, 0, t]]
    assert torch.equal(decoded, expected)


def test_tiles_core_matches_matrix_entry_and_chunking() -> None:
    values = _gaussian((16, 48), 1.2, seed=7)
    whole = encoder.encode(values, 2, "mcg", returns="states")
    one_tile_chunks = encoder.encode(values, 2, "mcg", returns="states", chunk_bytes=1)
    assert torch.equal(whole, one_tile_chunks)
    tiles = torch.stack(
        [values[:, 16 * nt : 16 * nt + 16].flatten() for nt in range(3)]
    )  # row-major tiles
    steps = torch.tensor([16 * k + n for k, n in map(_fragment_position, range(256))])
    core = encoder.encode_tiles(tiles[:, steps], 2, "mcg")
    assert torch.equal(core, whole.reshape(3, 256))


def test_input_dtype_only_matters_through_its_float32_value() -> None:
    half = _gaussian((16, 32), 1.2, seed=8).to(torch.float16)
    from_half = encoder.encode(half, 3, "3inst", returns="states")
    from_double = encoder.encode(half.double(), 3, "3inst", returns="states")
    assert torch.equal(from_half, from_double)


@pytest.mark.gpu
def test_cuda_encode_is_tail_biting_and_as_good_as_cpu() -> None:
    bits, codebook = 3, "mcg"
    values = _gaussian((32, 32), _codebook_rms(codebook, bits), seed=21)
    on_cpu = encoder.encode(values, bits, codebook, returns="states")
    on_gpu = encoder.encode(values.cuda(), bits, codebook, returns="states")
    assert on_gpu.is_cuda
    on_gpu = on_gpu.cpu()
    _assert_tail_biting(on_gpu, bits)
    lut = state_values(codebook, bits)
    tiles = tile_order.matrix_to_tiles(values)
    torch.testing.assert_close(
        _path_cost(tiles, on_gpu, lut), _path_cost(tiles, on_cpu, lut), rtol=1e-5, atol=1e-9
    )


# ---------------------------------------------------------------- optimality on small cases


def _numpy_best_closing_cost(tile: np.ndarray, lut: np.ndarray, bits: int, edge: int) -> float:
    """Least cost over all tail-biting paths whose step-0 in-edge is ``edge``, by a state DP.

    V_t(s) = d_t(s) + min over predecessors s' (s' & edge_mask == s >> b) of V_{t−1}(s').
    """
    edge_mask = (1 << (16 - bits)) - 1
    state = np.arange(65536)
    dist = (lut[None, :] - tile[:, None]) ** 2  # [256, 65536]
    value = np.where(state >> bits == edge, dist[0], np.inf)
    for t in range(1, 256):
        best_by_edge = np.full(edge_mask + 1, np.inf)
        np.minimum.at(best_by_edge, state & edge_mask, value)
        value = dist[t] + best_by_edge[state >> bits]
    return float(value[(state & edge_mask) == edge].min())


@pytest.mark.parametrize(("codebook", "bits"), [("mcg", 8), ("3inst", 4), ("sqg_e4m3", 4)])
def test_cost_equals_independent_dp_for_its_end_edge(codebook: str, bits: int) -> None:
    tile = _gaussian((1, 256), _codebook_rms(codebook, bits), seed=11 + bits)
    states = encoder.encode_tiles(tile, bits, codebook)
    lut = state_values(codebook, bits)
    got = float(_path_cost(tile, states, lut)[0])
    end_edge = int(states[0, 0]) >> bits
    want = _numpy_best_closing_cost(tile[0].numpy(), lut.double().numpy(), bits, end_edge)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-9)


def test_no_single_symbol_change_greedy_or_random_tile_beats_it() -> None:
    bits, codebook = 2, "mcg"
    lut = state_values(codebook, bits)
    tile = _gaussian((1, 256), _codebook_rms(codebook, bits), seed=5)
    states = encoder.encode_tiles(tile, bits, codebook)
    cost = float(_path_cost(tile, states, lut)[0])
    slack = 1e-5 * cost
    symbols = states[0] & 3
    end_edge = int(states[0, 0]) >> bits

    # Every one-symbol change that keeps the end edge (symbols outside the last 7) is no better.
    keep = 256 - math.ceil(EDGE_BITS[bits] / bits)
    candidates = []
    for t in range(keep):
        for alternative in range(1 << bits):
            if alternative != int(symbols[t]):
                changed = symbols.clone()
                changed[t] = alternative
                candidates.append(changed)
    changed_states = _plain_cyclic_states(torch.stack(candidates), bits)
    assert bool(((changed_states[:, 0] >> bits) == end_edge).all())
    assert float(_path_cost(tile, changed_states, lut).min()) >= cost - slack

    # A greedy path from the same end edge, closed by forcing its last symbols, is no better.
    state, greedy = end_edge, []
    for t in range(keep):
        options = [((state << bits) | s) & 0xFFFF for s in range(1 << bits)]
        errors = [(float(lut[o]) - float(tile[0, t])) ** 2 for o in options]
        state = options[errors.index(min(errors))]
        greedy.append(state & 3)
    tail = [(end_edge >> (bits * j)) & 3 for j in range(256 - keep - 1, -1, -1)]
    greedy_states = _plain_cyclic_states(torch.tensor([greedy + tail]), bits)
    assert (int(greedy_states[0, 0]) >> bits) == end_edge
    assert float(_path_cost(tile, greedy_states, lut)[0]) >= cost - slack

    # So is any random tile.
    gen = torch.Generator().manual_seed(3)
    random_states = _plain_cyclic_states(torch.randint(0, 4, (256, 256), generator=gen), bits)
    assert float(_path_cost(tile, random_states, lut).min()) > cost


@pytest.mark.parametrize(("codebook", "bits"), [("mcg", 2), ("3inst", 4), ("sqg_fp16", 5)])
def test_planted_decodable_tile_is_recovered_exactly(codebook: str, bits: int) -> None:
    gen = torch.Generator().manual_seed(bits)
    symbols = torch.randint(0, 1 << bits, (2, 256), generator=gen)
    lut = state_values(codebook, bits)
    planted = lut[_plain_cyclic_states(symbols, bits)].to(torch.float32)
    states = encoder.encode_tiles(planted, bits, codebook)
    _assert_tail_biting(states, bits)
    assert torch.equal(lut[states].to(torch.float32), planted)


def test_close_paths_guard_rebuilds_only_open_tiles() -> None:
    bits = 3
    gen = torch.Generator().manual_seed(9)
    closed = _plain_cyclic_states(torch.randint(0, 8, (1, 256), generator=gen), bits)
    open_path = closed.clone()
    open_path[0, 0] ^= 1 << 15  # breaks the wrap-around overlap, keeps the symbol
    paths = torch.cat([closed, open_path])
    result = encoder._close_paths(paths, bits)
    _assert_tail_biting(result, bits)
    assert torch.equal(result[0], closed[0])
    assert torch.equal(result & 7, paths & 7)


# ---------------------------------------------------------------- quality vs the D(R) bound

QUALITY_TILES = 16


@pytest.mark.parametrize("codebook", ["mcg", "3inst"])
def test_quality_within_1p5_db_of_distortion_rate_bound(codebook: str) -> None:
    rows = []
    for bits in (2, 3, 4):
        rms = _codebook_rms(codebook, bits)
        values = _gaussian((16 * QUALITY_TILES, 16), rms, seed=100 + bits)
        payload = encoder.encode(values, bits, codebook)
        _assert_tail_biting(trellis.states(payload, bits), bits)
        error = trellis.decode(payload, codebook).double() - values
        nmse_db = 10 * math.log10(float(error.pow(2).mean()) / rms**2)
        bound_db = 10 * math.log10(2.0 ** (-2 * bits))
        rows.append((bits, nmse_db, bound_db, nmse_db - bound_db))
    print(f"\nencoder quality, {codebook}, {QUALITY_TILES} tiles of iid N(0, rms²) per K:")
    for bits, nmse_db, bound_db, gap in rows:
        print(f"  K{bits}: NMSE {nmse_db:7.2f} dB   bound {bound_db:7.2f} dB   gap {gap:+.2f} dB")
    for bits, _, _, gap in rows:
        assert 0.0 < gap <= 1.5, f"{codebook} K{bits}: gap {gap:+.2f} dB"


# ---------------------------------------------------------------- every legal pair, smoke

LEGAL_PAIRS = [(cb, b) for cb in CODEBOOKS for b in legal_bits(cb)]


@pytest.mark.parametrize(("codebook", "bits"), LEGAL_PAIRS)
def test_every_legal_pair_encodes_a_tail_biting_tile(codebook: str, bits: int) -> None:
    rms = _codebook_rms(codebook, bits)
    values = _gaussian((16, 16), rms, seed=bits)
    payload = encoder.encode(values, bits, codebook)
    assert payload.shape == (1, 1, 16 * bits)
    states = trellis.states(payload, bits)
    _assert_tail_biting(states, bits)
    decoded = trellis.decode(payload, codebook).double()
    assert float((decoded - values).pow(2).mean()) < 0.5 * rms**2


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        (dict(values=torch.zeros(16, 16, dtype=torch.int32)), TypeError, "values"),
        (dict(values=[[0.0] * 16] * 16), TypeError, "values"),
        (dict(values=torch.zeros(16)), ValueError, "values"),
        (dict(values=torch.zeros(16, 24)), ValueError, "values"),
        (dict(values=torch.zeros(0, 16)), ValueError, "values"),
        (dict(values=torch.full((16, 16), float("nan"))), ValueError, "values"),
        (dict(values=torch.full((16, 16), 7e4)), ValueError, "values"),
        (dict(codebook="qtip"), ValueError, "codebook"),
        (dict(codebook=3), TypeError, "codebook"),
        (dict(codebook="sqg_e4m3", bits=5), ValueError, "codebook"),
        (dict(bits=9), ValueError, "bits"),
        (dict(bits=2.0), TypeError, "bits"),
        (dict(returns="symbols"), ValueError, "returns"),
        (dict(chunk_bytes=0), ValueError, "chunk_bytes"),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict, error: type, name: str) -> None:
    call = dict(values=torch.zeros(16, 16), bits=2, codebook="mcg") | kwargs
    values, bits, codebook = call.pop("values"), call.pop("bits"), call.pop("codebook")
    with pytest.raises(error, match=name):
        encoder.encode(values, bits, codebook, **call)


@pytest.mark.parametrize(
    ("tiles", "error"),
    [
        (torch.zeros(2, 255), ValueError),
        (torch.zeros(2, 256, dtype=torch.int64), TypeError),
        (torch.full((1, 256), float("inf")), ValueError),
    ],
)
def test_bad_tiles_name_the_argument(tiles: torch.Tensor, error: type) -> None:
    with pytest.raises(error, match="tile_values"):
        encoder.encode_tiles(tiles, 2, "mcg")
