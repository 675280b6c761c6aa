"""The ABI signature lock: a changed signature fails until the lock is regenerated on purpose.

Expectations are written by hand: which functions are locked (decorator names), the version
sequence 1 → 2 → 2 across update/update-unchanged, and the exact lock document for a small
package. ``b12x/abi.py`` is loaded from its file alone (no package import) to check that its
``abi_version`` reads the same lock the checker writes. Standard library only.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

from oracle.contracts import DEFAULT_LOCK_PATH, build_index, check_lock, check_package, update_lock
from oracle.contracts.cli import main

REPO = Path(__file__).resolve().parents[2]

KERNEL_V1 = """
    import cutlass.cute as cute
    from .abi import abi_entry, shared_body


    class Kernel:
        @cute.jit
        def __call__(self, a: cute.Tensor, b, stream=None):
            return self.kernel(a, b)

        @cute.kernel
        def kernel(self, a, b):
            return None

        @shared_body
        def _body(self, *, a, lut_addr: int, emit=None):
            return None

        def helper(self, x):
            return x


    @abi_entry
    def launch(kernel, a, b, /, *, stream):
        return kernel(a, b, stream=stream)
    """


def _package(tmp_path: Path, source: str = KERNEL_V1) -> Path:
    root = tmp_path / "lockpkg"
    root.mkdir(exist_ok=True)
    (root / "__init__.py").write_text("", encoding="utf-8")
    (root / "abi.py").write_text(
        "def shared_body(f):\n    return f\n\n\ndef abi_entry(f):\n    return f\n", encoding="utf-8"
    )
    (root / "kernel.py").write_text(textwrap.dedent(source), encoding="utf-8")
    return root


def _load_abi_module():
    spec = importlib.util.spec_from_file_location("_b12x_abi_alone", REPO / "b12x" / "abi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lock_document_for_a_small_package(tmp_path):
    lock = tmp_path / "abi_lock.json"
    assert update_lock(build_index(_package(tmp_path)), lock) == (1, True)
    data = json.loads(lock.read_text(encoding="utf-8"))
    assert data["abi_version"] == 1
    assert sorted(data["signatures"]) == [
        "lockpkg.kernel.Kernel.__call__",
        "lockpkg.kernel.Kernel._body",
        "lockpkg.kernel.Kernel.kernel",
        "lockpkg.kernel.launch",
    ]
    assert data["signatures"]["lockpkg.kernel.Kernel.__call__"] == [
        {"name": "self", "kind": "positional_or_keyword", "default": None, "annotation": None},
        {
            "name": "a",
            "kind": "positional_or_keyword",
            "default": None,
            "annotation": "cute.Tensor",
        },
        {"name": "b", "kind": "positional_or_keyword", "default": None, "annotation": None},
        {"name": "stream", "kind": "positional_or_keyword", "default": "None", "annotation": None},
    ]
    kinds = [p["kind"] for p in data["signatures"]["lockpkg.kernel.launch"]]
    assert kinds == ["positional_only"] * 3 + ["keyword_only"]
    body = data["signatures"]["lockpkg.kernel.Kernel._body"]
    assert [(p["name"], p["annotation"]) for p in body] == [
        ("self", None),
        ("a", None),
        ("lut_addr", "int"),
        ("emit", None),
    ]
    text = lock.read_text(encoding="utf-8")
    assert text.endswith("\n") and json.dumps(data, indent=2, sort_keys=True) + "\n" == text


def test_changed_signature_fails_until_update(tmp_path):
    lock = tmp_path / "abi_lock.json"
    root = _package(tmp_path)
    update_lock(build_index(root), lock)
    assert check_package(root, lock_path=lock).violations == []

    _package(tmp_path, KERNEL_V1.replace("*, a, lut_addr: int,", "*, a, fc1_lut, lut_addr: int,"))
    report = check_package(root, lock_path=lock)
    assert [(v.rule, v.callee, v.parameter) for v in report.violations] == [
        ("lock-changed", "lockpkg.kernel.Kernel._body", "fc1_lut")
    ]
    message = report.violations[0].message
    assert "was (self, *, a, lut_addr: int, emit=None)" in message
    assert "now (self, *, a, fc1_lut, lut_addr: int, emit=None)" in message
    assert "--update-lock" in message and report.violations[0].path.endswith("kernel.py")

    before = lock.read_text(encoding="utf-8")
    check_package(root, lock_path=lock)
    assert lock.read_text(encoding="utf-8") == before, "a check must never write the lock"

    assert update_lock(build_index(root), lock) == (2, True)
    assert check_package(root, lock_path=lock).violations == []
    text = lock.read_text(encoding="utf-8")
    assert update_lock(build_index(root), lock) == (2, False)
    assert lock.read_text(encoding="utf-8") == text


def test_reordered_default_and_annotation_changes_fail(tmp_path):
    lock = tmp_path / "abi_lock.json"
    root = _package(tmp_path)
    update_lock(build_index(root), lock)
    variants = {
        # the reorder also shifts `self.kernel(a, b)` in __call__: both rules fire
        "kernel(self, a, b)": ["lock-changed", "shifted-argument", "shifted-argument"],
        "stream=None)": ["lock-changed"],
        "a: cute.Tensor, b,": ["lock-changed"],
    }
    replacements = ["kernel(self, b, a)", "stream=0)", "a, b,"]
    for (old, rules), new in zip(variants.items(), replacements, strict=True):
        _package(tmp_path, KERNEL_V1.replace(old, new))
        report = check_package(root, lock_path=lock)
        assert sorted(v.rule for v in report.violations) == rules, (old, new)
    _package(tmp_path)
    assert check_package(root, lock_path=lock).violations == []


def test_added_removed_and_missing_lock(tmp_path):
    lock = tmp_path / "abi_lock.json"
    root = _package(tmp_path)
    report = check_package(root, lock_path=lock)
    assert [v.rule for v in report.violations] == ["lock-missing"]
    update_lock(build_index(root), lock)

    _package(tmp_path, KERNEL_V1.replace("    @abi_entry\n", ""))
    report = check_package(root, lock_path=lock)
    assert [(v.rule, v.callee) for v in report.violations] == [
        ("lock-changed", "lockpkg.kernel.launch")
    ]
    assert "removed" in report.violations[0].message

    _package(
        tmp_path, KERNEL_V1.replace("        def helper", "        @cute.jit\n        def helper")
    )
    report = check_package(root, lock_path=lock)
    assert [(v.rule, v.callee) for v in report.violations] == [
        ("lock-changed", "lockpkg.kernel.Kernel.helper")
    ]
    assert "not in the lock" in report.violations[0].message


def test_cli_update_lock_bumps_once(tmp_path, capsys):
    lock = tmp_path / "fixtures" / "abi_lock.json"
    root = _package(tmp_path)
    assert main(["--root", str(root), "--lock", str(lock)]) == 1
    assert "[lock-missing]" in capsys.readouterr().out
    assert main(["--root", str(root), "--lock", str(lock), "--update-lock"]) == 0
    assert "abi_version 1" in capsys.readouterr().out
    _package(tmp_path, KERNEL_V1.replace("b, stream=None", "b, c, stream=None"))
    assert main(["--root", str(root), "--lock", str(lock)]) == 1
    out = capsys.readouterr().out
    assert "[lock-changed] <abi-lock> -> lockpkg.kernel.Kernel.__call__: c <- " in out
    assert main(["--root", str(root), "--lock", str(lock), "--update-lock"]) == 0
    assert main(["--root", str(root), "--lock", str(lock), "--update-lock"]) == 0
    assert json.loads(lock.read_text(encoding="utf-8"))["abi_version"] == 2
    assert main(["--root", str(root), "--lock", str(lock), "--no-lock", "--update-lock"]) == 2


def test_b12x_abi_reads_the_lock(tmp_path):
    abi = _load_abi_module()
    assert abi.ABI_LOCK_PATH == DEFAULT_LOCK_PATH
    lock = tmp_path / "abi_lock.json"
    update_lock(build_index(_package(tmp_path)), lock)
    assert abi.abi_version(lock) == 1
    with pytest.raises(FileNotFoundError, match="lock_path"):
        abi.abi_version(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"abi_version": "3"}', encoding="utf-8")
    with pytest.raises(ValueError, match="abi_version"):
        abi.abi_version(bad)
    with pytest.raises(TypeError, match="lock_path"):
        abi.abi_version(3)


def test_b12x_markers_are_runtime_trivial():
    abi = _load_abi_module()

    def body(*, a, b):
        return a + b

    assert abi.shared_body(body) is body and body(a=1, b=2) == 3
    assert abi.abi_entry(body) is body
    assert body.__b12x_shared_body__ is True and body.__b12x_abi_entry__ is True
    with pytest.raises(TypeError, match="shared_body"):
        abi.shared_body(3)


def test_real_lock_matches_real_b12x():
    report = check_lock(build_index(REPO / "b12x"), DEFAULT_LOCK_PATH)
    assert report == [], "\n".join(v.format() for v in report)


def test_malformed_lock_raises(tmp_path):
    lock = tmp_path / "abi_lock.json"
    lock.write_text('{"abi_version": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match="lock_path"):
        check_package(_package(tmp_path), lock_path=lock)
