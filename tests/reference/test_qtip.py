"""Tests for reference.qtip: quack's QTIP 4-bit blob (spec §8).

Expectations are built without the module under test:

* the state table, the stream windows and the block positions are evaluated here in plain
  Python integers straight from the rules of §8 (``_py_*``), with the constants written out
  again; fixtures/fingerprints.json (``qtip_w4``) holds their digests, and those digests were
  produced by these helpers and agree with quack-kernels 0.6.5;
* the fragment positions are also rebuilt from the WGMMA register table (§8.3), a second form;
* encoder optimality is checked by exhaustive single-nibble changes of every stream;
* the cross-check against quack runs when ``quack.operand_transform.formats.qtip`` imports.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import re
import struct
import sys
import types
from pathlib import Path

import pytest
import torch

from reference import qtip

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "fingerprints.json"
FORMAT_DOC = ROOT / "docs" / "format.md"


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # the encoder's many small ops run fastest on one thread here
    yield
    torch.set_num_threads(previous)


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text())["qtip_w4"]  # a missing key fails, never skips


# --- §8 in plain Python integers --------------------------------------------------------------


def _py_bf16(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def _py_round_bf16(x: float) -> int:
    """Bit pattern of ``x`` rounded to nearest-even bf16 (``x`` must be exact in float32)."""
    assert struct.unpack("<f", struct.pack("<f", x))[0] == x, x
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def _py_state_bits(s: int) -> int:
    x = (s * 89226354 + 64248484) % (1 << 32)
    r = (x & 0x81FF81FF) ^ 0x3E003E00
    return _py_round_bf16(_py_bf16(r >> 16) + _py_bf16(r & 0xFFFF))


_PY_TABLE: list[int] = []


def _py_table() -> list[int]:
    if not _PY_TABLE:
        _PY_TABLE.extend(_py_state_bits(s) for s in range(1 << 16))
    return _PY_TABLE


def _py_position(t: int, j: int) -> tuple[int, int]:
    b, p, e = j // 8, (j // 2) % 4, j % 2
    return 16 * (t // 32) + (t % 32) // 4 + 8 * (p % 2), 16 * b + 2 * (t % 4) + 8 * (p // 2) + e


def _py_state(stream: bytes, j: int) -> int:
    """Bits [4j, 4j+16) of the 128-bit little-endian integer of ``stream``, cyclically."""
    s = int.from_bytes(stream, "little")
    return ((s >> (4 * j)) | (s << (128 - 4 * j))) & 0xFFFF


def _py_decode(blob: torch.Tensor) -> list[list[int]]:
    """bf16 bit patterns of ``Wt[N, K]``, decoded element by element."""
    groups, k_blocks = blob.shape[:2]
    table = _py_table()
    out = [[-1] * (64 * k_blocks) for _ in range(64 * groups)]
    for g in range(groups):
        for kt in range(k_blocks):
            block = bytes(blob[g, kt].reshape(-1).tolist())
            for t in range(128):
                stream = block[16 * t : 16 * t + 16]
                for j in range(32):
                    row, col = _py_position(t, j)
                    out[64 * g + row][64 * kt + col] = table[_py_state(stream, j)]
    return out


def _le16(bits) -> bytes:
    return b"".join(struct.pack("<H", b) for b in bits)


def _bits_of(values: torch.Tensor) -> list[int]:
    assert values.dtype == torch.bfloat16
    return (values.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF).reshape(-1).tolist()


def _example_blob() -> torch.Tensor:
    rule = _fixture()["worked_example"]["rule"]
    assert "(167·i + 13) mod 256" in rule
    data = [(167 * i + 13) % 256 for i in range(128 * 16)]
    return torch.tensor(data, dtype=torch.uint8).reshape(1, 1, 128, 16)


def _random_blob(shape: tuple[int, int], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (*shape, 128, 16), generator=gen, dtype=torch.uint8)


# --- the state table --------------------------------------------------------------------------


def test_python_state_table_matches_fingerprint():
    entry = _fixture()["state_table"]
    assert entry["bytes"].startswith("bf16 bit patterns as little-endian u16 over states 0..65535")
    assert hashlib.sha256(_le16(_py_table())).hexdigest() == entry["sha256"]


def test_state_values_match_fingerprint_and_python_table():
    values = qtip.state_values()
    assert values.dtype == torch.bfloat16 and values.shape == (65536,)
    assert _bits_of(values) == _py_table()
    digest = hashlib.sha256(_le16(_bits_of(values))).hexdigest()
    assert digest == _fixture()["state_table"]["sha256"]


def test_state_spot_values():
    spots = _fixture()["state_spots"]
    assert len(spots) >= 5
    values = qtip.state_values()
    for state, bits in spots.items():
        s, expected = int(state, 16), int(bits, 16)
        assert _py_table()[s] == expected, state
        assert _bits_of(values[s : s + 1]) == [expected], state


def test_state_values_are_a_fresh_copy_and_bounded():
    first = qtip.state_values()
    first.fill_(0)
    again = qtip.state_values().float()
    assert not torch.equal(again, first.float())
    assert bool(torch.isfinite(again).all()) and float(again.abs().max()) < 4
    assert abs(float(again.pow(2).mean().sqrt()) - 1.2396) < 1e-3


# --- positions and streams --------------------------------------------------------------------

# WGMMA m64k16 A fragment, per k16 block: register r of a lane -> (row + 8?, col offset).
_FRAGMENT_REGISTERS = [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)]


def test_sequence_coordinates_follow_the_fragment_table_and_cover_the_block():
    rows, cols = qtip.sequence_coordinates()
    assert rows.shape == cols.shape == (128, 32) and rows.dtype == cols.dtype == torch.int64
    for t in range(128):
        warp, lane = divmod(t, 32)
        group, quad = divmod(lane, 4)
        for j in range(32):
            block, register = divmod(j, 8)
            dr, dc = _FRAGMENT_REGISTERS[register]
            expected = (16 * warp + group + dr, 16 * block + 2 * quad + dc)
            assert (int(rows[t, j]), int(cols[t, j])) == expected == _py_position(t, j), (t, j)
    flat = (rows * 64 + cols).reshape(-1)
    assert torch.equal(flat.sort().values, torch.arange(4096))
    rows.fill_(0)  # a copy: the next call is unaffected
    assert int(qtip.sequence_coordinates()[0].max()) == 63


def test_stream_states_are_cyclic_windows():
    blob = _random_blob((2, 1), seed=3)
    states = qtip.stream_states(blob)
    assert states.shape == (2, 1, 128, 32) and states.dtype == torch.int64
    for g, t in [(0, 0), (0, 77), (1, 127)]:
        stream = bytes(blob[g, 0, t].tolist())
        assert states[g, 0, t].tolist() == [_py_state(stream, j) for j in range(32)]
    # tail-biting: consecutive states share 12 bits, state 31 -> state 0 included
    following = torch.roll(states, shifts=-1, dims=-1)
    assert torch.equal(following & 0xFFF, states >> 4)
    # state j's low nibble is nibble j: byte j // 2, low nibble first
    nibbles = torch.stack((blob.long() & 0xF, blob.long() >> 4), dim=-1).reshape(2, 1, 128, 32)
    assert torch.equal(states & 0xF, nibbles)
    assert qtip.stream_states(blob[0, 0, 5]).shape == (32,)


# --- decode -----------------------------------------------------------------------------------


def test_worked_example_fingerprint_and_spots():
    entry = _fixture()["worked_example"]
    blob = _example_blob()
    assert bytes(blob[0, 0, 0].tolist()).hex() == entry["thread0_bytes"]
    decoded = qtip.decode(blob)
    assert decoded.dtype == torch.bfloat16 and decoded.shape == (64, 64)
    python_bits = [b for row in _py_decode(blob) for b in row]
    assert hashlib.sha256(_le16(python_bits)).hexdigest() == entry["sha256"]
    assert hashlib.sha256(_le16(_bits_of(decoded))).hexdigest() == entry["sha256"]
    states = qtip.stream_states(blob)[0, 0]
    assert len(entry["spots"]) >= 5
    for spot in entry["spots"]:
        t, j, row, col = spot["thread"], spot["j"], spot["row"], spot["col"]
        assert _py_position(t, j) == (row, col)
        assert int(states[t, j]) == int(spot["state"], 16)
        assert _bits_of(decoded[row, col : col + 1]) == [int(spot["bf16"], 16)]
        assert float(decoded[row, col]) == spot["value"]


@pytest.mark.parametrize(("grid", "seed"), [((1, 1), 0), ((2, 3), 1), ((3, 1), 2)])
def test_decode_matches_the_python_decode(grid, seed):
    blob = _random_blob(grid, seed)
    decoded = qtip.decode(blob)
    assert decoded.shape == (64 * grid[0], 64 * grid[1])
    assert _bits_of(decoded) == [b for row in _py_decode(blob) for b in row]


def test_decode_with_a_scale_is_the_exact_float64_product():
    blob = _random_blob((2, 2), seed=4)
    plain = qtip.decode(blob)
    for scale in (0.1, 3, -2.5e-3):
        scaled = qtip.decode(blob, scale)
        fp32 = float(torch.tensor(float(scale), dtype=torch.float32))
        assert scaled.dtype == torch.float64
        assert torch.equal(scaled, plain.double() * fp32)
    assert torch.equal(qtip.decode(blob, 1.0), plain.double())


def test_any_stream_decodes_finite():
    for fill in (0x00, 0xFF, 0x80):
        blob = torch.full((1, 1, 128, 16), fill, dtype=torch.uint8)
        assert bool(torch.isfinite(qtip.decode(blob).float()).all())


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("blob", "error"),
    [
        (torch.zeros(1, 1, 128, 16, dtype=torch.int16), TypeError),
        (torch.zeros(1, 1, 128, 16), TypeError),
        ([0] * 16, TypeError),
        (torch.zeros(1, 128, 16, dtype=torch.uint8), ValueError),
        (torch.zeros(1, 1, 1, 128, 16, dtype=torch.uint8), ValueError),
        (torch.zeros(1, 1, 128, 8, dtype=torch.uint8), ValueError),
        (torch.zeros(1, 1, 64, 16, dtype=torch.uint8), ValueError),
        (torch.zeros(1, 1, 16, 128, dtype=torch.uint8), ValueError),
        (torch.zeros(0, 1, 128, 16, dtype=torch.uint8), ValueError),
    ],
)
def test_decode_rejects_bad_blobs(blob, error):
    with pytest.raises(error, match=r"^blob: "):
        qtip.decode(blob)


@pytest.mark.parametrize(
    ("scale", "error"),
    [(True, TypeError), ("2", TypeError), (torch.tensor(2.0), TypeError)]
    + [(float("nan"), ValueError), (float("inf"), ValueError), (1e39, ValueError)],
)
def test_decode_rejects_bad_scales(scale, error):
    with pytest.raises(error, match=r"^scale: "):
        qtip.decode(torch.zeros(1, 1, 128, 16, dtype=torch.uint8), scale)


def test_stream_states_rejects_bad_streams():
    with pytest.raises(TypeError, match=r"^streams: "):
        qtip.stream_states(torch.zeros(128, 16, dtype=torch.int8))
    for shape in [(128, 8), (), (16, 1)]:
        with pytest.raises(ValueError, match=r"^streams: "):
            qtip.stream_states(torch.zeros(shape, dtype=torch.uint8))


@pytest.mark.parametrize(
    ("w", "error"),
    [
        (torch.zeros(64, 64, dtype=torch.int32), TypeError),
        (None, TypeError),
        (torch.zeros(64 * 64), ValueError),
        (torch.zeros(1, 64, 64), ValueError),
        (torch.zeros(64, 96), ValueError),
        (torch.zeros(0, 64), ValueError),
        (torch.full((64, 64), float("nan")), ValueError),
        (torch.full((64, 64), 1e6), ValueError),
    ],
)
def test_encode_rejects_bad_weights(w, error):
    with pytest.raises(error, match=r"^w: "):
        qtip.encode(w)


# --- encode -----------------------------------------------------------------------------------


def _sequence_errors(nibbles: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """float64 squared error of each stream (nibbles ``[..., 32]``) against ``targets[..., 32]``."""
    states = sum(torch.roll(nibbles, shifts=-i, dims=-1) << (4 * i) for i in range(4))
    values = torch.tensor([_py_bf16(b) for b in _py_table()], dtype=torch.float64)
    return (values[states] - targets).pow(2).sum(dim=-1)


def test_encode_round_trip_is_optimal_for_its_closing_edge():
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(64, 64, generator=gen, dtype=torch.float64)
    blob = qtip.encode(w)
    assert blob.dtype == torch.uint8 and blob.shape == (1, 1, 128, 16)
    decoded = qtip.decode(blob)
    assert _bits_of(decoded) == [b for row in _py_decode(blob) for b in row]
    mse = float((decoded.double() - w).pow(2).mean())
    # D(R) = 2^-8 ≈ 0.0039 is the floor at 4 bits; the trellis lands near 0.0055
    assert 2.0**-8 < mse < 0.008, mse

    targets = torch.empty(128, 32, dtype=torch.float64)
    for t in range(128):
        for j in range(32):
            targets[t, j] = w[_py_position(t, j)]
    nibbles = torch.stack((blob[0, 0].long() & 0xF, blob[0, 0].long() >> 4), -1).reshape(128, 32)
    best = _sequence_errors(nibbles, targets)
    assert abs(float(best.sum()) - float((decoded.double() - w).pow(2).sum())) < 1e-9
    # Nibbles 0..2 are state 0's in-edge, fixed by pass 1; given them, the path is the cheapest,
    # so no change of one other nibble may lower a stream's error (float32 costs: tiny slack).
    trial = nibbles.reshape(128, 1, 1, 32).repeat(1, 29, 16, 1)  # [stream, m - 3, value, 32]
    trial[:, torch.arange(29), :, torch.arange(3, 32)] = torch.arange(16)
    errors = _sequence_errors(trial, targets.reshape(128, 1, 1, 32))
    assert bool((errors >= best.reshape(128, 1, 1) - 1e-5).all())
    assert bool((errors.amin(dim=(1, 2)) == best).all())  # the unchanged stream is among them


def test_encode_finds_a_reachable_target_exactly():
    blob = _random_blob((1, 1), seed=5)
    target = qtip.decode(blob)
    assert torch.equal(qtip.decode(qtip.encode(target.float())), target)


# --- the documentation carries the fixture's digests ------------------------------------------


def test_format_doc_quotes_the_fixture_digests():
    text = FORMAT_DOC.read_text(encoding="utf-8")
    start = text.index("## 8. ")
    section = text[start : text.index("\n## ", start + 1)]
    digests = set(re.findall(r"`([0-9a-f]{64})`", section))
    entry = _fixture()
    assert digests == {entry["state_table"]["sha256"], entry["worked_example"]["sha256"]}


# --- cross-check against quack-kernels 0.6.5 (optional peer) ----------------------------------


@pytest.fixture(scope="module")
def quack_qtip():
    """quack's host-side QTIP module. quack's package ``__init__`` imports its autotuner, which
    needs triton (not a declared dependency, absent on a CPU machine); the host reference needs
    neither, so when that import fails the module is loaded under a bare ``quack`` package."""
    spec = importlib.util.find_spec("quack")  # finds, does not import
    if spec is None:
        pytest.skip("quack-kernels is not installed (optional peer: pip install quack-kernels)")
    name = "quack.operand_transform.formats.qtip"
    try:
        module = importlib.import_module(name)
    except ImportError:
        _forget_quack()
        bare = types.ModuleType("quack")
        bare.__path__ = list(spec.submodule_search_locations)
        sys.modules["quack"] = bare
        module = importlib.import_module(name)
        yield module
        _forget_quack()  # the next importer sees quack as installed, not this bare package
    else:
        yield module


def _forget_quack() -> None:
    for key in [k for k in sys.modules if k == "quack" or k.startswith("quack.")]:
        del sys.modules[key]


def test_quack_state_table_and_coordinates(quack_qtip):
    theirs = quack_qtip.qtip_state_values("cpu")
    assert torch.equal(qtip.state_values().float(), theirs)
    digest = hashlib.sha256(_le16(_bits_of(theirs.to(torch.bfloat16)))).hexdigest()
    assert digest == _fixture()["state_table"]["sha256"]
    rows, cols = quack_qtip._seq_coords("cpu")
    ours = qtip.sequence_coordinates()
    assert torch.equal(ours[0], rows) and torch.equal(ours[1], cols)


@pytest.mark.parametrize(("grid", "seed"), [((1, 1), 20), ((2, 3), 21), ((4, 2), 22)])
def test_quack_dequant_matches_decode(quack_qtip, grid, seed):
    blob = _random_blob(grid, seed)
    theirs = quack_qtip.dequant_qtip_reference(blob)
    assert theirs.dtype == torch.float32
    assert torch.equal(qtip.decode(blob).float(), theirs)
    # quack's host dequant ignores its sf argument: the scale is the GEMM's epilogue alpha
    assert torch.equal(quack_qtip.dequant_qtip_reference(blob, 0.25), theirs)
    fp32 = float(torch.tensor(0.3, dtype=torch.float32))
    assert torch.equal(qtip.decode(blob, 0.3), theirs.double() * fp32)


def test_quack_worked_example(quack_qtip):
    decoded = quack_qtip.dequant_qtip_reference(_example_blob()).to(torch.bfloat16)
    digest = hashlib.sha256(_le16(_bits_of(decoded))).hexdigest()
    assert digest == _fixture()["worked_example"]["sha256"]


@pytest.mark.slow  # quack's own quantiser takes about 20 s for one block on one core
def test_quack_quantizer_round_trip(quack_qtip, request):
    if "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("quack's quantiser round trip runs only when selected with -m slow")
    gen = torch.Generator().manual_seed(12)
    w = torch.randn(64, 64, generator=gen)
    blob, sf = quack_qtip.quantize_qtip_reference(w)
    assert sf is None and blob.dtype == torch.uint8 and blob.shape == (1, 1, 128, 16)
    assert torch.equal(qtip.decode(blob).float(), quack_qtip.dequant_qtip_reference(blob))
    ours = qtip.encode(w)
    their_error = float((qtip.decode(blob).float() - w).pow(2).sum())
    our_error = float((qtip.decode(ours).float() - w).pow(2).sum())
    assert our_error <= their_error * (1 + 1e-6)
