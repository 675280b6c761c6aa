"""Hostile inputs to every command: the exit-code contract holds for generated argv.

Each example picks a command, one option of it and a hostile value of that option's kind (an
empty string, a directory where a file is written, a path under a regular file, a number that
is not one, nan, a size past the kernels' index range, a file that is not JSON or is nested
past the decoder's limit), optionally beside valid options. Contract: exit 2, exactly one line
on stderr naming the command, nothing on stdout, no traceback; never exit 0. Every hostile
value must be refused before any work, so an example never runs a job.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import oracle.checks
from oracle.cli import main
from oracle.pytest_plugin import scaled_examples

# kinds of hostile values (built per example under a temporary directory by `_value`)
TEXT = ("", " ")
OUT_FILE = ("", "{dir}", "{under_file}", "{file}/")
OUT_DIR = ("", "{file}", "{under_file}")
IN_JSON = ("", "{dir}", "{missing}", "{not_json}", "{deep}")
COUNT = ("0", "-3", "x", "1.5", "nan")
SECONDS = ("nan", "inf", "-1", "0", "x")
HUGE = (str(2**31), str(2**40), str(2**62))
KERNEL = ("", " ", "nonsense", "os:path", "no.such.module:ADAPTER", ":", "oracle.adapters:")

#: command -> (the words before the options, valid options kept beside, {option: kinds})
COMMANDS = {
    "default": ([], ["--only", "layout"], {"--json": OUT_FILE, "--results": OUT_DIR,
                                            "--only": TEXT}),
    "run": (["run"], [], {"--case": TEXT, "--tile": TEXT, "--filter": TEXT, "--json": OUT_FILE,
                          "--results": OUT_DIR, "--max-cases": COUNT, "--kernel": KERNEL}),
    "grid": (["grid"], [], {"--filter": TEXT}),
    "report": (["report"], [], {"": IN_JSON}),
    "replay": (["replay"], [], {"": IN_JSON}),
    "coverage": (["coverage"], ["-q"], {"--json": OUT_FILE}),
    "mutate": (["mutate"], ["--list"], {"--only": TEXT, "--json": OUT_FILE,
                                        "--timeout": SECONDS, "--catalogue": ("{missing}",),
                                        "--from-json": IN_JSON}),
    "contracts": (["contracts"], [], {"--json": OUT_FILE}),
    "explain": (["explain"], ["--k", "256", "--codebook", "mcg", "--bits", "4"],
                {"--m": COUNT + HUGE, "--n": HUGE, "--json": OUT_FILE}),
}  # fmt: skip
VALID_N = ["--n", "256"]


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    monkeypatch.setattr(oracle.checks, "cuda_available", lambda: False)
    import oracle.mutate.cli as mutate_cli

    monkeypatch.setattr(mutate_cli, "_cuda", lambda: False)


def _value(template: str, root) -> str:
    regular = root / "regular.txt"
    regular.write_text("a regular file")
    (root / "not.json").write_text("{ not json")
    (root / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    return template.format(
        dir=str(root), file=str(regular), under_file=str(regular / "x.json"),
        missing=str(root / "absent.json"), not_json=str(root / "not.json"),
        deep=str(root / "deep.json"),
    )  # fmt: skip


def _argv(name: str, picks: list[tuple[str, str]], keep_valid: bool, root) -> list[str]:
    words, valid, _ = COMMANDS[name]
    argv = [*words, *(valid if keep_valid or name == "explain" else [])]
    chosen = {option for option, _ in picks}
    if name == "explain":
        argv += [] if "--n" in chosen else VALID_N
        argv += [] if "--m" in chosen else ["--m", "4"]
    for option, template in picks:
        value = _value(template, root)
        argv += [value] if option == "" else [option, value]
    return argv


def _assert_refused(argv, capsys) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (argv, code, out, err)
    assert out == "", (argv, out)
    assert err.count("\n") == 1 and err.startswith("python -m oracle"), (argv, err)
    assert "Traceback" not in err, (argv, err)


EVERY = [
    (name, option, template)
    for name, (_, _, options) in sorted(COMMANDS.items())
    for option, templates in sorted(options.items())
    for template in templates
]


@pytest.mark.parametrize("name, option, template", EVERY, ids=[" ".join(c) for c in EVERY])
def test_every_hostile_value_of_every_option_is_refused(name, option, template, tmp_path, capsys):
    _assert_refused(_argv(name, [(option, template)], True, tmp_path), capsys)


@st.composite
def hostile_argv(draw):
    name = draw(st.sampled_from(sorted(COMMANDS)))
    options = COMMANDS[name][2]
    chosen = draw(st.lists(st.sampled_from(sorted(options)), min_size=1, max_size=3, unique=True))
    picks = [(option, draw(st.sampled_from(options[option]))) for option in chosen]
    if "" in chosen:  # the positional goes last, once
        picks = [p for p in picks if p[0] != ""] + [p for p in picks if p[0] == ""]
    return name, picks, draw(st.booleans())


@settings(
    deadline=None,
    max_examples=scaled_examples(60),
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # capsys is read per example
)
@given(case=hostile_argv())
def test_several_hostile_values_together_are_refused(case, tmp_path_factory, capsys):
    name, picks, keep_valid = case
    _assert_refused(_argv(name, picks, keep_valid, tmp_path_factory.mktemp("hostile")), capsys)
