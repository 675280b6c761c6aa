"""Section citations resolve inside the repository; docs/format.md's fingerprints are the fixture's.

A citation is the section sign followed by a dotted number (``N`` or ``N.M``...). Its target:

* a document path written directly before it (``docs/oracle_contract.md``, optionally in
  backticks; a bare name such as ``oracle_contract.md`` is looked up in ``docs/`` too): that
  document's numbered headings (``## 3. ...``, ``### 4.2 ...``);
* the bare word ``design`` (the blueprint outside the repository), or a citation followed by
  ``of the ...`` (a section of some other, unnamed document): never resolvable, such a citation
  must be rewritten to name a document of the repository;
* otherwise (bare, or after ``spec``): docs/format.md.

A citation that continues a list or range (``A, B``, ``A/B``, ``A–B``, ``A and B``) inherits the
target of the citation before it. An appendix citation (the word, or its abbreviation, and a
capital letter) always means docs/format.md's appendix. The section sign is written ``\\u00a7``
in this file, and appendix letters are spliced in, so that its own examples are not collected.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORMAT_DOC = REPO / "docs" / "format.md"
FINGERPRINTS = REPO / "fixtures" / "fingerprints.json"

SECTION = "\u00a7"
APPENDIX = "Append" + "ix"
REF_RE = re.compile(SECTION + r" ?(\d+(?:\.\d+)*)")
APPENDIX_RE = re.compile(r"\b(?:Appendix|App\.) ([A-Z])\b")
# Between two citations of one list or range: an optional range end ("3.3"), separators, "and"/"or".
CONTINUATION_RE = re.compile(r"^[\d.]*[\s,;/&\u2013\u2014-]*(?:(?:and|or)\s+)?$")
DOC_BEFORE_RE = re.compile(r"([\w./-]+\.md)`{0,2}\s*$")
DESIGN_BEFORE_RE = re.compile(r"\bdesign\s*$")
OF_OTHER_AFTER_RE = re.compile(r"^\s+of\s+the\s")
HEADING_RE = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
APPENDIX_HEADING_RE = re.compile(r"^#{1,6}\s+Appendix ([A-Z])\b", re.MULTILINE)
SKIP_DIRS = {"__pycache__", "node_modules", "build", "dist", "results", "venv"}


@dataclasses.dataclass(frozen=True)
class Ref:
    line: int
    token: str  # "4.2" for a section, "Appendix D" for an appendix
    target: str  # a document path as written, "design", or "" for docs/format.md


def find_refs(text: str) -> list[Ref]:
    """Every citation of ``text`` with the document it points at."""
    refs: list[Ref] = []
    prev_end, prev_target = None, ""
    for m in REF_RE.finditer(text):
        before = text[: m.start()]
        if prev_end is not None and CONTINUATION_RE.match(text[prev_end : m.start()]):
            target = prev_target
        elif doc := DOC_BEFORE_RE.search(before[-300:]):
            target = doc.group(1)
        elif DESIGN_BEFORE_RE.search(before[-40:]):
            target = "design"
        elif OF_OTHER_AFTER_RE.match(text[m.end() : m.end() + 20]):
            target = "of the"
        else:
            target = ""
        refs.append(Ref(text.count("\n", 0, m.start()) + 1, m.group(1), target))
        prev_end, prev_target = m.end(), target
    for m in APPENDIX_RE.finditer(text):
        refs.append(Ref(text.count("\n", 0, m.start()) + 1, f"Appendix {m.group(1)}", ""))
    return refs


def headings(doc: Path) -> set[str]:
    """Numbered sections ("4", "4.2") and appendices ("Appendix D") of a Markdown document."""
    text = doc.read_text(encoding="utf-8")
    found = set(HEADING_RE.findall(text))
    found |= {f"Appendix {letter}" for letter in APPENDIX_HEADING_RE.findall(text)}
    return found


def _target_doc(ref: Ref, source: Path, root: Path) -> Path | None:
    if not ref.target:
        return root / "docs" / "format.md"
    for base in (root, source.parent, root / "docs"):
        candidate = (base / ref.target).resolve()
        if candidate.is_file() and candidate.is_relative_to(root.resolve()):
            return candidate
    return None


def unresolved(paths: Iterable[Path], root: Path = REPO) -> list[str]:
    """``file:line: citation (why)`` for every citation in ``paths`` that does not resolve."""
    cache: dict[Path, set[str]] = {}
    problems = []
    for path in paths:
        for ref in find_refs(path.read_text(encoding="utf-8")):
            shown = ref.token if ref.token.startswith("Appendix") else SECTION + ref.token
            where = f"{path}:{ref.line}: {(ref.target + ' ') if ref.target else ''}{shown}"
            if ref.target == "design":
                problems.append(f"{where} (the design blueprint is not in the repository)")
                continue
            if ref.target == "of the":
                problems.append(f"{where} (a section of an unnamed document: name the document)")
                continue
            doc = _target_doc(ref, path, root)
            if doc is None:
                problems.append(f"{where} (no such document in the repository)")
                continue
            if doc not in cache:
                cache[doc] = headings(doc)
            if ref.token not in cache[doc]:
                problems.append(f"{where} (no such heading in {doc.relative_to(root)})")
    return problems


def repo_sources(root: Path = REPO) -> list[Path]:
    """Every .py and .md file of the repository (hidden and build directories skipped)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d
            for d in dirnames
            if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")
        ]
        out += [Path(dirpath) / f for f in filenames if f.endswith((".py", ".md"))]
    return sorted(out)


def test_every_citation_resolves():
    sources = repo_sources()
    assert FORMAT_DOC in sources
    assert sum(len(find_refs(p.read_text(encoding="utf-8"))) for p in sources) > 200
    assert unresolved(sources) == []


def test_planted_unknown_section_fails(tmp_path):
    bad = tmp_path / "planted.py"
    bad.write_text(f'"""Cites {SECTION}2.9 (exists) and {SECTION}9.9 (does not)."""\n')
    problems = unresolved([bad])
    assert len(problems) == 1 and f"{SECTION}9.9" in problems[0], problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"design {SECTION}5, {SECTION}8", ["design", "design"]),
        (f"spec {SECTION}1.2/{SECTION}1.5 and {SECTION}4.2", ["", "", ""]),
        (f"(``docs/oracle_contract.md`` {SECTION}1)", ["docs/oracle_contract.md"]),
        (f"(spec {SECTION}3.2\u20133.3, {SECTION}5.5; x.md {SECTION}4)", ["", "", "x.md"]),
        (f"see docs/oracle_contract.md.\nThen {SECTION}3", [""]),
        (f"{SECTION}4.2 of the regression classes; {SECTION}4.2 of format", ["of the", ""]),
    ],
)
def test_citation_targets(text, expected):
    assert [r.target for r in find_refs(text) if not r.token.startswith("Appendix")] == expected


def test_prefixed_citations_resolve_against_their_document(tmp_path):
    src = tmp_path / "cites.md"
    src.write_text(
        f"docs/oracle_contract.md {SECTION}3 and {SECTION}9; design {SECTION}6; "
        f"spec/regression-classes.md {SECTION}0; {APPENDIX} D; {APPENDIX} Z\n"
    )
    problems = unresolved([src])
    assert [p.split(": ", 1)[1] for p in problems] == [
        f"docs/oracle_contract.md {SECTION}9 (no such heading in docs/oracle_contract.md)",
        f"design {SECTION}6 (the design blueprint is not in the repository)",
        f"spec/regression-classes.md {SECTION}0 (no such document in the repository)",
        f"{APPENDIX} Z (no such heading in docs/format.md)",
    ]


def _doc_fingerprints() -> dict[str, str]:
    text = FORMAT_DOC.read_text(encoding="utf-8")
    start = text.index("### 2.9 ")
    section = text[start : text.index("\n## ", start)]
    rows = re.findall(r"^\| `([\w]+)` \|.*\| `([0-9a-f]{64})` \|$", section, re.MULTILINE)
    return dict(rows)


def test_fingerprint_table_matches_fixture():
    fixture = {
        key: entry["sha256"]
        for key, entry in json.loads(FINGERPRINTS.read_text())["tables"].items()
    }
    doc = _doc_fingerprints()
    assert len(fixture) == 16
    assert doc == fixture
