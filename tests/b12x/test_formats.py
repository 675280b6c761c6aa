"""b12x's own codebook registry and host tables, pinned by the spec's fingerprints (§2.9).

The digests below are copied from the spec (ground truth); when ``fixtures/fingerprints.json``
exists, every digest we pin must also appear in it, so the two copies cannot drift apart.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from b12x import formats

SPEC_DIGESTS = {
    ("3inst", "values"): "ad88de2dcff5bb05fff2faec37cceceb43aa1c2e8203f9d81a6fbd6dd3393eea",
    ("mcg", "values"): "95383563929baa9d1ae5de0be22490284382673620bdd85929feea7bdbef04a9",
    ("mul1", "values"): "bc48d02cb1c14939dc47b90f870dd689d63e3b1ab69a157e65538db68677a6c8",
    ("sqg_e4m3", "t12"): "cca11fe5744c9c93a34f4217f342fbc0f74ecc8a007c076582424a505fc9da5e",
    ("sqg_e4m3", "direct"): "24f49a880d70c223573ad2f9ded95361a91e04a93e2b87cac772ebf896c02ab1",
    ("sqg_e4m3", 2): "62027916386245a84c86156a0a08b6cf07e41548871af0e56fb40780558f6293",
    ("sqg_e4m3", 3): "afe7b3633e7d243b00b379b18ec4dca573722b3727cafef47fcb6470d7e7e6c9",
    ("sqg_e4m3", 4): "5a9620f0c4d8f0a60d0b6fbea921dcecbd193e6febf31043aaa6403c20389c2f",
    ("sqg_fp16", "d3l"): "17cf4ca9ef1e3a07c3354c12f7ac887b4e081b1668bea61eb37d8f2b410bb968",
    ("sqg_fp16", 5): "828f212de9a30e3ea5b321e2ab8637e7c633df2ce416fcabb747f094b654ee0a",
    ("sqg_fp16", 6): "2ec7ed71fd5658c9acbf1fa4587b6351898e8c0faa5dd5cc9a2b0a16371b1b54",
}

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "fingerprints.json"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _f16_bytes(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype="<f2").tobytes()


def test_t12_table_matches_fingerprint_and_samples():
    table = formats.t12_table()
    assert len(table) == 4096
    assert _sha(table) == SPEC_DIGESTS[("sqg_e4m3", "t12")]
    assert table[0:4] == bytes([0xCB, 0xCA, 0xCA, 0xC9])
    assert table[2048:2052] == bytes([0x00, 0x01, 0x01, 0x02])
    assert table[4095] == 0x4B
    assert len(set(table)) == 151


def test_d3l_descriptor_bytes_match_fingerprint():
    table = formats.d3l_descriptor_bytes()
    assert len(table) == 416
    assert _sha(table) == SPEC_DIGESTS[("sqg_fp16", "d3l")]
    # Descriptor 0 is (6.48828125, 0): the extreme tail.
    assert np.frombuffer(table[:4], dtype="<f2").tolist() == [6.48828125, 0.0]


@pytest.mark.parametrize("codebook", ["3inst", "mcg", "mul1"])
@pytest.mark.parametrize("bits", [2, 6])
def test_fp16_hash_host_mirror_matches_fingerprint(codebook, bits):
    # The fp16-hash codebooks do not depend on bits: any legal bits gives the same table.
    values = formats.host_state_values(codebook, bits)
    assert _sha(_f16_bytes(values)) == SPEC_DIGESTS[(codebook, "values")]


def test_spot_values_from_spec():
    mcg = formats.host_state_values("mcg", 4).view(np.uint16)
    assert [int(mcg[s]) for s in (0, 1, 0x1234, 0xFFFF)] == [0x3F60, 0x304E, 0x3E0F, 0x3ACD]
    inst = formats.host_state_values("3inst", 4).view(np.uint16)
    assert [int(inst[s]) for s in (0, 1, 0xFFFF)] == [0x3A25, 0xBB5B, 0xB110]
    mul1 = formats.host_state_values("mul1", 4).view(np.uint16)
    assert [int(mul1[s]) for s in (0, 1)] == [0xC2E8, 0x3921]


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_sqg_e4m3_state_bytes_match_direct_fingerprints(bits):
    assert _sha(formats.sqg_state_bytes(bits)) == SPEC_DIGESTS[("sqg_e4m3", bits)]


def test_sqg_e4m3_direct_all_rates():
    joined = b"".join(formats.sqg_state_bytes(b) for b in (2, 3, 4))
    assert _sha(joined) == SPEC_DIGESTS[("sqg_e4m3", "direct")]


def test_sqg_e4m3_sample_decodes():
    expected = {
        2: [3.5, -0.03515625, 0.5625, -1.25],
        3: [1.625, -0.5, 1.0, -1.125],
        4: [1.25, -0.75, -0.75, -1.125],
    }
    for bits, values in expected.items():
        got = formats.host_state_values("sqg_e4m3", bits)
        assert [float(got[s]) for s in (0, 1, 0x1234, 0xFFFF)] == values


@pytest.mark.parametrize("bits", [5, 6])
def test_sqg_fp16_host_mirror_matches_fingerprint(bits):
    values = formats.host_state_values("sqg_fp16", bits)
    assert _sha(_f16_bytes(values)) == SPEC_DIGESTS[("sqg_fp16", bits)]


def test_registry_fields():
    mcg = formats.resolve_format("mcg", 6)
    assert mcg.sentinel == 0xCBAC1FED == formats.MCG_SENTINEL
    assert not mcg.reads_lut
    assert formats.resolve_format("sqg_e4m3").legal_bits == (2, 3, 4)
    assert formats.resolve_format("sqg_fp16").legal_bits == (5, 6)
    assert formats.resolve_format("sqg_e4m3").reads_lut
    assert formats.resolve_format("sqg_fp16").reads_lut
    assert formats.lut_bytes("mcg") == b""
    assert len(formats.lut_bytes("sqg_e4m3")) == 4096
    assert len(formats.lut_bytes("sqg_fp16")) == 416
    ids = [f.codebook_id for f in formats.FORMATS.values()]
    assert len(set(ids)) == len(ids)
    # EXL3 cb ids for the fp16-hash family.
    assert [formats.FORMATS[c].codebook_id for c in ("3inst", "mcg", "mul1")] == [0, 1, 2]


def test_codebooks_are_distinct():
    tables = {c: formats.host_state_values(c, 4).tobytes() for c in ("3inst", "mcg", "mul1")}
    tables["sqg_e4m3"] = formats.host_state_values("sqg_e4m3", 4).tobytes()
    assert len(set(tables.values())) == len(tables)


@pytest.mark.parametrize(
    ("codebook", "bits", "exc"),
    [
        ("sqg_e4m3", 5, ValueError),
        ("sqg_fp16", 4, ValueError),
        ("mcg", 9, ValueError),
        ("mcg", 0, ValueError),
        ("nope", 4, ValueError),
        ("mcg", 4.0, TypeError),
        (3, 4, TypeError),
    ],
)
def test_resolve_rejects_bad_input(codebook, bits, exc):
    with pytest.raises(exc, match="codebook|bits"):
        formats.resolve_format(codebook, bits)


def test_fixture_digests_agree_with_spec_copy():
    assert FIXTURE.exists(), f"{FIXTURE} is missing: the fingerprints are ground truth"
    text = FIXTURE.read_text()
    json.loads(text)  # it must at least be valid JSON
    for digest in SPEC_DIGESTS.values():
        assert digest in text, f"spec digest {digest[:12]}… is not in {FIXTURE.name}"
