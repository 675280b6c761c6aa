"""The code carries no lab notebook: few long docstrings, no dates (scripts/lab_notes.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / name for name in ("b12x", "oracle", "reference")]
MAX_LONG = 10
#: A planted date, spelled so that this file carries none itself.
DAY = "-".join(("2026", "01", "02"))


def _lab_notes():
    spec = importlib.util.spec_from_file_location("lab_notes", ROOT / "scripts" / "lab_notes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_packages_hold_the_limits(capsys):
    assert (
        _lab_notes().main([*map(str, PACKAGES), "--max-long", str(MAX_LONG), "--max-dates", "0"])
        == 0
    ), capsys.readouterr().out


def test_a_planted_long_docstring_and_date_are_reported(tmp_path):
    lab_notes = _lab_notes()
    body = "\n".join(f"line {i}" for i in range(30))
    planted = tmp_path / "planted.py"
    planted.write_text(
        f'"""Module.\n{body}\n"""\n\n\ndef f():\n    """Short."""\n    # ran on {DAY}\n'
    )
    notes = lab_notes.scan_file(planted)
    assert [name for name, _, _ in notes.long_docstrings] == ["<module>"]
    assert [date for _, date in notes.dates] == [DAY]
    assert lab_notes.main([str(tmp_path), "--max-long", "0"]) == 1
    assert lab_notes.main([str(tmp_path), "--max-dates", "0"]) == 1
    assert lab_notes.main([str(tmp_path), "--max-long", "1", "--max-dates", "1"]) == 0


def test_a_29_line_docstring_is_not_long(tmp_path):
    lab_notes = _lab_notes()
    short = tmp_path / "short.py"
    short.write_text('"""' + "\n" * 29 + '"""\n')
    assert lab_notes.scan_file(short).long_docstrings == []


def test_timing_lines_are_found_in_comments_not_code(tmp_path):
    lab_notes = _lab_notes()
    timed = tmp_path / "timed.py"
    timed.write_text('x = "92.7 us"  \n# ran at 92.7 us\n')
    assert lab_notes.scan_file(timed).timings == [2]
