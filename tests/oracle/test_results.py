"""Saved failing cases: bit-exact round trip of values, dtypes and strides; no pickle."""

from __future__ import annotations

import functools
import json
import pickle
import struct

import pytest
import torch

from oracle.cases.grids import Case
from oracle.cases.variants import variant_by_name
from oracle.judge.metrics import compute_metrics
from oracle.judge.tolerance import judge
from oracle.report.results import load_case, replay_command, save_case, save_failing_case


def tensors_with_awkward_layouts() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    base = torch.randn(6, 10, generator=g).to(torch.float16)
    bits = torch.randint(-(1 << 15), 1 << 15, (4, 2, 48), generator=g, dtype=torch.int16)
    return {
        "x_transposed": base.t(),  # strides (1, 10)
        "x_sliced": base[1:5:2, 3:9],  # storage offset 13, strides (20, 1)
        "trellis": bits[:, 1],  # non-contiguous int16 payload
        "broadcast": torch.arange(3, dtype=torch.float32).expand(4, 3),  # stride 0
        "bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "special": torch.tensor([float("nan"), -0.0, float("inf")], dtype=torch.float32),
        "scalar": torch.tensor(7, dtype=torch.int64),
    }


def meta_for(case_id: str) -> dict:
    case = Case(variant_by_name("dense/mcg/k6/fp16"), 17, 128, 128, seed=11)
    e = torch.ones(4, 4)
    verdict = judge(e * 1.5, e, e, None)
    return {"case_id": case_id, "case": case, "seed": case.seed, "verdict": verdict}


def test_round_trip_is_bit_exact_with_strides(tmp_path):
    tensors = tensors_with_awkward_layouts()
    path = save_case(meta_for("rt_case"), tensors, tmp_path)
    loaded = load_case(path)
    assert set(loaded.tensors) == set(tensors)
    for name, original in tensors.items():
        got = loaded.tensors[name]
        assert got.dtype == original.dtype, name
        assert got.shape == original.shape, name
        assert got.stride() == original.stride(), name
        assert got.is_contiguous() == original.is_contiguous(), name
        # bit-exact, NaN and -0.0 included: compare the raw bytes of the same-layout copies
        a = original.contiguous().reshape(-1).view(torch.uint8)
        b = got.contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(a, b), name


def test_sidecar_records_everything_a_replay_needs(tmp_path):
    path = save_case(meta_for("meta_case"), tensors_with_awkward_layouts(), tmp_path)
    meta = json.loads(path.read_text())
    assert meta["seed"] == 11
    assert meta["case"]["variant"]["name"] == "dense/mcg/k6/fp16"
    assert meta["case"]["case_id"] == "dense-mcg-k6-fp16_m17_k128_n128_s11"
    assert meta["tensors"]["x_transposed"] == {
        "shape": [10, 6],
        "stride": [1, 10],
        "dtype": "float16",
        "device": "cpu",
        "contiguous": False,
    }
    assert set(meta["versions"]) == {"python", "torch", "numpy", "cutlass"}
    assert meta["versions"]["torch"] == torch.__version__
    assert meta["git_sha"] == "unknown" or len(meta["git_sha"]) == 40
    assert meta["device"]
    assert meta["verdict"]["passed"] is False and meta["verdict"]["metrics"]["rel_l2"] > 0
    assert meta["replay"] == replay_command(path) == f"python -m oracle replay {path}"


def test_only_safetensors_and_json_are_written_and_no_pickle_runs(tmp_path, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("pickle must not be used")

    monkeypatch.setattr(pickle, "dumps", forbidden)
    monkeypatch.setattr(pickle, "dump", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(torch, "save", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    path = save_case(meta_for("np_case"), tensors_with_awkward_layouts(), tmp_path)
    load_case(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["np_case.json", "np_case.safetensors"]
    raw = (tmp_path / "np_case.safetensors").read_bytes()
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + header_len])  # safetensors: a JSON header, then raw bytes
    assert set(header) - {"__metadata__"} == set(tensors_with_awkward_layouts())
    assert b"\x80\x04" not in raw[:2] and not raw.startswith(b"PK")  # not a pickle / torch zip


def test_load_accepts_any_of_the_three_paths(tmp_path):
    path = save_case(meta_for("paths"), {"a": torch.arange(4)}, tmp_path)
    for variant in (path, path.with_suffix(".safetensors"), path.with_suffix(""), str(path)):
        assert torch.equal(load_case(variant).tensors["a"], torch.arange(4))


def test_non_finite_metrics_are_strict_json(tmp_path):
    e = torch.ones(2, 2)
    y = e.clone()
    y[0, 0] = float("nan")
    meta = {"case_id": "nan_case", "metrics": compute_metrics(y, e)}
    path = save_case(meta, {"y": y}, tmp_path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["metrics"]["rel_l2"] == "nan"


def test_bad_input_is_rejected_before_writing(tmp_path):
    with pytest.raises(ValueError, match="case_id"):
        save_case({"case_id": "../escape"}, {"a": torch.ones(1)}, tmp_path)
    with pytest.raises(ValueError, match="case_id"):
        save_case({}, {"a": torch.ones(1)}, tmp_path)
    with pytest.raises(TypeError, match="tensors"):
        save_case({"case_id": "x"}, {"a": [1.0]}, tmp_path)
    with pytest.raises(TypeError, match="JSON"):
        save_case({"case_id": "x", "bad": object()}, {"a": torch.ones(1)}, tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="sidecar"):
        load_case(tmp_path / "missing.json")


def test_save_failing_case_echoes_the_replay_command_and_restores_the_case(tmp_path):
    case = Case(variant_by_name("moe/sqg_e4m3/k2/fp16"), 9, 256, 256, 8, 2, seed=4)
    e = torch.ones(3, 16)
    verdict = judge(e * 1.1, e, e, None)
    printed = []
    path = save_failing_case(case, {"y": e * 1.1}, tmp_path, verdict, echo=printed.append, tile=7)
    assert printed == [
        f"saved failing case {case.case_id}; replay with: python -m oracle replay {path}"
    ]
    loaded = load_case(path)
    assert loaded.case == case
    assert loaded.meta["variant"] == "moe/sqg_e4m3/k2/fp16" and loaded.meta["tile"] == 7
    assert loaded.meta["verdict"]["passed"] is False
    assert loaded.meta["metrics"]["rel_l2"] == pytest.approx(0.1)
    bare = load_case(save_case({"case_id": "bare"}, {"a": torch.ones(1)}, tmp_path))
    assert bare.case is None


# --- strict loading and grid-case consistency -------------------------------------------------


@functools.cache  # a frozen Case: one grid walk per (op, filter), not one per saved file
def _first_cpu_case(op: str, flt: str) -> Case:
    from oracle.cases.grids import cases

    return cases(op=op, filter=flt, tier="cpu")[0]


def _grid_case_files(tmp_path, op="dense", flt="codebook=mcg,bits=4,m=9,k=128,n=128,rotation=full"):
    from oracle.run.runners import saved_inputs as make_inputs

    case = _first_cpu_case(op, flt)
    inputs = make_inputs(case)
    if op == "decode":
        y = torch.zeros(case.k, case.n, dtype=torch.float16)
    else:
        y = torch.zeros(case.m, case.n, dtype=inputs["x"].dtype)
    path = save_case({"case_id": case.case_id, "case": case}, {**inputs, "y": y}, tmp_path)
    return case, path


def _edit_sidecar(path, **changes):
    meta = json.loads(path.read_text())
    meta.update(changes)
    path.write_text(json.dumps(meta))


def test_load_refuses_corrupt_files_with_one_line(tmp_path):
    from oracle.report.results import CaseFileError

    def refused(path, needle):
        with pytest.raises(CaseFileError) as info:
            load_case(path)
        assert needle in str(info.value) and "\n" not in str(info.value), str(info.value)

    def fresh(name):
        return save_case(meta_for(name), {"a": torch.arange(6.0).reshape(2, 3)}, tmp_path)

    path = fresh("c1")
    path.write_text("{ not json")
    refused(path, "is not JSON")
    path = fresh("c2")
    path.write_text("[]")
    refused(path, "expected a JSON object")
    path = fresh("c3")
    _edit_sidecar(path, schema="oracle.report/2")
    refused(path, "render it with `python -m oracle report`")
    path = fresh("c4")
    _edit_sidecar(path, case_id=None)
    refused(path, "'case_id' must be")
    path = fresh("c5")
    _edit_sidecar(path, tensors={"a": {"shape": [2, 3], "stride": [3], "dtype": "float32"}})
    refused(path, "differ in length")
    path = fresh("c6")
    _edit_sidecar(path, tensors={"a": {"shape": [4, 3], "stride": [3, 1], "dtype": "float32"}})
    refused(path, "needs 12")
    path = fresh("c7")
    _edit_sidecar(path, tensors={"a": {"shape": [2, 3], "stride": [3, 1], "dtype": "float16"}})
    refused(path, "the sidecar says torch.float16")
    path = fresh("c8")
    _edit_sidecar(path, tensors={"a": {"shape": "2x3", "stride": [3, 1], "dtype": "float32"}})
    refused(path, "shape must be a list")
    path = fresh("c9")
    _edit_sidecar(path, tensors={"a": {"shape": [2, 3], "stride": [3, 1], "dtype": "floaty"}})
    refused(path, "unknown dtype 'floaty'")
    path = fresh("c10")
    _edit_sidecar(path, tensor_file="../elsewhere.safetensors")
    refused(path, "must be a file name")
    path = fresh("c11")
    path.with_suffix(".safetensors").unlink()
    refused(path, "is missing")
    path = fresh("c12")
    blob = path.with_suffix(".safetensors")
    blob.write_bytes(blob.read_bytes()[:20])
    refused(path, "corrupt tensor file")
    path = save_case(meta_for("c13"), {"a": torch.ones(2), "b": torch.ones(2)}, tmp_path)
    _edit_sidecar(path, tensors={"a": json.loads(path.read_text())["tensors"]["a"]})
    refused(path, "does not list: ['b']")
    refused(tmp_path / "nothing_here", "no sidecar")


def test_grid_case_layout_matches_the_grid_runner():
    from oracle.cases.grids import cases
    from oracle.run.replay import grid_case_layout
    from oracle.run.runners import saved_inputs as make_inputs

    picked = cases(tier="cpu", filter="op!=moe,pair_kind=none,k=128,n=128,m=9")
    assert {(c.variant.op, c.variant.rotation, c.variant.compute_dtype) for c in picked} == {
        ("decode", "none", "fp16"),
        ("decode", "none", "bf16"),
        ("dense", "full", "fp16"),
        ("dense", "full", "bf16"),
        ("dense", "none", "fp16"),
        ("dense", "none", "bf16"),
    }
    moe = cases(tier="cpu", filter="op=moe,codebook=mcg,m=9")[:3]
    pairs = cases(tier="cpu", filter="pair_kind=P24,op=dense,m=9")[:3]
    assert len(moe) == len(pairs) == 3  # a filter that selects nothing would shrink the test
    picked += moe + pairs
    for case in picked[::7] + picked[-6:]:
        layout = grid_case_layout(case)
        inputs = make_inputs(case)
        assert set(layout) == {*inputs, "y"}, case.case_id
        for name, tensor in inputs.items():
            shape, dtypes = layout[name]
            assert tuple(tensor.shape) == shape, (case.case_id, name)
            assert str(tensor.dtype).removeprefix("torch.") in dtypes, (case.case_id, name)


def test_check_grid_case_ties_the_file_to_its_id(tmp_path):
    from oracle.cases.grids import cases
    from oracle.report.results import CaseFileError
    from oracle.run.replay import check_grid_case

    case, path = _grid_case_files(tmp_path / "ok")
    assert check_grid_case(load_case(path)) == case
    decode, dpath = _grid_case_files(tmp_path / "dec", "decode", "codebook=mul1,bits=2,k=128")
    assert check_grid_case(load_case(dpath)) == decode

    def refused(path, needle):
        with pytest.raises(CaseFileError) as info:
            check_grid_case(load_case(path))
        assert needle in str(info.value) and "\n" not in str(info.value), str(info.value)

    other = next(
        c
        for c in cases(op="dense", tier="cpu", filter="codebook=mcg,bits=4,m=9,rotation=full")
        if (c.k, c.n) != (case.k, case.n)
    )
    _, p = _grid_case_files(tmp_path / "a")
    _edit_sidecar(
        p,
        case_id=other.case_id,
        case={
            **json.loads(p.read_text())["case"],
            **{"case_id": other.case_id, "k": other.k, "n": other.n, "seed": other.seed},
        },
    )
    refused(p, "needs float16[9, ")  # the id now names another shape than the tensors have
    _, p = _grid_case_files(tmp_path / "b")
    _edit_sidecar(p, case_id=other.case_id)
    refused(p, "disagrees with case.case_id")
    _, p = _grid_case_files(tmp_path / "c")
    _edit_sidecar(p, variant="dense/mcg/k5/fp16")
    refused(p, "variant 'dense/mcg/k5/fp16' disagrees")
    _, p = _grid_case_files(tmp_path / "d")
    _edit_sidecar(p, case_id=case.case_id.replace(f"_s{case.seed}", "_s1"), case=None)
    refused(p, "not the grid's seed")
    p = save_case({"case_id": "tests_x_py__test_y", "test": "tests/x.py::test_y"},
                  {"y": torch.zeros(2)}, tmp_path / "e")  # fmt: skip
    refused(p, "saved by test tests/x.py::test_y")
    _, p = _grid_case_files(tmp_path / "f")
    meta = json.loads(p.read_text())
    meta["tensors"]["x"]["dtype"] = "bfloat16"
    p.write_text(json.dumps(meta))
    with pytest.raises(CaseFileError, match="sidecar says torch.bfloat16"):
        load_case(p)
