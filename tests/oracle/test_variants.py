"""The variant registry: legality against the spec tables, names, coverage reasons, tolerances."""

from __future__ import annotations

import pytest

from oracle.cases import variants as V
from oracle.cases.variants import Variant

# Spec tables written out again here (docs/architecture.md "Legal (codebook, bits)", spec §4.3
# pair vocabulary), so that the registry's own tables are checked, not reused.
SPEC_BITS = {
    "3inst": set(range(1, 9)),
    "mcg": set(range(1, 9)),
    "mul1": set(range(1, 9)),
    "sqg_e4m3": {2, 3, 4},
    "sqg_fp16": {5, 6},
}
SPEC_PAIRS = {"P22": (2, 2), "P33": (3, 3), "P24": (2, 4), "P43": (4, 3), "P44": (4, 4)}


@pytest.fixture
def fake_contract(monkeypatch):
    """A typed contract (b12x.support's own classes) that declares exactly three variants: the
    MCG K6 fp16 dense linear (generic path), its raw GEMM, and one SQG-E4M3 K2 MoE."""
    import torch

    from b12x.support import DeclaredVariant, OpContract
    from oracle.cases import declared

    def never(*args, **kwargs):
        raise AssertionError("a coverage question must not plan or run anything")

    def contract(name, variants):
        return OpContract(
            name=name, plan=never, bind=never, run=never, allocate=never, graph_op=never,
            custom_op=None, variants=tuple(variants), dispatch=(), tiles=None, observables={},
        )  # fmt: skip

    f16 = torch.float16
    ops = (
        contract("dense", [DeclaredVariant("dense", "mcg", 6, f16, "full", paths=("generic",)),
                           DeclaredVariant("dense", "mcg", 6, f16, "none", paths=("generic",))]),
        contract("moe", [DeclaredVariant("moe", "sqg_e4m3", 2, f16, "full", layouts=("packed",))]),
    )  # fmt: skip
    monkeypatch.setattr(declared, "ops", lambda: ops)
    V.clear_declarations()
    yield
    V.clear_declarations()


def test_unpaired_registry_matches_the_spec_bits_table():
    unpaired = {(v.codebook, v.bits) for v in V.REGISTRY if v.record_bits is None}
    expected = {(cb, b) for cb, bits in SPEC_BITS.items() for b in bits}
    assert unpaired == expected
    for op in V.OPS:
        for dtype in ("fp16",):
            got = {(v.codebook, v.bits) for v in V.all_variants(op) if v.record_bits is None}
            assert got == expected, op
            assert any(v.compute_dtype == dtype for v in V.all_variants(op))


@pytest.mark.parametrize("codebook", sorted(SPEC_BITS))
def test_bits_outside_the_table_are_illegal_with_a_reason(codebook):
    for bits in range(1, 9):
        variant = Variant(codebook, bits, op="dense")
        assert variant.legal == (bits in SPEC_BITS[codebook])
        if bits not in SPEC_BITS[codebook]:
            assert codebook in variant.illegal_reason and str(bits) in variant.illegal_reason


def test_registry_tables_agree_with_the_reference():
    from reference import pairs
    from reference.codebooks import legal_bits

    assert dict(V.PAIR_KINDS) == SPEC_PAIRS == dict(pairs.PAIR_KINDS)
    for codebook, bits in SPEC_BITS.items():
        assert set(V.CODEBOOK_BITS[codebook]) == bits == set(legal_bits(codebook))


def test_pair_variants_have_records_legal_for_their_codebook():
    paired = [v for v in V.REGISTRY if v.pair_kind is not None]
    assert paired
    kinds_by_codebook = {}
    for v in paired:
        lo, hi = SPEC_PAIRS[v.pair_kind]
        assert lo in SPEC_BITS[v.codebook] and hi in SPEC_BITS[v.codebook], v.name
        assert v.bits == 3, v.name  # trellis_bits = 3 base specialisation (spec §4.2)
        assert (v.rate_axis is None) == (v.op == "moe"), v.name
        kinds_by_codebook.setdefault(v.codebook, set()).add(v.pair_kind)
    assert "sqg_fp16" not in kinds_by_codebook  # K5/K6 only: no pair record rate is legal
    assert kinds_by_codebook["sqg_e4m3"] == set(SPEC_PAIRS)
    assert kinds_by_codebook["mcg"] == set(SPEC_PAIRS)
    for kind in SPEC_PAIRS:
        for axis in ("k", "n"):
            assert Variant("mcg", 3, kind, axis, op="dense").legal
        assert not Variant("sqg_fp16", 3, kind, "k", op="dense").legal


def test_tiers_are_one_mcg_moe_variant():
    tiered = [v for v in V.REGISTRY if v.tier_layout is not None]
    assert [(v.codebook, v.op, v.bits, v.compute_dtype, v.rotation) for v in tiered] == [
        ("mcg", "moe", 3, "fp16", "full"),
        ("mcg", "moe", 3, "bf16", "full"),  # b12x ships a bf16 MoE arm (module docstring)
    ]
    assert all(v.record_bits == (3, 4) for v in tiered)
    assert not Variant("sqg_e4m3", 3, tier_layout="k3k4", op="moe").legal
    assert not Variant("mcg", 3, tier_layout="k3k4", op="dense").legal


def test_illegal_variants_are_enumerable_with_reasons():
    illegal = dict(V.illegal_variants())
    assert illegal and all(isinstance(r, str) and r for r in illegal.values())
    expected_illegal = [
        Variant("sqg_fp16", 4, op="dense"),
        Variant("sqg_e4m3", 5, op="decode", rotation="none"),
        Variant("mcg", 6, rate_axis="k", op="dense"),
        Variant("mcg", 6, "P24", "k", op="dense"),  # pairs compile on bits 3
        Variant("mcg", 3, "P24", None, op="dense"),  # dense pair needs a rate axis
        Variant("mcg", 3, "P24", "k", op="moe"),  # MoE pairs are phase-bound
        Variant("mcg", 3, "P24", "k", "k3k4", op="dense"),
        Variant("mcg", 6, op="moe", rotation="none"),  # the trellis MoE always rotates
        Variant("mcg", 6, op="dense", rotation="coupled"),
        Variant("mcg", 6, op="decode", rotation="full"),
    ]
    for v in expected_illegal:
        assert v in illegal, v
    assert not set(V.REGISTRY) & set(illegal)


def test_names_are_stable_unique_and_parse_back():
    assert Variant("mcg", 6).name == "dense/mcg/k6/fp16"
    assert Variant("mcg", 3, "P24", "k", op="dense").name == "dense/mcg/k3/P24k/fp16"
    assert Variant("mcg", 6, op="moe", rotation="coupled").name == "moe/mcg/k6/rot_coupled/fp16"
    names = [v.name for v in V.REGISTRY]
    assert len(names) == len(set(names))
    for v in V.REGISTRY:
        assert "-" not in v.name
        assert Variant.from_name(v.name) == v
        assert V.variant_by_name(v.name) is v
    with pytest.raises(ValueError, match="name"):
        Variant.from_name("dense/mcg/six/fp16")
    with pytest.raises(ValueError, match="no registered variant"):
        V.variant_by_name("dense/sqg_fp16/k4/fp16")


def test_vocabulary_errors_name_the_argument():
    with pytest.raises(ValueError, match="codebook"):
        Variant("mcg2", 3)
    with pytest.raises(TypeError, match="bits"):
        Variant("mcg", "3")
    with pytest.raises(ValueError, match="pair_kind"):
        Variant("mcg", 3, "P55", "k")
    with pytest.raises(ValueError, match="compute_dtype"):
        Variant("mcg", 3, compute_dtype="fp32")


def test_declared_contract_drives_coverage(fake_contract):
    dense = V.variant_by_name("dense/mcg/k6/fp16")
    moe = V.variant_by_name("moe/sqg_e4m3/k2/fp16")
    assert dense.kernel_coverage == "b12x:dense[generic]" and dense.no_coverage_reason is None
    assert moe.kernel_coverage == "b12x:moe"
    decode = V.variant_by_name("decode/mcg/k6/fp16")  # no decode op declared: no coverage
    assert decode.kernel_coverage is None and "does not declare" in decode.no_coverage_reason
    coupled = V.variant_by_name("moe/sqg_e4m3/k2/rot_coupled/fp16")
    assert coupled.kernel_coverage is None and "out of scope" in coupled.no_coverage_reason
    other = V.variant_by_name("dense/mcg/k5/fp16")
    assert other.kernel_coverage is None and "does not declare" in other.no_coverage_reason
    covered = [v for v in V.REGISTRY if v.kernel_coverage]
    assert {v.name for v in covered} == {
        "dense/mcg/k6/fp16",
        "dense/mcg/k6/rot_none/fp16",
        "moe/sqg_e4m3/k2/fp16",
    }
    assert dense.supported("sm_90", "fp16") == (True, dense.supported((9, 0), "fp16")[1])
    assert dense.supported(120, "fp16")[0]
    assert not dense.supported("sm_75", "fp16")[0]
    ok, reason = dense.supported("sm_90", "bf16")
    assert not ok and "bf16" in reason


def test_supported_rejects_bad_arguments():
    v = Variant("mcg", 6)
    with pytest.raises(ValueError, match="arch"):
        v.supported("hopper", "fp16")
    with pytest.raises(ValueError, match="dtype"):
        v.supported("sm_90", "fp32")


def test_tolerance_overrides_are_data_with_reasons():
    assert V.variant_by_name("decode/mcg/k6/fp16").tolerance.exact
    moe = V.variant_by_name("moe/mcg/k6/fp16").tolerance  # the stage model, no MoE override
    assert moe == V.variant_by_name("dense/mcg/k6/fp16").tolerance and moe.alpha == 2.0
    dense = V.variant_by_name("dense/mcg/k6/bf16").tolerance
    assert dense.alpha == 2.0 and not dense.exact and "bf16" in dense.reason
    for override in V.TOLERANCE_OVERRIDES:
        assert override.reason.strip()
    with pytest.raises(ValueError, match="reason"):
        V.ToleranceOverride(match={"op": "dense"}, changes={"alpha": 3.0}, reason=" ")
    with pytest.raises(ValueError, match="unknown fields"):
        V.ToleranceOverride(match={"opp": "dense"}, changes={}, reason="x")


def test_reference_decoder_maps_to_the_reference_entry_points():
    from reference import pairs, trellis

    dec = V.variant_by_name("dense/sqg_e4m3/k3/fp16").reference_decoder()
    assert dec.func is trellis.decode and dec.keywords == {"codebook": "sqg_e4m3"}
    tier = next(v for v in V.REGISTRY if v.tier_layout).reference_decoder()
    assert tier.func is trellis.decode and tier.keywords == {"codebook": "mcg"}
    pair = V.variant_by_name("dense/mcg/k3/P24n/fp16").reference_decoder()
    assert pair.func is pairs.decode_pair
    assert pair.keywords == {"kind": "P24", "codebook": "mcg", "rate_axis": "n"}
    moe_pair = V.variant_by_name("moe/mcg/k3/P43/fp16").reference_decoder()
    assert "rate_axis" not in moe_pair.keywords
    with pytest.raises(ValueError, match="illegal"):
        Variant("sqg_fp16", 4).reference_decoder()


def test_every_kernel_b12x_declares_is_judged_by_a_registered_variant():
    from b12x import support

    V.clear_declarations()
    assert not V.unmapped()
    for contract in support.OPS:
        if contract.name in V.EXECUTION_OPS:
            continue
        assert contract.variants, contract.name
        for entry in contract.variants:
            variant, why = V.registry_variant(entry)
            assert variant is not None, why
            assert variant.kernel_coverage, (entry, variant.no_coverage_reason)


def test_kernel_specializations_follow_codebook_bits_dtype_and_kind(fake_contract, monkeypatch):
    from types import SimpleNamespace as Spec

    specs = [
        Spec(kind="decode", codebook="mcg", bits=6, bf16=False),
        Spec(kind="gemm", codebook="mcg", bits=6, bf16=False),
        Spec(kind="gemm", codebook="mcg", bits=6, bf16=True),
        Spec(kind="gemm", codebook="mcg", bits=5, bf16=False),
        Spec(kind="reduce", codebook=None, bits=None, bf16=False),
    ]
    from b12x import support

    monkeypatch.setattr(support, "kernel_specializations", lambda: specs)
    assert V.variant_by_name("dense/mcg/k6/fp16").kernel_specializations() == (specs[1],)
    assert V.variant_by_name("dense/mcg/k5/fp16").kernel_specializations() == ()  # not covered
    assert V.variant_by_name("moe/sqg_e4m3/k2/fp16").kernel_specializations() == ()
