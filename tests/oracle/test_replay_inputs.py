"""Replay refuses a saved case whose inputs are not the ones its case id generates.

Every saved input of a dense and a MoE grid case is edited in turn (one element's bits flipped,
shape and dtype kept, so only a value comparison can see it) and replay must refuse the file
(exit 2, "does not belong to its case id"), as it must when an input is missing. The unedited
file replays (exit 0 or 1: a verdict, not a refusal).
"""

from __future__ import annotations

import functools

import pytest
import torch
from safetensors.torch import load_file, save_file

import oracle.checks
from oracle.cases.grids import cases
from oracle.cli import main
from oracle.report.results import save_case

FILTERS = {
    "dense": ("dense", "codebook=mcg,bits=4,m=1,k=128,n=128,rotation=full,dtype=fp16"),
    "moe": ("moe", "codebook=mcg,bits=4,m=1,rotation=full,dtype=fp16,tier_layout=none"),
}


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    monkeypatch.setattr(oracle.checks, "cuda_available", lambda: False)


@functools.cache
def _case(op: str):
    kind, flt = FILTERS[op]
    return cases(op=kind, filter=flt + ",pair_kind=none", tier="cpu")[0]


def _saved(op: str, tmp_path):
    from oracle.run.runners import saved_inputs

    case = _case(op)
    inputs = saved_inputs(case)
    y = torch.zeros(case.m, case.n if op == "dense" else case.k, dtype=torch.float16)
    path = save_case({"case_id": case.case_id, "case": case}, {**inputs, "y": y}, tmp_path)
    return path, sorted(inputs)


def _replay(path, capsys) -> tuple[int, str]:
    try:
        code = main(["replay", str(path), "-q", "--tier", "cpu"])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def _names(op: str) -> list[str]:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        return _saved(op, Path(tmp))[1]


@pytest.mark.parametrize(
    "op, name", [(op, name) for op in FILTERS for name in _names(op)], ids=lambda v: str(v)
)
def test_every_saved_input_is_compared_with_the_regenerated_one(op, name, tmp_path, capsys):
    path, _ = _saved(op, tmp_path)
    blob = path.with_suffix(".safetensors")
    tensors = load_file(blob)
    flat = tensors[name].contiguous().view(torch.uint8).reshape(-1).clone()
    flat[len(flat) // 2] ^= 0x01  # one bit of one element; shape and dtype unchanged
    tensors[name] = flat.view(tensors[name].dtype).reshape(tensors[name].shape)
    save_file(tensors, blob)
    code, err = _replay(path, capsys)
    assert code == 2 and "does not belong to its case id" in err and f"`{name}`" in err, err


@pytest.mark.parametrize("op", list(FILTERS))
def test_the_unedited_case_replays_and_a_missing_input_is_refused(op, tmp_path, capsys):
    path, names = _saved(op, tmp_path)
    code, err = _replay(path, capsys)
    assert code in (0, 1), err
    blob = path.with_suffix(".safetensors")
    tensors = load_file(blob)
    del tensors[names[0]]
    save_file(tensors, blob)
    code, err = _replay(path, capsys)
    assert code == 2 and names[0] in err, err
