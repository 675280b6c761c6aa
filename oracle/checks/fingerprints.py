"""Codebook and table fingerprints (§2.9): every table in fixtures/fingerprints.json.

Each table listed under ``tables`` is rebuilt through :mod:`reference` and its SHA-256 compared
with the spec's digest (spec §2.9; bytes exactly as the JSON's ``bytes`` field says: little-endian
fp16 over states 0..65535 for value tables, raw u8 for byte tables). Value tables of codebooks
whose values do not depend on the bitrate (3INST, MCG, MUL1) are hashed at every legal bitrate,
so ``state_values`` cannot silently mix rates. A listed table with no builder mapped here is a
``skip`` naming it; the digest file itself is data transcribed from the spec, never computed.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from oracle.report.report import CheckResult
from reference.codebooks import legal_bits, sqg_e4m3, sqg_fp16, sqg_legacy, state_values

__all__ = ["FINGERPRINTS_PATH", "builders", "run", "sha256_of"]

FINGERPRINTS_PATH = Path(__file__).resolve().parents[2] / "fixtures" / "fingerprints.json"


def sha256_of(table) -> str:
    """SHA-256 of a tensor's little-endian bytes in index order (or of raw bytes)."""
    if isinstance(table, bytes | bytearray):
        return hashlib.sha256(table).hexdigest()
    return hashlib.sha256(table.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def _values(codebook: str, bits: int):
    return state_values(codebook, bits)


def _all_rates(codebook: str) -> list:
    return [_values(codebook, b) for b in legal_bits(codebook)]


@functools.cache
def builders() -> dict[str, Callable[[], list]]:
    """table key -> builder returning the list of byte tables that must all match the digest."""
    return {
        "3inst_fp16_lut": lambda: _all_rates("3inst"),
        "mcg_fp16_lut": lambda: _all_rates("mcg"),
        "mul1_fp16_lut": lambda: _all_rates("mul1"),
        "xor_cheb_t12": lambda: [sqg_e4m3.t12_table()],
        "xor_cheb_direct_all": lambda: [sqg_e4m3.direct_table()],
        "xor_cheb_direct_k2": lambda: [sqg_e4m3.state_bytes(2)],
        "xor_cheb_direct_k3": lambda: [sqg_e4m3.state_bytes(3)],
        "xor_cheb_direct_k4": lambda: [sqg_e4m3.state_bytes(4)],
        "legacy_sqg_cheb_direct_all": lambda: [sqg_legacy.direct_table()],
        "legacy_sqg_cheb_k2": lambda: [sqg_legacy.state_bytes(2)],
        "legacy_sqg_cheb_k3": lambda: [sqg_legacy.state_bytes(3)],
        "legacy_sqg_cheb_k4": lambda: [sqg_legacy.state_bytes(4)],
        "q8h4_k2_slice": lambda: [sqg_legacy.q8h4_k2_state_bytes()],
        "d3l_descriptor": lambda: [sqg_fp16.descriptor_bytes()],
        "d3l_k5_fp16_lut": lambda: [_values("sqg_fp16", 5)],
        "d3l_k6_fp16_lut": lambda: [_values("sqg_fp16", 6)],
    }


def _check_table(key: str, expected: str, build: Callable[[], list]) -> CheckResult:
    name = f"fingerprints.{key}"
    try:
        tables = build()
    except Exception as exc:  # noqa: BLE001 - a builder that crashes fails its check
        return CheckResult(
            name, "cpu", "fail", f"reference builder raised {type(exc).__name__}: {exc}"
        )
    digests = [sha256_of(t) for t in tables]
    bad = [i for i, d in enumerate(digests) if d != expected]
    metrics = {"sha256": digests[0] if digests else "", "tables_hashed": len(digests)}
    if bad:
        return CheckResult(
            name,
            "cpu",
            "fail",
            f"sha256 {digests[bad[0]][:16]}… != spec {expected[:16]}… "
            f"({len(bad)} of {len(digests)} builds)",
            metrics,
        )
    return CheckResult(name, "cpu", "pass", "", metrics)


def run(ctx=None, path: Path = FINGERPRINTS_PATH) -> list[CheckResult]:
    data = json.loads(Path(path).read_text())
    tables = data.get("tables", {})
    known = builders()
    out: list[CheckResult] = []
    for key, row in tables.items():
        if key not in known:
            out.append(
                CheckResult(
                    f"fingerprints.{key}",
                    "cpu",
                    "skip",
                    f"no reference builder mapped for table {key!r}",
                )
            )
            continue
        out.append(_check_table(key, row["sha256"], known[key]))
    return out
