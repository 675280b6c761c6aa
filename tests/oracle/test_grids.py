"""Grids: buckets straddle every boundary, cases are stable, the filter grammar works."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from oracle.cases import grids as G
from oracle.cases import sampling
from oracle.cases.variants import Variant, variant_by_name


@functools.cache
def gpu_cases() -> tuple[G.Case, ...]:
    return tuple(G.cases(tier="gpu"))


def test_m_buckets_straddle_every_boundary():
    assert G.M_BUCKETS == (1, 2, 8, 9, 15, 16, 17, 63, 64, 127, 128, 129, 256, 1024, 4096)
    for boundary in (8, 16, 63, 128):  # both sides of each dispatch/tile boundary (63|64: decode)
        assert {boundary, boundary + 1} <= set(G.M_BUCKETS)
    assert {127, 128, 129} <= set(G.M_BUCKETS)


def test_every_variant_visits_every_m_bucket_on_gpu():
    seen: dict[str, set[int]] = {}
    for case in gpu_cases():
        seen.setdefault(case.variant.name, set()).add(case.m)
    from oracle.cases.variants import REGISTRY

    assert set(seen) == {v.name for v in REGISTRY}
    for name, ms in seen.items():
        assert ms == set(G.M_BUCKETS), name


def test_kn_buckets_cover_residues_glm_shapes_and_heavy():
    shapes = {(b.k, b.n) for b in G.KN_BUCKETS}
    assert all(k % 128 == 0 and n % 128 == 0 for k, n in shapes)
    for axis in (0, 1):
        residues_256 = {s[axis] % 256 for s in shapes}
        residues_512 = {s[axis] % 512 for s in shapes}
        assert residues_256 == {0, 128}
        assert {128, 256} <= residues_512
    assert {(2048, 4096), (6144, 1024), (512, 6144)} <= shapes
    heavy = [(b.k, b.n) for b in G.KN_BUCKETS + G.MOE_BUCKETS if b.heavy]
    assert (8192, 28672) in heavy
    for b in G.KN_BUCKETS:
        assert b.heavy == G.is_heavy("dense", b.k, b.n), b
    for b in G.MOE_BUCKETS:  # a bucket flagged heavy is heavy at every expert count
        assert b.heavy == G.is_heavy("moe", b.k, b.n, min(G.MOE_EXPERTS)), b


def test_a_moe_case_is_heavy_by_the_weights_of_its_whole_stack():
    """The heavy rule counts what a case generates and decodes: every expert's gate, up and
    down. A GLM-like expert is light alone and in a stack of 8, heavy in a stack of 256."""
    assert G.case_weights("moe", 2048, 1024, 8) == 8 * 3 * 2048 * 1024
    assert not G.is_heavy("moe", 2048, 1024, 8)
    assert G.is_heavy("moe", 2048, 1024, 256) and G.is_heavy("moe", 7168, 256, 64)
    assert G.is_heavy("dense", 8192, 28672) and not G.is_heavy("dense", 6144, 1024)
    with pytest.raises(ValueError, match="expert count"):
        G.case_weights("moe", 128, 128)
    moe = [c for c in gpu_cases() if c.variant.op == "moe"]
    for case in moe:
        assert case.heavy == (case.experts * 3 * case.k * case.n >= G.HEAVY_WEIGHTS), case
        assert G.parse_case_id(case.case_id).heavy == case.heavy
    light_256 = [c for c in moe if c.experts == 256 and not c.heavy]
    assert light_256 and {c.top_k for c in light_256} == set(G.MOE_TOP_K)
    assert {c.m for c in light_256} >= set(G.CROSS_M)


def test_moe_grid_covers_experts_and_top_k():
    moe = [c for c in gpu_cases() if c.variant.op == "moe"]
    assert {c.experts for c in moe} == {8, 64, 256}
    assert {c.top_k for c in moe} == {1, 2, 8}
    assert all(1 <= c.top_k <= c.experts for c in moe)
    assert all(c.experts is None and c.top_k is None for c in gpu_cases() if c.variant.op != "moe")


def test_pair_cases_use_one_pair_on_the_rate_axis():
    for case in gpu_cases():
        v = case.variant
        if v.pair_kind is None:
            continue
        if v.op == "moe" or v.rate_axis == "n":
            assert case.n == 256, case.case_id
        else:
            assert case.k == 256, case.case_id


def test_cpu_tier_is_small_and_never_heavy():
    cpu = G.cases(tier="cpu")
    assert cpu and len(cpu) < len(gpu_cases())
    assert not any(c.heavy for c in cpu)
    assert max(c.m for c in cpu) <= 256
    assert any(c.heavy for c in gpu_cases())


def test_case_ids_are_stable_filename_safe_and_invertible():
    case = G.Case(variant_by_name("dense/mcg/k6/fp16"), 17, 128, 384, seed=7)
    assert case.case_id == "dense-mcg-k6-fp16_m17_k128_n384_s7"
    moe = G.Case(variant_by_name("moe/mcg/k3/tiers_k3k4/fp16"), 1, 256, 256, 8, 2, seed=3)
    assert moe.case_id == "moe-mcg-k3-tiers_k3k4-fp16_m1_k256_n256_e8_t2_s3"
    for c in gpu_cases()[::97]:
        assert G.parse_case_id(c.case_id) == c
        assert all(ch.isalnum() or ch in "_-." for ch in c.case_id)
    first, second = G.cases(op="dense", max_cases=50), G.cases(op="dense", max_cases=50)
    assert first == second and len(first) == 50
    assert G.cases(op="dense", max_cases=5, base_seed=1)[0].seed != first[0].seed
    with pytest.raises(ValueError, match="case_id"):
        G.parse_case_id("dense-mcg-k6-fp16_m17")


def test_case_validation():
    v = Variant("mcg", 6)
    with pytest.raises(ValueError, match="experts"):
        G.Case(v, 1, 128, 128, experts=8, top_k=2)
    with pytest.raises(ValueError, match="m"):
        G.Case(v, -1, 128, 128)
    with pytest.raises(ValueError, match="top_k"):
        G.Case(Variant("mcg", 6, op="moe"), 1, 128, 128, experts=8, top_k=9)
    with pytest.raises(ValueError, match="tier"):
        G.cases(tier="tpu")
    with pytest.raises(ValueError, match="op"):
        G.cases(op="gemm")
    for bad in (-1, 1.5, "7", True):
        with pytest.raises(ValueError, match="base_seed"):
            G.cases(op="dense", base_seed=bad)
    with pytest.raises(TypeError, match="variants"):
        G.cases(variants=("dense/mcg/k6/fp16",))
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="max_cases"):
            G.cases(op="dense", max_cases=bad)
    with pytest.raises(TypeError, match="filter"):
        G.cases(filter=3)


def test_filter_grammar():
    selected = G.cases(filter="codebook=mcg,bits=6,m<=128,pair_kind=none", tier="gpu")
    assert selected
    for c in selected:
        assert c.variant.codebook == "mcg" and c.variant.bits == 6 and c.m <= 128
        assert c.variant.pair_kind is None
    expected = [
        c
        for c in gpu_cases()
        if c.variant.codebook == "mcg"
        and c.variant.bits == 6
        and c.m <= 128
        and c.variant.pair_kind is None
    ]
    assert selected == expected
    alt = G.parse_filter("codebook=sqg_e4m3|sqg_fp16, op!=moe, dtype=bf16, m>128, heavy=false")
    picked = [c for c in gpu_cases() if alt(c)]
    assert picked
    assert all(
        c.variant.codebook in ("sqg_e4m3", "sqg_fp16")
        and c.variant.op != "moe"
        and c.variant.compute_dtype == "bf16"
        and c.m > 128
        and not c.heavy
        for c in picked
    )
    named = G.parse_filter("name~P43,op=moe")
    assert {c.variant.pair_kind for c in gpu_cases() if named(c)} == {"P43"}
    assert len(G.parse_filter("").clauses) == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour=red", "unknown field"),
        ("codebook<mcg", "numeric"),
        ("bits~3", "string"),
        ("bits=six", "integer"),
        ("m", "malformed"),
        ("m>=", "no value"),
        ("heavy=maybe", "heavy"),
    ],
)
def test_filter_errors_name_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        G.parse_filter(text)


def test_generated_shapes_are_legal_for_their_variant():
    coupled = [c for c in gpu_cases() if c.variant.rotation == "coupled"]
    assert coupled and all(c.k % 512 == 0 for c in coupled)
    assert all(G.shape_illegal_reason(c.variant, c.k, c.n) is None for c in gpu_cases()[::13])
    pair = variant_by_name("dense/mcg/k3/P24k/fp16")
    assert "256" in G.shape_illegal_reason(pair, 512, 128)
    assert G.shape_illegal_reason(pair, 256, 384) is None
    assert "128" in G.shape_illegal_reason(Variant("mcg", 6), 192, 128)
    coupled_variant = variant_by_name("moe/mcg/k6/rot_coupled/fp16")
    assert "512" in G.shape_illegal_reason(coupled_variant, 384, 256)


# --- validation: SelectionError, one line, naming what is known ----------------------------


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("nosuchkey=1", ["unknown field", "nosuchkey", "known keys", "codebook", "top_k"]),
        ("m<=abc", ["m needs an integer", "'abc'"]),
        ("m=1.5", ["integer"]),
        ("codebook=MCG", ["unknown codebook 'MCG'", "case-sensitive", "sqg_fp16"]),
        ("codebook=mcg|MUL1", ["unknown codebook 'MUL1'", "mul1"]),
        ("op=gemm", ["unknown op 'gemm'", "decode, dense, moe"]),
        ("pair_kind=p22", ["unknown pair_kind", "P22"]),
        ("rate_axis=x", ["unknown rate_axis", "none, k, n"]),
        ("tier_layout=k4k3", ["unknown tier_layout", "k3k4"]),
        ("rotation=half", ["unknown rotation", "full"]),
        ("dtype=fp32", ["unknown compute_dtype", "fp16, bf16"]),
        ("codebook=None", ["unknown codebook 'None'"]),
        ("codebook=none", ["never none"]),
        ("bits=9", ["no registered variant has bits=9", "1, 2, 3, 4, 5, 6, 7, 8"]),
        ("codebook=mcg,bits=9", ["bits=9"]),
        ("codebook=sqg_e4m3,bits=6", ["contradicts the registry", "bits takes 2, 3, 4"]),
        ("op=decode,rotation=full", ["contradicts the registry", "rotation takes none"]),
        ("bits>8", ["contradicts the registry"]),
        ("m=3", ["no grid case has m=3", "4096"]),
        ("experts=7", ["no grid case has experts=7", "8, 64, 256"]),
        ("name=dense/mcg/k6/fp17", ["no registered variant is named", "dense/mcg/k6/fp16"]),
        ("id=nonsense", ["cannot parse case_id"]),
        ("codebook~xyz", ["no codebook contains 'xyz'"]),
        ("codebook=mcg|", ["empty value"]),
        ("heavy=True", ["heavy takes true/false"]),
    ],
)
def test_filter_refusals_are_one_line_selection_errors(text, needles):
    with pytest.raises(G.SelectionError) as info:
        G.parse_filter(text)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_legal_filters_still_parse():
    for text in (
        "codebook=mcg,bits=6,m<=128,pair_kind=none",
        "rate_axis=none,tier_layout=none",
        "codebook~sqg,op!=moe",
        "experts=none",
        "name=dense/mcg/k6/fp16,seed>=0",
        "id=" + gpu_cases()[5].case_id,
        "heavy=1",
    ):
        assert callable(G.parse_filter(text))


def test_a_selection_that_matches_nothing_is_refused():
    with pytest.raises(G.SelectionError, match="matches nothing.*heavy takes false"):
        G.select_cases(filter="heavy=true", tier="cpu")
    with pytest.raises(G.SelectionError, match="matches nothing"):
        G.select_cases(filter="op=moe", op="dense")
    with pytest.raises(G.SelectionError, match="not both"):
        G.select_cases(filter="m=1", case=gpu_cases()[0].case_id)
    for bad in (0, -3, True, 2.5):
        with pytest.raises(G.SelectionError, match="max-cases"):
            G.select_cases(filter="m=1", max_cases=bad)
    with pytest.raises(G.SelectionError, match="unknown op"):
        G.select_cases(op="gemm")
    assert len(G.select_cases(filter="codebook=mcg,bits=6,m=1", op="dense", tier="cpu")) > 0


def test_case_ids_must_be_generated_grid_points():
    for case in gpu_cases()[::211]:
        assert G.resolve_case_id(case.case_id) == case
    case = next(c for c in gpu_cases() if c.variant.name == "dense/mcg/k6/fp16" and c.m == 17)
    stem = case.case_id.rsplit("_s", 1)[0]
    with pytest.raises(G.SelectionError, match="not the grid's seed"):
        G.resolve_case_id(f"{stem}_s{case.seed + 1}")
    other_m = case.case_id.replace("_m17_", "_m3_")
    with pytest.raises(G.SelectionError, match="not a grid point of dense/mcg/k6/fp16: M takes"):
        G.resolve_case_id(other_m)
    other_shape = case.case_id.replace(f"_k{case.k}_", "_k4096_")
    with pytest.raises(G.SelectionError, match="not a grid point"):
        G.resolve_case_id(other_shape)
    with pytest.raises(G.SelectionError, match="not registered"):
        G.resolve_case_id("dense-sqg_e4m3-k6-fp16_m1_k128_n128_s1")
    with pytest.raises(G.SelectionError, match="cannot parse"):
        G.resolve_case_id("no-such-case")
    heavy = next(c for c in gpu_cases() if c.heavy)
    with pytest.raises(G.SelectionError, match="not in the cpu tier"):
        G.resolve_case_id(heavy.case_id, tier="cpu")


# --- stratified sampling ---------------------------------------------------------------------


def _strata(sample):
    return (
        {c.variant for c in sample},
        {(c.variant.op, c.m) for c in sample},
        {(c.variant.op, c.variant.compute_dtype) for c in sample},
    )


def test_a_1000_case_sample_of_the_gpu_grid_covers_every_stratum():
    grid = gpu_cases()
    sample = sampling.stratified_sample(grid, 1000)
    assert len(sample) == 1000 and len(set(sample)) == 1000
    assert {c.variant.codebook for c in sample} == {"3inst", "mcg", "mul1", "sqg_e4m3", "sqg_fp16"}
    assert {c.variant.bits for c in sample} == set(range(1, 9))
    assert _strata(sample) == _strata(grid)
    index = {c: i for i, c in enumerate(grid)}
    assert [index[c] for c in sample] == sorted(index[c] for c in sample)  # input order kept
    counts = Counter(c.variant for c in sample)
    assert max(counts.values()) - min(counts.values()) <= 1  # round-robin over the variants
    for variant in list(counts)[:20]:  # each variant is spread over its Ms
        ms = [c.m for c in sample if c.variant == variant]
        assert len(set(ms)) == len(ms), (variant.name, ms)


def test_the_sample_is_deterministic_and_max_cases_uses_it():
    grid = gpu_cases()
    first = sampling.stratified_sample(grid, 500)
    assert first == sampling.stratified_sample(list(grid), 500)
    assert sampling.stratified_sample(grid, 500, seed=1) != first
    sampled = G.cases(tier="gpu", max_cases=1000)
    assert sampled == sampling.stratified_sample(grid, 1000)
    assert sampling.stratified_sample(grid[:10], 50) == list(grid[:10])
    assert sampling.stratified_sample(grid, 0) == []
    # the old prefix took one codebook's low bit rates only
    assert len({c.variant.codebook for c in sampled}) == 5


def test_below_the_cover_size_the_sample_is_a_prefix_of_the_cover():
    dense = [c for c in gpu_cases() if c.variant.op == "dense"]
    cover = sampling.stratified_cover_size(dense)
    assert cover == len({c.variant for c in dense})  # one pick per variant suffices
    assert _strata(sampling.stratified_sample(dense, cover)) == _strata(dense)
    two = sampling.stratified_sample(dense, 2)
    assert {c.variant.compute_dtype for c in two} == {"fp16", "bf16"}  # dtypes come first
    small = sampling.stratified_sample(dense, 17)
    assert {c.m for c in small} == set(G.M_BUCKETS)  # then every M
    with pytest.raises(TypeError):
        sampling.stratified_sample([1, 2], 1)
    with pytest.raises(ValueError):
        sampling.stratified_sample(dense, -1)
