"""Every refusal of ``python -m oracle``: exit 2, ONE line on stderr, no stdout, no traceback.

Each row runs ``oracle.cli.main([...])`` in-process. A refusal happens before anything runs, so
stdout stays empty; the one stderr line is ``python -m oracle[ <command>]: error: <why>`` and must
contain the row's needle (the offending input, or the list of what is known). CUDA is hidden
(``oracle.checks.cuda_available`` returns False) so the device refusals hold on any machine.
Files for ``report``/``replay`` are built per row under ``tmp_path`` by :func:`make_file`.
"""

from __future__ import annotations

import functools
import json
import sys

import pytest
import torch

import oracle.checks
from oracle.cases.grids import cases
from oracle.cli import Refused, main
from oracle.report.report import CheckResult, Report
from oracle.report.results import save_case


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    monkeypatch.setattr(oracle.checks, "cuda_available", lambda: False)
    import oracle.mutate.cli as mutate_cli

    monkeypatch.setattr(mutate_cli, "_cuda", lambda: False)


@functools.cache  # a frozen Case: one grid walk per filter, not one per refusal
def _grid_case(flt: str, op: str = "dense"):
    return cases(op=op, filter=flt, tier="cpu")[0]


DENSE = "codebook=mcg,bits=4,m=1,k=128,n=128,rotation=full,dtype=fp16"
PAIR = "pair_kind=P22,rate_axis=k,codebook=mcg,dtype=fp16,m=1,rotation=full"


def _saved_grid_case(tmp_path, flt=DENSE, op="dense", y_shape=None):
    from oracle.run.runners import saved_inputs as make_inputs

    case = _grid_case(flt, op)
    inputs = make_inputs(case)
    y = torch.zeros(y_shape or (case.m, case.n), dtype=torch.float16)
    return case, save_case({"case_id": case.case_id, "case": case}, {**inputs, "y": y}, tmp_path)


def _edit(path, **changes):
    meta = json.loads(path.read_text())
    meta.update(changes)
    path.write_text(json.dumps(meta))
    return path


def _report(tmp_path, plottable=True, **changes):
    metrics = {"rel_l2": 1e-3, "variant": "dense/mcg/k6/fp16", "m": 1, "k": 128, "n": 128}
    checks = [CheckResult("a", "gpu", "pass", "", metrics if plottable else {})]
    data = Report(checks).to_dict()
    data.update(changes)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    return path


def make_file(kind: str, tmp_path):
    """The file a row needs (its path as a string)."""
    if kind == "not_json":
        path = tmp_path / "bad.json"
        path.write_text("{ not json")
    elif kind == "missing":
        path = tmp_path / "absent.json"
    elif kind == "deep":  # past the JSON decoder's recursion limit
        path = tmp_path / "deep.json"
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "regular":
        path = tmp_path / "regular.txt"
        path.write_text("a regular file")
    elif kind == "under_regular":
        (tmp_path / "regular.txt").write_text("a regular file")
        path = tmp_path / "regular.txt" / "out.json"
    elif kind == "mutate_bad_summary":
        row = {"id": "a", "class": "R1", "tier": "cpu", "status": "killed", "seconds": 1.0}
        row |= {"killer": "t", "reason": "", "kill": "t"}
        path = tmp_path / "mutate.json"
        path.write_text(json.dumps({"schema": "oracle.mutate/1", "summary": {"cpu": [1]},
                                    "results": [row]}))  # fmt: skip
    elif kind == "directory":
        path = tmp_path
    elif kind == "report":
        path = _report(tmp_path)
    elif kind == "report_unplottable":
        path = _report(tmp_path, plottable=False)
    elif kind == "report_schema":
        path = _report(tmp_path, schema="oracle.report/3")
    elif kind == "report_mutate":
        path = tmp_path / "mutate.json"
        path.write_text(json.dumps({"schema": "oracle.mutate/1", "results": []}))
    elif kind == "report_coverage":
        path = _report(tmp_path, schema="oracle.coverage/1")
    elif kind == "report_lacks":
        path = _report(tmp_path, checks=[{"name": "a", "tier": "cpu"}])
    elif kind == "report_types":
        path = _report(tmp_path, checks=[{"name": "a", "tier": "cpu", "status": 1}])
    elif kind == "report_summary":
        path = _report(tmp_path, summary={"fail": 0, "ok": True, "pass": 7})
    elif kind == "case":
        path = _saved_grid_case(tmp_path)[1]
    elif kind == "case_no_tensors":
        path = _saved_grid_case(tmp_path)[1]
        path.with_suffix(".safetensors").unlink()
    elif kind == "case_corrupt_tensors":
        path = _saved_grid_case(tmp_path)[1]
        blob = path.with_suffix(".safetensors")
        blob.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage" + blob.read_bytes()[40:])
    elif kind == "case_no_id":
        path = _edit(_saved_grid_case(tmp_path)[1], case_id=7)
    elif kind == "case_bad_layout":
        path = _saved_grid_case(tmp_path)[1]
        meta = json.loads(path.read_text())
        meta["tensors"]["x"]["shape"] = "9x128"
        path.write_text(json.dumps(meta))
    elif kind == "case_other_shape":  # the id edited to a grid point of another shape
        case, path = _saved_grid_case(tmp_path)
        other = _grid_case(DENSE.replace("k=128,n=128", "k=384,n=128"))
        path = _edit(path, case_id=other.case_id, case=None)
    elif kind == "case_other_variant":
        case, path = _saved_grid_case(tmp_path)
        other = _grid_case(DENSE.replace("bits=4", "bits=5"))
        path = _edit(path, case_id=other.case_id, case=None)
    elif kind == "case_not_grid":
        path = save_case({"case_id": "made_up", "test": "t.py::x"}, {"y": torch.ones(2)}, tmp_path)
    elif kind == "case_pair":  # a grid case the oracle has no runner for
        path = _saved_grid_case(tmp_path, PAIR)[1]
    else:
        raise AssertionError(kind)
    return str(path)


def _case_id(kind: str) -> str:
    case = _grid_case("codebook=mcg,bits=6,m=17,k=128,n=384,rotation=full,dtype=fp16")
    stem = case.case_id.rsplit("_s", 1)[0]
    return {
        "off_grid_m": case.case_id.replace("_m17_", "_m3_"),
        "off_grid_seed": f"{stem}_s{case.seed + 1}",
        "unregistered": "dense-sqg_e4m3-k6-fp16_m1_k128_n128_s1",
        "valid": case.case_id,
    }[kind]


# (argv with {file:KIND} / {case:KIND} placeholders, needle in the one stderr line)
REFUSALS = [
    # selections: unknown keys, vocabulary, numbers, contradictions, nothing matched
    (["run", "--filter", "nosuchkey=1"], "unknown field (key) 'nosuchkey'"),
    (["run", "--filter", "nosuchkey=1"], "known keys: op, codebook, bits"),
    (["run", "--filter", "m<=abc"], "m needs an integer, got 'abc'"),
    (["run", "--filter", "bits=4.0"], "bits needs an integer"),
    (["run", "--filter", "codebook=MCG"], "unknown codebook 'MCG' (did you mean 'mcg'?"),
    (["run", "--filter", "op=gemm"], "unknown op 'gemm'; known values: decode, dense, moe"),
    (["run", "--filter", "pair_kind=p33"], "known values: none, P22, P33, P24, P43, P44"),
    (["run", "--filter", "rate_axis=K"], "unknown rate_axis 'K'"),
    (["run", "--filter", "tier_layout=k4"], "unknown tier_layout 'k4'; known values: none, k3k4"),
    (["run", "--filter", "rotation=coupled2"], "known values: none, full, coupled"),
    (["run", "--filter", "compute_dtype=FP16"], "unknown compute_dtype 'FP16'"),
    (["run", "--filter", "dtype=fp32"], "known values: fp16, bf16"),
    (["grid", "--filter", "codebook=mcg,bits=9"], "no registered variant has bits=9"),
    (["grid", "--filter", "codebook=sqg_e4m3,bits=6"], "bits takes 2, 3, 4"),
    (["grid", "--filter", "m=3"], "no grid case has m=3; known values: 1, 2, 8"),
    (["grid", "--filter", "name=dense/mcg/k9/fp16"], "no registered variant is named"),
    (["grid", "--filter", "m"], "malformed clause 'm'"),
    # values of the operators other than '=' are validated too
    (["grid", "--filter", "codebook!=MCG"], "unknown codebook 'MCG' (did you mean 'mcg'?"),
    (["grid", "--filter", "m!=3"], "no grid case has m=3"),
    (["grid", "--filter", "name!=dense/mcg/k9/fp16"], "no registered variant is named"),
    (["grid", "--filter", "codebook~xyz"], "no codebook contains 'xyz'"),
    (["grid", "--filter", "bits>=nine"], "bits needs an integer, got 'nine'"),
    (["grid", "--filter", "m>3.5"], "m needs an integer, got '3.5'"),
    (["grid", "--filter", "k<abc"], "k needs an integer, got 'abc'"),
    (["grid", "--filter", "m>="], "has no value"),
    (["grid", "--filter", "codebook<mcg"], "needs a numeric field"),
    (["grid", "--tier", "cpu", "--filter", "heavy=true"], "matches nothing"),
    (["grid", "--op", "dense", "--filter", "op=moe"], "matches nothing"),
    (
        ["grid", "--filter", "op=dense,k=768,n=640,m=17|64"],
        "alternative m=64 of m=17|64 matches nothing: no gpu-tier grid case has m=64",
    ),
    (["run", "--filter", "op=dense,k=768,n=640,m=17|64"], "there m takes 1, 17, 129"),
    (["grid", "--op", "gemm"], "invalid choice: 'gemm'"),
    (["run", "--filter", "rotation=coupled"], "none of which the oracle can run on a GPU"),
    # case ids
    (["run", "--case", "no-such-case"], "cannot parse case_id 'no-such-case'"),
    (["run", "--case", "{case:off_grid_m}"], "is not a grid point of dense/mcg/k6/fp16: M takes"),
    (["run", "--case", "{case:off_grid_seed}"], "is not the grid's seed"),
    (["run", "--case", "{case:unregistered}"], "is not registered"),
    (["run", "--case", "{case:valid}", "--filter", "m=1"], "use --case or --filter, not both"),
    (["grid", "--filter", "id=no-such-case"], "cannot parse case_id"),
    # numbers and other options
    (["run", "--max-cases", "0"], "argument --max-cases: expected a positive integer"),
    (["run", "--max-cases", "ten"], "expected a positive integer, got 'ten'"),
    (["run", "--compile-budget", "-1"], "expected finite seconds >= 0"),
    (["run", "--compile-budget", "nan"], "expected finite seconds >= 0"),
    (["run", "--codebook", "mcg"], "--codebook and --bits narrow a --tile run"),
    (["run", "--tier", "tpu"], "invalid choice: 'tpu'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--only", "layout,nonsense"], "--only: unknown families ['nonsense']"),
    (["--only", ","], "--only: unknown families"),
    (["--only", "layout", "grid"], "--only selects families of the default job"),
    # tiles
    (["run", "--tile", "foo"], "--tile: unknown tile 'foo'; known: square, narrow, deep, wide"),
    (["run", "--tile", "32x-1"], "--tile: expected a tile name or integers joined by 'x'"),
    (["run", "--tile", "32x512"], "expected three positive integers"),
    (["run", "--tile", "0x512x256"], "expected three positive integers"),
    (["run", "--tile", "32x512x256", "--codebook", "MCG"], "--codebook: unknown codebook 'MCG'"),
    (["run", "--tile", "32x512x256", "--codebook", "sqg_e4m3", "--bits", "6"], "legal: 2, 3, 4"),
    (["run", "--tile", "32x512x256", "--bits", "9"], "--bits: 9 is not legal"),
    (["run", "--tile", "32x512x256", "--gpus", "2"], "exclude each other"),
    # the device
    (["--tier", "gpu", "--only", "layout"], "--tier gpu: no CUDA device is visible"),
    (["run", "--require-gpu"], "--require-gpu: no CUDA device is visible"),
    (["run", "--tier", "gpu", "--filter", "m=1"], "--tier gpu: no CUDA device"),
    (["run", "--tile", "32x512x256", "--require-gpu"], "--require-gpu: no CUDA device"),
    (["--require-gpu", "--tier", "cpu"], "--require-gpu contradicts --tier cpu"),
    (["grid", "--require-gpu"], "--require-gpu does not apply to `grid`"),
    (["replay", "{file:case}", "--tier", "gpu"], "--tier gpu: no CUDA device"),
    # report files
    (["report", "{file:not_json}"], "is not JSON"),
    (["report", "{file:missing}"], "cannot read"),
    (["report", "{file:directory}"], "cannot read"),
    (["report", "{file:report_schema}"], "unknown report schema 'oracle.report/3'"),
    (["report", "{file:report_mutate}"], "python -m oracle mutate --from-json"),
    (["report", "{file:report_coverage}"], "the coverage job"),
    (["report", "{file:report_lacks}"], "lacks ['status']"),
    (["report", "{file:report_types}"], "status must be one of"),
    (["report", "{file:report_summary}"], "disagrees with the checks"),
    (["report", "{file:report_unplottable}", "--png", "{file:directory}"], "nothing plottable"),
    (["report", "{file:report}", "--tile-map", "{file:not_json}"], "is not JSON"),
    (["report", "{file:report}", "--tile-map", "{file:case_not_grid}"], "not a replayable"),
    (["report", "{file:report}", "--require-gpu"], "does not apply to `report`"),
    # saved cases
    (["replay", "{file:not_json}"], "is not JSON"),
    (["replay", "{file:missing}"], "no sidecar"),
    (["replay", "{file:report}"], "render it with `python -m oracle report`"),
    (["replay", "{file:case_no_tensors}"], "is missing"),
    (["replay", "{file:case_corrupt_tensors}"], "corrupt tensor file"),
    (["replay", "{file:case_no_id}"], "'case_id' must be a filename-safe string"),
    (["replay", "{file:case_bad_layout}"], "shape must be a list of non-negative ints"),
    (["replay", "{file:case_other_shape}"], "needs float16[1, 384]"),
    (["replay", "{file:case_other_variant}"], "needs int16[8, 8, 80]"),
    (["replay", "{file:case_not_grid}"], "saved by test t.py::x"),
    (["replay", "{file:case_pair}"], "cannot re-judge"),
    # the delegates
    (["mutate", "--only", "no-such-mutant"], "unknown mutant id(s) ['no-such-mutant']"),
    (["mutate", "--jobs", "0"], "--jobs: expected a positive int"),
    (["mutate", "--tier", "gpu"], "--tier gpu: no CUDA device is visible"),
    (["mutate", "--from-json", "{file:not_json}"], "is not JSON"),
    (["mutate", "--from-json", "{file:report}"], "is not 'oracle.mutate/1'"),
    (["contracts", "--bogus"], "unrecognized arguments: --bogus"),
    (["contracts", "--root", "{file:missing}"], "is not a directory"),
    (["contracts", "--slots", "{file:not_json}"], "is not valid JSON"),
    # empty values (an unset shell variable), outputs checked before any work, hostile files
    (["run", "--case", ""], "argument --case: empty value"),
    (["run", "--tile", ""], "argument --tile: empty value"),
    (["run", "--filter", " "], "argument --filter: empty value"),
    (["--json", ""], "argument --json: empty value"),
    (["--only", ""], "argument --only: empty value"),
    (["report", ""], "empty value"),
    (["--json", "{file:directory}", "--only", "layout"], "is a directory"),
    (["--json", "{file:under_regular}", "--only", "layout"], "which is not a directory"),
    (["run", "--results", "{file:regular}", "--filter", "m=1"], "is not a directory"),
    (["coverage", "--json", "{file:directory}"], "--json: "),
    (["coverage", "--json", "{file:under_regular}"], "which is not a directory"),
    (["report", "{file:report}", "--png", "{file:regular}"], "--png: "),
    (["report", "{file:report}", "--png", "{file:under_regular}"], "--png: "),
    (["report", "{file:deep}"], "nested too deeply"),
    (["replay", "{file:deep}"], "nested too deeply"),
    (["mutate", "--only", ","], "names no mutant id"),
    (["mutate", "--json", "{file:directory}"], "--json: "),
    (["mutate", "--json", "{file:under_regular}"], "which is not a directory"),
    (["mutate", "--catalogue", "{file:missing}"], "--catalogue: "),
    (["mutate", "--timeout", "nan"], "expected positive finite seconds"),
    (["mutate", "--from-json", "{file:deep}"], "nested too deeply"),
    (["mutate", "--from-json", "{file:mutate_bad_summary}"], "lacks its counts"),
    (["contracts", "--json", "{file:directory}"], "--json: "),
    (["explain", "--m", "4", "--k", "256", "--n", str(2**62), "--codebook", "mcg", "--bits", "4"],
     "exceeds the kernels' index range"),
    (["explain", "--op", "moe", "--m", "4", "--hidden", str(2**40), "--intermediate", "256",
      "--experts", "8", "--top-k", "2", "--codebook", "mcg", "--bits", "4"], "index range"),
]  # fmt: skip


def run_cli(argv) -> int:
    """``main(argv)``'s exit code, whether returned or raised (a refusal raises SystemExit(2))."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def _expand(argv, tmp_path):
    out = []
    for word in argv:
        if word.startswith("{file:"):
            word = make_file(word[6:-1], tmp_path)
        elif word.startswith("{case:"):
            word = _case_id(word[6:-1])
        out.append(word)
    return out


@pytest.mark.parametrize(("argv", "needle"), REFUSALS, ids=[" ".join(a) for a, _ in REFUSALS])
def test_refusal_is_exit_2_with_one_line(argv, needle, tmp_path, capsys):
    code = run_cli(_expand(argv, tmp_path))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == "", out
    assert err.count("\n") == 1 and err.startswith("python -m oracle"), err
    assert ": error: " in err and "Traceback" not in err, err
    assert needle in err, err


def test_refused_png_when_matplotlib_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    code = run_cli(["report", make_file("report", tmp_path), "--png", str(tmp_path / "png")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "matplotlib is not installed" in err
    assert not (tmp_path / "png").exists()


def test_a_refusal_is_a_system_exit_2_carrying_the_message(capsys):
    with pytest.raises(Refused) as info:
        main(["grid", "--filter", "codebook=MCG"])
    assert isinstance(info.value, SystemExit) and info.value.code == 2
    assert "unknown codebook 'MCG'" in str(info.value)
    assert capsys.readouterr().err.strip().endswith(str(info.value))


def test_gpus_without_devices_is_a_one_line_refusal(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert run_cli(["run", "--gpus", "all"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err, err


@pytest.mark.parametrize(
    "argv, line",
    [
        (["mutate", "--from-json", "{file:report_mutate_empty}"], "judged no mutant"),
        (["report", "{file:report_empty}"], "holds no check"),
        (["contracts", "--root", "{file:directory}"], "contracts judged nothing"),
    ],
)
def test_a_gate_that_judged_nothing_fails_saying_so(argv, line, tmp_path, capsys):
    """Zero items judged is a failure (exit 1) with a line naming it, never a pass."""
    (tmp_path / "e").mkdir()
    files = {
        "report_mutate_empty": json.dumps(
            {"schema": "oracle.mutate/1", "summary": {}, "results": []}
        ),  # fmt: skip
        "report_empty": json.dumps(Report([]).to_dict()),
    }
    for name, text in files.items():
        (tmp_path / f"{name}.json").write_text(text)
    argv = [
        str(tmp_path / f"{w[6:-1]}.json") if w[6:-1] in files else
        str(tmp_path / "e") if w == "{file:directory}" else w
        for w in argv
    ]  # fmt: skip
    assert run_cli(argv) == 1
    assert line in capsys.readouterr().out


def test_valid_counterparts_are_not_refused(tmp_path, capsys):
    """The refusals are not blanket: the same commands with valid input run."""
    assert main(["grid", "--tier", "cpu", "--op", "dense", "--filter", "codebook=mcg,m=1"]) == 0
    assert main(["report", make_file("report", tmp_path), "-q"]) == 0
    assert main(["replay", make_file("case", tmp_path / "c"), "-q", "--tier", "cpu"]) == 1
    capsys.readouterr()
