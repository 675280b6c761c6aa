"""§2.9 fingerprints of the fp16 hash codebooks, and the integrity of fixtures/fingerprints.json.

The digests are the spec's (transcribed into the fixture); the bytes hashed are the tables as
little-endian fp16 over states 0..65535, produced both by the module builders and through the
public ``state_values`` accessor for every legal bit rate.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from reference import codebooks
from reference.codebooks import fp16_hash

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "fingerprints.json"
BUILDERS = {
    "3inst_fp16_lut": ("3inst", fp16_hash.values_3inst),
    "mcg_fp16_lut": ("mcg", fp16_hash.values_mcg),
    "mul1_fp16_lut": ("mul1", fp16_hash.values_mul1),
}


def _tables() -> dict:
    return json.loads(FIXTURE.read_text())["tables"]


def _sha256_fp16_le(values: torch.Tensor) -> str:
    assert values.dtype == torch.float16 and values.shape == (65536,)
    return hashlib.sha256(values.numpy().astype("<f2").tobytes()).hexdigest()


@pytest.mark.parametrize("key", sorted(BUILDERS))
def test_builder_fingerprint(key):
    _, builder = BUILDERS[key]
    entry = _tables()[key]
    assert entry["bytes"].startswith("fp16 little-endian over states 0..65535")
    assert _sha256_fp16_le(builder()) == entry["sha256"]


@pytest.mark.parametrize("key", sorted(BUILDERS))
def test_state_values_fingerprint_for_every_legal_bitrate(key):
    codebook, _ = BUILDERS[key]
    expected = _tables()[key]["sha256"]
    for bits in codebooks.legal_bits(codebook):
        assert _sha256_fp16_le(codebooks.state_values(codebook, bits)) == expected


def test_a_one_ulp_change_changes_the_fingerprint():
    table = fp16_hash.values_mcg()
    table.view(torch.int16)[12345] += 1
    assert _sha256_fp16_le(table) != _tables()["mcg_fp16_lut"]["sha256"]


def test_fixture_has_every_row_of_the_spec_table():
    tables = _tables()
    assert len(tables) == 16
    for key, entry in tables.items():
        assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]), key
        assert entry["name"] and entry["bytes"], key
    digests = [entry["sha256"] for entry in tables.values()]
    assert len(set(digests)) == len(digests)
    # the two digests the spec also quotes in abbreviated form elsewhere (§2.7)
    d3l = tables["d3l_descriptor"]["sha256"]
    assert d3l.startswith("17cf4ca9ef1e3a07") and d3l.endswith("b968")


def test_fixture_little_endian_convention_is_what_numpy_writes():
    # guard against a big-endian host silently changing what "little-endian fp16" means
    assert np.array([1.0], dtype="<f2").tobytes() == b"\x00\x3c"
