"""The layer rule of design §1, enforced by import-linter (contracts in pyproject.toml).

``reference`` imports neither ``b12x`` nor ``oracle``; ``b12x`` imports neither ``reference`` nor
``oracle``. A second test plants a violation in a copy of the tree to prove the linter run here
would catch one (a contract test that cannot fail protects nothing).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())"
    )
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


def test_layer_contracts_hold() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def test_layer_contract_catches_b12x_importing_reference(tmp_path: Path) -> None:
    for name in ("reference", "b12x", "oracle"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "b12x" / "_planted_violation.py").write_text("import reference.trellis\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
