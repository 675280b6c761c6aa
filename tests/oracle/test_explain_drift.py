"""``python -m oracle explain`` and ``python -m oracle drift`` (CPU only).

* explain: the K6/MCG small-M row is taken on a simulated sm_120 and rejected on sm_90 with its
  first failed condition (``b12x.ops.dense.dispatch.K6_ROW``: capability (12, 0) only); invalid
  problems are refused with the plan validator's message (one stderr line, exit 2); ``--json``
  carries the documented schema.
* drift: a grid case id shows faithful vs exact only; a saved case whose kernel output was made
  from ONE wrong decoded weight ``(k0, n0)`` is localised: the weight-space top entry is
  ``(k0, n0)``, the first K16 slice is ``k0 // 16`` and the first tile ``(k0 // 16, n0 // 16)``
  (the planted-fault proof that the map localises errors).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from oracle.cases.grids import cases
from oracle.cli import Refused
from oracle.cli import drift as drift_mod
from oracle.cli import explain as explain_mod
from oracle.report.results import save_case
from oracle.run.runners import saved_inputs

REPO = Path(__file__).resolve().parents[2]
K6 = ["--m", "32", "--k", "4096", "--n", "4096", "--codebook", "mcg", "--bits", "6"]


def _refusal(capsys, fn, argv):
    """Run ``fn(argv)``: it must refuse (exit 2) with ONE stderr line and print nothing."""
    with pytest.raises(Refused) as info:
        fn(argv)
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --- explain ------------------------------------------------------------------------------------


def test_k6_row_taken_on_simulated_sm120(capsys):
    e = explain_mod.explain_dense(m=32, k=4096, n=4096, codebook="mcg", bits=6, arch="sm_120")
    assert e.path == "k6_mcg_small_m"
    assert e.device["capability"] == [12, 0]
    assert [(r.row, r.status) for r in e.rows] == [
        ("k6_mcg_small_m", "taken"),
        ("decode_matmul", "not reached"),
        ("generic", "not reached"),
    ]
    names = [b.name for b in e.buffers]
    assert "workspace" in names and "gemm_output" not in names and "c_tmp" not in names
    assert e.tile is None and e.split_k == 1 and e.split_row == "off_generic_path"
    assert explain_mod.main([*K6, "--arch", "sm_120"]) == 0
    out = capsys.readouterr().out
    assert "path: k6_mcg_small_m" in out
    assert "1. k6_mcg_small_m  taken" in out


def test_k6_row_rejected_on_sm90_with_its_reason(capsys):
    e = explain_mod.explain_dense(m=32, k=4096, n=4096, codebook="mcg", bits=6, arch="sm_90")
    assert e.path == "generic"
    first = e.rows[0]
    assert (first.row, first.status) == ("k6_mcg_small_m", "rejected")
    assert first.reason == "capability=(9, 0) not in [(12, 0)]"
    assert (e.rows[1].status, e.rows[1].reason) == ("rejected", "m=32 < 257")  # sm_90's
    assert e.rows[2].status == "taken"
    assert e.tile == "64x256x256"
    assert any(b.name == "c_tmp" and b.shape[0] == e.split_k for b in e.buffers) == (e.split_k > 1)
    assert [r.status for r in e.split_rows].count("taken") == 1
    assert explain_mod.main([*K6, "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "k6_mcg_small_m  rejected     capability=(9, 0) not in [(12, 0)]" in out
    assert "split-K: row" in out and "c_tmp" in out


@pytest.mark.parametrize(
    ("m", "row", "m_warps", "split_row"),
    [(16, "small_m", 0, "fill_mid_m"), (32, "shared_thin", 2, "mainloop"),
     (64, "tensor_core_deep", 8, "mainloop"), (128, "tensor_swap", 8, "mainloop"),
     (256, "tensor_swap", 8, "mainloop")],
)  # fmt: skip
def test_mainloop_rows_and_the_split_they_plan(capsys, m, row, m_warps, split_row):
    """The mainloop table's row, its geometry and the split it plans (values from
    b12x.ops.dense.mainloop: thin split 4, the sm_90 tensor-core row split 1) agree with what
    plan_dense launches."""
    from b12x.ops.dense.plan import plan_dense
    from oracle.judge.tiles import DEVICES

    e = explain_mod.explain_dense(m=m, k=8192, n=28672, codebook="mcg", bits=4, arch="sm_90")
    assert e.path == "generic" and e.mainloop_row == row
    assert [r.status for r in e.mainloop_rows].count("taken") == 1
    assert e.geometry["m_warps"] == m_warps and e.split_row == split_row
    plan = plan_dense(
        m=m, k=8192, n=28672, bits=4, codebook="mcg", x_dtype=torch.float16,
        device=next(d for d in DEVICES if d.capability == (9, 0)),
    )  # fmt: skip
    assert e.split_requested == e.split_k == plan.split_k
    g = plan.geometry
    assert (plan.split_k, g.m_warps) == ({16: 8, 32: 4, 64: 1, 128: 1, 256: 1}[m], m_warps)
    assert g.swap_ab == (row == "tensor_swap") == e.geometry.get("swap_ab", False)
    assert g.stream_k == (m >= 64) == e.geometry["stream_k"]  # the tensor-core rows
    assert {"stream_k_flags", "stream_k_partials"} <= {b.name for b in e.buffers} or m < 64
    assert explain_mod.main(["--m", str(m), "--k", "8192", "--n", "28672", "--codebook", "mcg",
                             "--bits", "4", "--arch", "sm_90"]) == 0  # fmt: skip
    assert f"mainloop: row {row}" in capsys.readouterr().out


def test_k6_gate_reasons_on_sm120(capsys):
    bf16 = explain_mod.explain_dense(
        m=32, k=4096, n=4096, codebook="mcg", bits=6, arch="sm_120", x_dtype="bf16"
    )
    assert bf16.rows[0].reason == "compute_dtype=bfloat16 != float16"
    raw = explain_mod.explain_dense(
        m=32, k=4096, n=4096, codebook="mcg", bits=6, arch="sm_120", rotation="none"
    )
    assert raw.rows[0].status == "rejected" and "external H128" in raw.rows[0].reason
    big = explain_mod.explain_dense(m=129, k=4096, n=4096, codebook="mcg", bits=6, arch="sm_120")
    assert (big.rows[0].reason, big.path) == ("m=129 > 128", "decode_matmul")


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--bits", "9"], ["bits", "1, 2, 3, 4, 5, 6, 7, 8", "got 9"]),
        (["--bits", "4", "--codebook", "nope"], ["codebook", "'nope'", "mcg", "sqg_fp16"]),
        (["--bits", "4", "--k", "100"], ["K=100", "multiples of 128"]),
        (["--bits", "4", "--arch", "sm_70"], ["--arch", "sm_70", "sm_120"]),
        (["--bits", "4", "--top-k", "2"], ["--top-k", "--op dense", "--k"]),
    ],
)
def test_explain_refusals(capsys, argv, needles):
    base = ["--m", "8", "--k", "256", "--n", "256", "--codebook", "mcg"]
    line = _refusal(capsys, explain_mod.main, base + argv)
    assert line.startswith("python -m oracle explain: error: ")
    for needle in needles:
        assert needle in line


def test_explain_json_and_schema_doc(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert explain_mod.main([*K6, "--arch", "sm_120", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["schema"] == "oracle.explain/1" == explain_mod.SCHEMA
    assert data["op"] == "dense" and data["path"] == "k6_mcg_small_m"
    assert data["rows"][0] == {
        "index": 1,
        "row": "k6_mcg_small_m",
        "status": "taken",
        "reason": "all conditions hold",
        "description": data["rows"][0]["description"],
    }
    assert {"name", "shape", "dtype", "role", "zeroed", "nbytes"} <= set(data["buffers"][0])
    doc = (REPO / "docs" / "json_schemas.md").read_text()
    assert "oracle.explain/1" in doc and "oracle.drift/1" in doc


def test_explain_moe_decisions(capsys):
    e = explain_mod.explain_moe(
        m=64, top_k=8, hidden=2048, intermediate=768, codebook="mcg", bits=4, experts=64,
        arch="sm_120",
    )  # fmt: skip
    roles = [d.role for d in e.decisions]
    assert roles[:2] == ["mainloop", "route_block"] and "fc2[0].fc2_tile" in roles
    assert all(d.reasons and d.reasons[-1] == f"{d.path}: selected" for d in e.decisions)
    assert e.buffers[0].name == "output" and e.buffers[0].shape == (64, 2048)
    argv = ["--op", "moe", "--m", "4", "--top-k", "2", "--hidden", "1024", "--intermediate",
            "512", "--codebook", "mcg", "--bits", "3", "--experts", "8"]  # fmt: skip
    assert explain_mod.main(argv) == 0
    assert "route_block: table moe_route_block" in capsys.readouterr().out
    line = _refusal(capsys, explain_mod.main, [*argv, "--pair", "P99"])
    assert "P33" in line and "dynamic" in line


# --- drift --------------------------------------------------------------------------------------


@functools.cache  # a frozen Case: one grid walk per filter
def _case(flt: str):
    return cases(op="dense", filter=flt, tier="cpu")[0]


RAW = "codebook=mcg,bits=6,dtype=fp16,rotation=none,m=129,k=128,n=128"
FULL = "codebook=mcg,bits=6,dtype=fp16,rotation=full,m=129,k=128,n=128"


def _save(case, y, tmp_path, **inputs_override):
    """Save like the runners do (oracle.run.runners.common._save): inputs + ``y`` + meta."""
    tensors = {**saved_inputs(case), **inputs_override, "y": y}
    meta = {
        "case_id": case.case_id,
        "case": case.to_dict(),
        "execution": f"gpu.dense.{case.case_id}",
        "note": "planted fault",
        "kind": "grid",
    }
    return save_case(meta, tensors, tmp_path)


def test_drift_case_id_shows_exact_vs_faithful(capsys):
    case = _case("codebook=mcg,bits=4,dtype=bf16,rotation=full,m=17,k=128,n=384")
    report = drift_mod.drift(case.case_id)
    stats = report.comparisons["faithful_vs_exact"]
    assert 0 < stats.rel_l2 < 0.05 and stats.max_abs > 0 and stats.mean_abs > 0
    assert report.comparisons["kernel_vs_exact"] is None and report.error_map is None
    assert drift_mod.main([case.case_id]) == 0
    out = capsys.readouterr().out
    assert "faithful vs exact" in out
    assert "kernel vs faithful  not available (no saved output)" in out


def test_drift_localises_one_planted_weight(tmp_path, capsys):
    """Raw GEMM: y = faithful + x[:, k0]·δ in column n0, i.e. W[k0, n0] off by δ."""
    case = _case(RAW)
    k0, n0, delta = 37, 101, 0.5
    inputs = saved_inputs(case)
    _, faithful, *_ = drift_mod._references(case, inputs)
    y = faithful.to(torch.float64)
    y[:, n0] += inputs["x"][:, k0].to(torch.float64) * delta
    path = _save(case, y.to(faithful.dtype), tmp_path)

    report = drift_mod.drift(str(path), top=3)
    e = report.error_map
    assert report.comparisons["kernel_vs_faithful"].rel_l2 > 0
    assert (e.entries[0].k, e.entries[0].n) == (k0, n0)
    assert e.entries[0].estimate == pytest.approx(delta, rel=0.05)
    assert e.slices[0].slice == k0 // 16 and e.slices[0].explained > 0.9
    assert e.slices[1].explained < 0.5
    assert (e.tiles[0].kt, e.tiles[0].nt) == (k0 // 16, n0 // 16)
    assert e.columns[0].n == n0 and e.least_squares == "unique"
    assert report.execution == f"gpu.dense.{case.case_id}"

    out_json = tmp_path / "drift.json"
    assert drift_mod.main([str(path), "--top", "3", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert f"(k={k0}, n={n0})" in out and f"slice {k0 // 16}" in out
    data = json.loads(out_json.read_text())
    assert data["schema"] == "oracle.drift/1"
    assert data["error_map"]["entries"][0]["k"] == k0


def test_drift_localises_a_wrong_decoded_weight_through_the_rotations(tmp_path):
    """EXL3 linear: the faithful pipeline over Wq with one entry off; the map undoes svh and
    the output H128 and finds the entry in decoded-weight coordinates."""
    from oracle.run.runners.inputs import compute_dtype
    from reference.linear import forward_decoded

    case = _case(FULL)
    k0, n0 = 90, 7
    inputs = saved_inputs(case)
    _, _, weight, *_ = drift_mod._references(case, inputs)
    wrong = weight.clone()
    wrong[k0, n0] += 1.0
    y = forward_decoded(
        inputs["x"], wrong, inputs["suh"], inputs["svh"], precision="faithful",
        compute_dtype=compute_dtype(case),
    )  # fmt: skip
    e = drift_mod.drift(str(_save(case, y, tmp_path)), top=2).error_map
    assert (e.entries[0].k, e.entries[0].n) == (k0, n0)
    assert e.slices[0].slice == k0 // 16
    assert (e.tiles[0].kt, e.tiles[0].nt) == (k0 // 16, n0 // 16)


def test_drift_refusals(tmp_path, capsys):
    moe = cases(op="moe", tier="cpu")[0]
    line = _refusal(capsys, drift_mod.main, [moe.case_id])
    assert "drift supports dense cases" in line and "replay" in line
    assert "CASE_ID_OR_FILE" in _refusal(capsys, drift_mod.main, ["not_a_case"])
    line = _refusal(capsys, drift_mod.main, [str(tmp_path / "absent.json")])
    assert "CASE_ID_OR_FILE" in line and "absent.json" in line
    case = _case(RAW)
    x = saved_inputs(case)["x"].clone()
    x[0, 0] += 1
    edited = _save(case, torch.zeros(case.m, case.n, dtype=torch.float16), tmp_path, x=x)
    line = _refusal(capsys, drift_mod.main, [str(edited)])
    assert "`x` differs" in line
    assert "--top" in _refusal(capsys, drift_mod.main, [case.case_id, "--top", "0"])
