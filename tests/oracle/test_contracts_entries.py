"""The entry-call metric of the contract checker: calls into marked entries, and how many bind.

A small synthetic package (written to ``tmp_path``, never imported) has one marked kernel entry
(``@abi_entry`` on a kernel class's ``__call__``), one shared body, a compile-cache lookup and
launch records that name their kernel with ``entry``. The expectations are counted by hand from
the source below: which calls are entry calls (direct, record, launch), which of them resolve,
which are violations. Then the command line: the ``entry calls`` line, ``--min-entry-calls`` and
the JSON field. Standard library only.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from oracle.contracts import check_b12x, check_package
from oracle.contracts.cli import SCHEMA, main
from oracle.contracts.entries import EntryCalls, format_percent

ABI = """
def abi_entry(f):
    return f


def shared_body(f):
    return f
"""

CACHE = """
def compiled_kernel(spec, arch):
    return object()
"""

KERNELS = """
from .abi import abi_entry, shared_body


class GemmKernel:
    @abi_entry
    def __call__(self, a, payload, out, lut_addr, stream):
        return None


class PlainKernel:
    def __call__(self, x, out, stream):
        return None


@shared_body
def body(*, a, out):
    return None
"""

LAUNCH = """
import dataclasses
from typing import ClassVar

from .kernels import GemmKernel


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmLaunch:
    entry: ClassVar[str] = "pkg.kernels.GemmKernel"
    a: object
    payload: object
    out: object
    lut_addr: int

    def args(self):
        return (self.a, self.payload, self.out, self.lut_addr)


class RuntimeLaunch:
    entry = GemmKernel  # a reference; fields made at run time (none written here)

    def args(self):
        return ()


class PlainLaunch:
    entry = "pkg.kernels.PlainKernel"

    def args(self):
        return ()
"""

# One resolved keyword call, one positional launch of a compiled fn of unknown kernel, one
# record launch bound by the convention: 2 of 3 entry calls resolve.
HOST = """
from . import cache
from .kernels import body
from .launch import GemmLaunch


def _kernel(spec):
    return cache.compiled_kernel(spec, "sm_90")


def keyword_call(a, out):
    body(a=a, out=out)


def positional_launch(a, payload, out):
    fn = _kernel("gemm")
    fn(a, payload, out, 0)


def record_launch(a, payload, out):
    fn = _kernel("gemm")
    fn(*GemmLaunch(a=a, payload=payload, out=out, lut_addr=0).args())
"""


def _package(tmp_path: Path, host: str = HOST, **modules: str) -> Path:
    root = tmp_path / "pkg"
    root.mkdir(parents=True, exist_ok=True)
    sources = {"__init__": "", "abi": ABI, "cache": CACHE, "kernels": KERNELS, "launch": LAUNCH}
    sources.update(modules, host=host)
    for name, source in sources.items():
        (root / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    return root


def _line(root: Path, module: str, text: str) -> int:
    lines = (root / f"{module}.py").read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _calls(report) -> dict[int, tuple[str, bool]]:
    return {c.line: (c.kind, c.resolved) for c in report.entry_calls.calls}


def test_metric_counts_direct_record_and_positional_launch(tmp_path):
    root = _package(tmp_path)
    report = check_package(root)
    assert report.ok, [v.format() for v in report.violations]
    entries = report.entry_calls
    assert (entries.resolved, entries.total) == (2, 3)
    assert _calls(report) == {
        _line(root, "host", "body(a=a"): ("direct", True),
        _line(root, "host", "fn(a, payload, out, 0)"): ("launch", False),
        _line(root, "host", "fn(*GemmLaunch("): ("record", True),
    }
    (launch,) = entries.unresolved
    assert launch.callee == "<compiled by pkg.host._kernel>"
    assert "which kernel is unknown" in launch.reason
    record = next(c for c in entries.calls if c.kind == "record")
    assert record.callee == "pkg.kernels.GemmKernel.__call__"
    assert report.counts["entry_calls"] == 3 and report.counts["resolved_entry_calls"] == 2


def test_record_with_a_wrong_field_is_a_violation_and_unresolved(tmp_path):
    host = HOST + (
        "\n\ndef wrong_field(a, payload, out):\n"
        "    fn = _kernel('gemm')\n"
        "    fn(*GemmLaunch(a=a, payload=payload, out=out, lut=0).args())\n"
    )
    root = _package(tmp_path, host)
    report = check_package(root)
    line = _line(root, "host", "lut=0")
    assert _calls(report)[line] == ("record", False)
    assert (report.entry_calls.resolved, report.entry_calls.total) == (2, 4)
    # The record's fields are written out: the ordinary rules report the construction against
    # its dataclass __init__ (fields == the entry's parameters), once, not again per entry.
    assert sorted((v.rule, v.line, v.parameter) for v in report.violations) == [
        ("arity", line, "lut_addr"),
        ("unknown-keyword", line, "lut"),
    ]
    (unresolved,) = [c for c in report.entry_calls.unresolved if c.line == line]
    assert "does not bind to pkg.kernels.GemmKernel.__call__" in unresolved.reason


def test_runtime_record_is_bound_to_the_entry_itself(tmp_path):
    host = HOST + (
        "\n\nfrom .launch import RuntimeLaunch\n\n\n"
        "def runtime_good(a, payload, out, fn):\n"
        "    rec = RuntimeLaunch(a=a, payload=payload, out=out, lut_addr=0)\n"
        "    fn(*rec.args())\n\n\n"
        "def runtime_bad(a, payload, out, fn):\n"
        "    fn(*RuntimeLaunch(a=a, payload=payload, output=out, lut_addr=0).args())\n"
    )
    root = _package(tmp_path, host)
    report = check_package(root)
    good = _line(root, "host", "fn(*rec.args())")
    bad = _line(root, "host", "output=out")
    calls = _calls(report)
    # `fn` is a parameter: only the record makes these entry calls.
    assert calls[good] == ("record", True) and calls[bad] == ("record", False)
    assert sorted((v.rule, v.callee, v.parameter) for v in report.violations) == [
        ("arity", "pkg.kernels.GemmKernel.__call__", "out"),
        ("unknown-keyword", "pkg.kernels.GemmKernel.__call__", "output"),
    ]  # `stream` is the environment's: never missing; the trivial __init__ is not checked


def test_record_local_from_two_branches_binds_both(tmp_path):
    host = HOST + (
        "\n\ndef branches(a, payload, out, split):\n"
        "    if split:\n"
        "        launch = GemmLaunch(a=a, payload=payload, out=out, lut_addr=1)\n"
        "    else:\n"
        "        launch = GemmLaunch(a=a, payload=payload, out=out, lut_addr=0)\n"
        "    _kernel('gemm')(*launch.args())\n\n\n"
        "def unknown_holder(fn, launch):\n"
        "    fn(*launch.args())\n"
    )
    root = _package(tmp_path, host)
    report = check_package(root)
    assert report.ok
    calls = _calls(report)
    assert calls[_line(root, "host", "_kernel('gemm')(*launch")] == ("record", True)
    # a parameter of unknown class whose args() reaches an unknown fn: not an entry call at all
    assert _line(root, "host", "    fn(*launch.args())") not in calls


def test_unmarked_or_missing_entry(tmp_path):
    launch = LAUNCH + '\n\nclass LostLaunch:\n    entry = "pkg.kernels.Gone"\n'
    host = HOST + (
        "\n\nfrom .launch import PlainLaunch\n\n\n"
        "def plain(x, out, fn):\n"
        "    fn(*PlainLaunch(x=x, out=out).args())\n"
    )
    root = _package(tmp_path, host, launch=launch)
    report = check_package(root)
    line = _line(root, "host", "PlainLaunch(x=x")
    assert _calls(report)[line] == ("record", False)
    (plain,) = [c for c in report.entry_calls.unresolved if c.line == line]
    assert "not marked @abi_entry" in plain.reason
    ((rule, callee),) = [(v.rule, v.callee) for v in report.violations]
    assert (rule, callee) == ("launch-record", "pkg.launch.LostLaunch")


def test_record_fields_must_match_the_entry(tmp_path):
    kernels = KERNELS.replace("lut_addr, stream", "lut_addr, tier, stream")
    root = _package(tmp_path, kernels=kernels)
    report = check_package(root)
    ((rule, callee, message),) = [(v.rule, v.callee, v.message) for v in report.violations]
    assert (rule, callee) == ("launch-record", "pkg.launch.GemmLaunch")
    assert "entry parameters without a field: tier" in message
    assert _calls(report)[_line(root, "host", "fn(*GemmLaunch(")] == ("record", False)


def test_every_way_to_get_a_compiled_kernel_is_a_launch(tmp_path):
    host = HOST + (
        "\n\nimport cutlass.cute as cute\n\n\n"
        "def inline(x):\n"
        "    _kernel('reduce')(x, x)\n\n\n"
        "def seed_itself(x):\n"
        "    fn = cache.compiled_kernel('decode', 'sm_90')\n"
        "    fn(x)\n\n\n"
        "def dsl_compile(kernel, x):\n"
        "    fn = cute.compile(kernel, x)\n"
        "    fn(x)\n\n\n"
        "def warm_up_only(x):\n"
        "    _kernel('decode')\n"
    )
    root = _package(tmp_path, host)
    calls = _calls(check_package(root))
    lines = (root / "host.py").read_text(encoding="utf-8").splitlines()
    launches = [
        i for i, line in enumerate(lines, 1) if line.strip() in ("fn(x)", "_kernel('reduce')(x, x)")
    ]
    assert len(launches) == 3
    assert all(calls[line] == ("launch", False) for line in launches)
    assert _line(root, "host", "    _kernel('decode')") not in calls  # a lookup, not a launch


def test_cli_reports_and_gates_on_entry_calls(tmp_path, capsys):
    root = _package(tmp_path)
    out = tmp_path / "report.json"
    assert main(["--root", str(root), "--json", str(out)]) == 1  # the default gate is 100 %
    assert "entry calls: 2/3 resolved (66.7%)" in capsys.readouterr().out.splitlines()
    assert main(["--root", str(root), "--min-entry-calls", "0"]) == 0  # report only
    capsys.readouterr()
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["schema"] == SCHEMA == "oracle.contracts/1"
    assert (data["entry_calls"]["resolved"], data["entry_calls"]["total"]) == (2, 3)
    (row,) = data["entry_calls"]["unresolved"]
    assert row["line"] == _line(root, "host", "fn(a, payload, out, 0)")
    assert row["kind"] == "launch" and row["resolved"] is False and row["reason"]

    assert main(["--root", str(root), "--min-entry-calls", "66.6"]) == 0
    capsys.readouterr()
    assert main(["--root", str(root), "--min-entry-calls", "66.7"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("contracts: entry calls 2/3 resolved (66.7%) is below")
    assert main(["--root", str(root), "--min-entry-calls", "100", "-v"]) == 1
    assert any("[entry-call]" in line for line in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize("bad", ["101", "-1", "half"])
def test_cli_refuses_a_bad_percentage(tmp_path, capsys, bad):
    assert main(["--root", str(_package(tmp_path)), f"--min-entry-calls={bad}"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--min-entry-calls" in line


def test_no_entry_calls_reads_as_complete(tmp_path, capsys):
    """0/0 entry calls is 100 %: a package whose calls bind passes without marked entries."""
    root = tmp_path / "plain"
    root.mkdir()
    (root / "__init__.py").write_text("def f(x):\n    return x\n\nf(1)\n", encoding="utf-8")
    assert main(["--root", str(root), "--min-entry-calls", "100"]) == 0
    assert "entry calls: 0/0 resolved (100%)" in capsys.readouterr().out


def test_a_root_with_no_call_to_bind_judged_nothing(tmp_path, capsys):
    """A root with no call at all (an empty directory, or functions never called) is a gate that
    judged nothing: exit 1 with a line saying so, never "0/0 resolved (100%)" and exit 0."""
    empty = tmp_path / "empty"
    empty.mkdir()
    uncalled = tmp_path / "uncalled"
    uncalled.mkdir()
    (uncalled / "__init__.py").write_text("def f(x):\n    return x\n", encoding="utf-8")
    for root in (empty, uncalled):
        assert main(["--root", str(root)]) == 1
        assert "FAIL: contracts judged nothing" in capsys.readouterr().out


def test_b12x_entry_calls_are_counted():
    report = check_b12x()
    entries = report.entry_calls
    assert entries.total > 0 and 0 <= entries.resolved <= entries.total
    assert report.counts["entry_calls"] == entries.total
    assert {c.kind for c in entries.calls} <= {"direct", "record", "launch"}


def test_percent_and_threshold_arithmetic():
    assert [format_percent(v) for v in (0.0, 100 * 2 / 3, 54.5454, 100.0)] == [
        "0",
        "66.7",
        "54.5",
        "100",
    ]
    assert format_percent(100 * 1999 / 2000) == "99.9"  # short of complete never reads 100
    calls = EntryCalls()
    assert calls.percent == 100.0 and not calls.below(100)
