"""Metrics against values computed by hand on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.judge.metrics import (
    BOUND_FIELDS,
    compute_metrics,
    rel_l2,
    row_block_rel_l2,
    row_cosines,
    tile_errors,
)
from oracle.pytest_plugin import scaled_examples


def test_scaled_output_has_rel_l2_epsilon():
    torch.manual_seed(0)
    ref = torch.randn(8, 32, dtype=torch.float64)
    eps = 1e-3
    m = compute_metrics(ref * (1 + eps), ref)
    assert m.rel_l2 == pytest.approx(eps, rel=1e-9)
    rms = ref.pow(2).mean().sqrt().item()
    assert m.max_abs_rel == pytest.approx(eps * ref.abs().max().item() / rms, rel=1e-9)
    assert m.sqnr_db == pytest.approx(-20 * math.log10(eps), rel=1e-9)
    assert m.worst_row_cosine == pytest.approx(1.0, abs=1e-12)
    assert (m.nan_count, m.inf_count, m.numel, m.shape) == (0, 0, 256, (8, 32))
    assert m.faithful_rel_l2 is None and m.ratio is None


def test_two_by_two_by_hand():
    ref = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    y = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    m = compute_metrics(y, ref)
    assert m.rel_l2 == pytest.approx(1 / math.sqrt(30))
    assert m.max_abs_rel == pytest.approx(1 / math.sqrt(30 / 4))
    assert m.sqnr_db == pytest.approx(10 * math.log10(30))
    assert m.worst_row == 1
    assert m.worst_row_cosine == pytest.approx(29 / (5 * math.sqrt(34)))


def test_orthogonal_rows_have_cosine_zero_and_zero_rows_follow_the_rule():
    ref = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [2.0, 2.0]])
    y = torch.tensor([[0.0, 1.0], [-1.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    cos = row_cosines(y, ref)
    assert cos.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    m = compute_metrics(y[:2], ref[:2])
    assert m.worst_row_cosine == 0.0
    assert m.rel_l2 == pytest.approx(math.sqrt(2))
    both_zero = compute_metrics(torch.zeros(2, 3), torch.zeros(2, 3))
    assert both_zero.worst_row_cosine == 1.0 and both_zero.rel_l2 == 0.0
    assert both_zero.sqnr_db == math.inf


def test_faithful_ratio():
    torch.manual_seed(1)
    ref = torch.randn(4, 16, dtype=torch.float64)
    delta = 1e-3
    m = compute_metrics(ref * (1 + 2 * delta), ref, faithful=ref * (1 + delta))
    assert m.faithful_rel_l2 == pytest.approx(delta, rel=1e-9)
    assert m.ratio == pytest.approx(2.0, rel=1e-9)
    exact_faithful = compute_metrics(ref * (1 + delta), ref, faithful=ref.clone())
    assert exact_faithful.faithful_rel_l2 == 0.0 and exact_faithful.ratio == math.inf


def test_nan_and_inf_are_counted():
    ref = torch.ones(3, 4)
    y = ref.clone()
    y[0, 1] = float("nan")
    y[2, 0] = float("inf")
    y[2, 3] = float("-inf")
    m = compute_metrics(y, ref)
    assert (m.nan_count, m.inf_count) == (1, 2)
    assert math.isnan(m.rel_l2)


def test_inputs_of_any_float_dtype_are_compared_in_float64():
    ref = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    y = torch.tensor([[1.0, 3.0]], dtype=torch.float16) + torch.tensor([[0.0, 2**-9]]).half()
    assert rel_l2(y, ref) == pytest.approx(2**-9 / math.sqrt(10), rel=1e-12)


def test_row_block_rel_l2_localises_one_bad_block():
    ref = torch.ones(40, 8, dtype=torch.float64)
    y = ref.clone()
    y[20] = 1.5  # row 20 sits in block 1 of 16-row blocks
    blocks = row_block_rel_l2(y, ref, row_block=16)
    assert blocks.shape == (3,)
    assert blocks[0] == 0 and blocks[2] == 0
    assert blocks[1].item() == pytest.approx(math.sqrt(8 * 0.25) / math.sqrt(16 * 8))
    last = row_block_rel_l2(y, ref, row_block=32)  # second block is short (8 rows)
    assert last.shape == (2,) and last[1] == 0
    zero_ref = row_block_rel_l2(torch.tensor([[0.0], [1.0]]), torch.zeros(2, 1), row_block=1)
    assert zero_ref.tolist() == [0.0, math.inf]


def test_tile_errors_map_one_wrong_element_to_its_tile():
    ref = torch.ones(48, 64)
    y = ref.clone()
    y[20, 40] += 0.5  # tile (1, 2)
    errors = tile_errors(y, ref, tile=16)
    assert errors.shape == (3, 4)
    expected = torch.zeros(3, 4, dtype=torch.float64)
    expected[1, 2] = math.sqrt(0.25 / 256)  # RMS over the tile, RMS(ref) = 1
    torch.testing.assert_close(errors, expected, rtol=1e-12, atol=0)
    assert tile_errors(torch.ones(20, 20), torch.ones(20, 20), tile=16).shape == (2, 2)


def test_to_dict_has_every_metric():
    d = compute_metrics(torch.ones(2, 2), torch.ones(2, 2), torch.ones(2, 2)).to_dict()
    assert set(d) == {
        "rel_l2",
        "max_abs_rel",
        "sqnr_db",
        "worst_row_cosine",
        "worst_row",
        "faithful_rel_l2",
        "ratio",
        "nan_count",
        "inf_count",
        "numel",
        "shape",
        *BOUND_FIELDS,
    }
    assert d["shape"] == [2, 2] and d["ratio"] == 0.0


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="shape"):
        compute_metrics(torch.ones(2, 3), torch.ones(3, 2))
    with pytest.raises(TypeError, match="exact"):
        compute_metrics(torch.ones(2), [1.0, 1.0])
    with pytest.raises(ValueError, match="faithful"):
        compute_metrics(torch.ones(2), torch.ones(2), torch.ones(3))
    with pytest.raises(ValueError, match="row_block"):
        row_block_rel_l2(torch.ones(2, 2), torch.ones(2, 2), row_block=0)
    with pytest.raises(ValueError, match="tile"):
        tile_errors(torch.ones(2, 2), torch.ones(2, 2), tile=0)


@settings(deadline=None, max_examples=scaled_examples(30))
@given(
    shape=st.sampled_from([(1,), (3, 16), (17, 8), (2, 5, 32)]),
    noise=st.sampled_from([1e-6, 1e-3, 0.3]),
    scale=st.sampled_from([1e-3, 1.0, 4096.0]),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_metric_identities(shape, noise, scale, seed):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(shape, dtype=torch.float64, generator=g)
    y = ref + noise * torch.randn(shape, dtype=torch.float64, generator=g)
    m = compute_metrics(y, ref)
    # SQNR and rel-L2 are two views of one number; both are scale invariant.
    assert m.sqnr_db == pytest.approx(-20 * math.log10(m.rel_l2), rel=1e-9)
    scaled = compute_metrics(y * scale, ref * scale)
    assert scaled.rel_l2 == pytest.approx(m.rel_l2, rel=1e-9)
    assert scaled.worst_row_cosine == pytest.approx(m.worst_row_cosine, rel=1e-12)
    # The worst row cosine is the minimum of the per-row cosines, each in [-1, 1].
    cos = row_cosines(y, ref)
    assert m.worst_row_cosine == pytest.approx(float(cos.min()), abs=0)
    assert float(cos.abs().max()) <= 1 + 1e-12
    # rel-L2 over the whole tensor is the energy-weighted mean of the block rel-L2s.
    blocks = row_block_rel_l2(y, ref, row_block=1)
    rows_ref = ref.reshape(-1, shape[-1])
    energy = (rows_ref**2).sum(dim=1)
    assert (blocks**2 * energy).sum().item() / energy.sum().item() == pytest.approx(
        m.rel_l2**2, rel=1e-9
    )


def test_applied_bounds_are_reported_and_default_to_none():
    m = compute_metrics(torch.ones(2, 2), torch.ones(2, 2))
    d = m.to_dict()
    assert set(BOUND_FIELDS) <= set(d)
    assert all(d[name] is None for name in BOUND_FIELDS)
    bounded = m.with_bounds(coarse_bound=2e-3, coarse_ratio=0.5, envelope_violations=0)
    assert (bounded.coarse_bound, bounded.coarse_ratio) == (2e-3, 0.5)
    assert bounded.envelope_violations == 0 and bounded.rel_l2 == m.rel_l2
    assert bounded.to_dict()["coarse_bound"] == 2e-3
    with pytest.raises(ValueError, match="unknown fields"):
        m.with_bounds(rel_l2=0.0)
