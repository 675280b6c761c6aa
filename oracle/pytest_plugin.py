"""pytest plugin: markers, collection-time GPU skips and hypothesis profiles.

* Markers ``gpu``, ``graph``, ``slow``, ``multi_gpu`` are declared in pyproject.toml and
  ``--strict-markers`` is on, so a typo is an error rather than a silently unselected test.
* A test marked ``gpu`` (or ``multi_gpu``) is skipped *at collection* when CUDA is absent (or
  fewer than two devices are visible), with the reason in the report; no test body decides that.
* ``--require-gpu`` refuses the session (usage error, exit 4) when no CUDA device is visible:
  a GPU tier run on a machine whose GPU is missing would otherwise skip every ``gpu`` test and
  pass. The device scripts (``scripts/gpu_tier.sh`` and friends) pass it.
* Hypothesis profiles: ``ci`` (derandomised, no deadline; chosen automatically when ``CI`` is
  set), ``dev`` (the default locally) and ``stress`` (many examples, random). Pick one with
  ``--hypothesis-profile``. A test states its example budget as its count under ``ci``,
  through :func:`scaled_examples`, never as a literal that would pin it under every profile.
* Failing cases are saved: a test fills the ``oracle_case`` fixture (``add(name, tensor)``,
  ``meta.update(...)``, ``from_case(grid_case)``); when it fails, the plugin saves it under
  ``--oracle-results DIR`` (:func:`oracle.report.results.save_case`) and prints the replay command.
* ``--shuffle-seed N`` runs the tests in an order fixed by ``N`` (the same in every xdist worker;
  printed in the header), to show that no test depends on what ran before it.
* :func:`slow_sweep` parametrises a ``slow``-marked sweep with one item per case only when ``-m``
  names ``slow`` (:func:`marker_selected`); otherwise it is one placeholder item skipped at
  collection with the sweep's reason. ``--slow-slice I/N`` keeps the ``slow`` tests whose position
  in their sorted node ids is ``I`` mod ``N`` (disjoint slices that together hold them all, equal
  in every xdist worker; ``scripts/gpu_tier.sh``'s ``SLOW`` phase runs them on the device box).
* ``deep`` tests (kernel compiles with their budgets, the CPU mutation gate) are deselected unless
  ``-m`` names ``deep`` or the test's file is named on the command line; ``.ci/run`` runs them.

This module must not import torch at import time: the root conftest pins one GPU per xdist
worker before CUDA initialises, and this plugin is loaded right after it.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from oracle.report.results import replay_command, save_case

#: Examples per test under the ``ci`` profile; :func:`scaled_examples` is relative to it.
CI_EXAMPLES = 60
_PROFILE_EXAMPLES = {"ci": CI_EXAMPLES, "dev": 40, "stress": 2000}


def scaled_examples(ci_count: int) -> int:
    """A test's example budget, ``ci_count`` under the ``ci`` profile, scaled to the loaded one
    (``dev`` two thirds of it, ``stress`` 33 times): a costly test asks for fewer than
    :data:`CI_EXAMPLES` and still grows under ``--hypothesis-profile stress``."""
    from hypothesis import settings

    return max(1, round(ci_count * settings.default.max_examples / CI_EXAMPLES))


def _register_hypothesis_profiles() -> None:
    try:
        from hypothesis import HealthCheck, settings  # lazy: hypothesis is optional (dev extra)
    except ImportError:  # hypothesis is a dev dependency; the plugin still works without it
        return
    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
    examples = _PROFILE_EXAMPLES
    settings.register_profile(
        "ci", derandomize=True, max_examples=examples["ci"], print_blob=True, **common
    )
    settings.register_profile("dev", max_examples=examples["dev"], derandomize=False, **common)
    settings.register_profile(
        "stress", max_examples=examples["stress"], derandomize=False, database=None, **common
    )
    settings.load_profile("ci" if os.environ.get("CI") else "dev")


_register_hypothesis_profiles()


def _cuda_device_count() -> int:
    try:
        import torch  # lazy: conftest pins the GPUs before torch loads
    except ImportError:
        return 0
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver means "no usable GPU"
        return 0


def marker_selected(config: pytest.Config, marker: str) -> bool:
    """Whether the run's ``-m`` expression names ``marker`` (the ``slow`` sweeps' and the
    ``deep`` tier's opt-in)."""
    return marker in (config.getoption("-m") or "")


def deselect(config: pytest.Config, items: list[pytest.Item], dropped: list[pytest.Item]) -> None:
    """Report ``dropped`` as deselected and remove them from ``items`` (in place)."""
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [it for it in items if id(it) not in gone]


def slow_sweep(
    argnames: str | Sequence[str],
    cases: Iterable[Any] | Callable[[], Iterable[Any]],
    id_of: Callable[[Any], str],
    *,
    reason: str,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator of a ``slow``-marked test: under ``-m slow`` it is parametrised over ``argnames``
    with one item per case of ``cases`` (a sequence, or a callable returning one, called only
    then) whose id is ``id_of(case)`` (a case is a tuple when there are several names); without
    it, with one placeholder item (id ``sweep``, arguments ``None``) skipped with ``reason``."""

    def mark(function: Callable[..., Any]) -> Callable[..., Any]:
        function.oracle_slow_sweep = (argnames, cases, id_of, reason)
        return function

    return mark


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    sweep = getattr(metafunc.function, "oracle_slow_sweep", None)
    if sweep is None:
        return
    argnames, cases, id_of, reason = sweep
    if marker_selected(metafunc.config, "slow"):
        values = list(cases() if callable(cases) else cases)
        metafunc.parametrize(argnames, values, ids=[id_of(v) for v in values])
        return
    names = argnames.split(",") if isinstance(argnames, str) else argnames
    skip = pytest.mark.skip(reason=reason)
    metafunc.parametrize(argnames, [pytest.param(*[None] * len(names), marks=skip, id="sweep")])


_SLICE = re.compile(r"(\d+)/(\d+)")


def parse_slow_slice(text: str) -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)`` with ``0 <= I < N``; a :class:`pytest.UsageError` otherwise."""
    match = _SLICE.fullmatch(text.strip())
    if match is None or not int(match[1]) < int(match[2]):
        raise pytest.UsageError(
            f"--slow-slice: expected I/N with integers 0 <= I < N (slice I of N, e.g. 0/2 and "
            f"1/2), got {text!r}"
        )
    return int(match[1]), int(match[2])


class _SlowSlice:
    """Registered by :func:`pytest_configure` only when ``--slow-slice`` is given."""

    def __init__(self, index: int, count: int):
        self.index, self.count = index, count

    @pytest.hookimpl(trylast=True)  # after -m/-k deselected: slice what they kept
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        slow = sorted(item.nodeid for item in items if item.get_closest_marker("slow"))
        dropped = {n for position, n in enumerate(slow) if position % self.count != self.index}
        deselect(config, items, [it for it in items if it.nodeid in dropped])


def _named_files(config: pytest.Config) -> set[Path]:
    """The test files the command line names (``path.py`` or ``path.py::node``)."""
    root = Path(config.invocation_params.dir)
    files = (arg.split("::")[0] for arg in config.args)
    return {(root / f).resolve() for f in files if f.endswith(".py")}


def _deselect_deep(config: pytest.Config, items: list[pytest.Item]) -> None:
    if marker_selected(config, "deep"):
        return
    named = _named_files(config)
    deselect(config, items, [
        it for it in items if it.get_closest_marker("deep") and Path(it.path).resolve() not in named
    ])  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _deselect_deep(config, items)
    seed = config.getoption("shuffle_seed")
    if seed is not None:
        random.Random(seed).shuffle(items)
    needs_gpu = [
        it for it in items if it.get_closest_marker("gpu") or it.get_closest_marker("multi_gpu")
    ]
    if not needs_gpu:
        return
    count = _cuda_device_count()
    no_gpu = pytest.mark.skip(reason="needs a CUDA device; none is visible (CPU-only machine)")
    too_few = pytest.mark.skip(reason=f"needs two or more CUDA devices; {count} visible")
    for item in needs_gpu:
        if count == 0:
            item.add_marker(no_gpu)
        elif item.get_closest_marker("multi_gpu") and count < 2:
            item.add_marker(too_few)


# --- saving failing cases --------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class OracleCase:
    """What a test hands the plugin to save if it fails: tensors by name and JSON-able meta."""

    def __init__(self, nodeid: str):
        self.nodeid = nodeid
        self.meta: dict[str, Any] = {}
        self.tensors: dict[str, Any] = {}
        self.saved_path: Any = None
        self.replay: str | None = None

    def add(self, name: str, tensor: Any) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"oracle_case.add: name must be a non-empty string, got {name!r}")
        self.tensors[name] = tensor

    def from_case(self, case: Any) -> None:
        """Record a grid case (``oracle.cases.grids.Case``): its id makes the save replayable."""
        self.meta["case_id"] = case.case_id
        self.meta["case"] = case.to_dict()

    def case_id(self) -> str:
        given = self.meta.get("case_id")
        if isinstance(given, str) and given:
            return given
        return _UNSAFE.sub("_", self.nodeid).strip("_")[:180] or "case"

    def save(self, results_dir: str) -> str:
        meta = {**self.meta, "case_id": self.case_id(), "test": self.nodeid}
        self.saved_path = save_case(meta, self.tensors, results_dir)
        self.replay = replay_command(self.saved_path)
        return self.replay


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("oracle")
    group.addoption(
        "--oracle-results",
        default="results",
        metavar="DIR",
        help="where tests using the oracle_case fixture save their case when they fail",
    )
    group.addoption(
        "--require-gpu",
        action="store_true",
        help="refuse to run (usage error) when no CUDA device is visible, instead of skipping "
        "every gpu-marked test",
    )
    group.addoption(
        "--shuffle-seed",
        type=int,
        default=None,
        metavar="N",
        help="run the tests in a pseudo-random order fixed by N (order-independence check)",
    )
    group.addoption(
        "--slow-slice",
        default=None,
        metavar="I/N",
        help="keep slice I of N (0 <= I < N) of the slow-marked tests, by their sorted node ids; "
        "deselect the other slow tests (e.g. -m slow --slow-slice 0/2, then 1/2)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # after the root conftest pinned each xdist worker's GPU, so counting here initialises CUDA
    # only where the pinning already holds
    if config.getoption("require_gpu", False) and _cuda_device_count() == 0:
        raise pytest.UsageError(
            "--require-gpu: no CUDA device is visible; every gpu-marked test would be skipped "
            "and the run would pass without testing anything on a GPU"
        )
    slow_slice = config.getoption("slow_slice", None)
    if slow_slice is not None:
        config.pluginmanager.register(_SlowSlice(*parse_slow_slice(slow_slice)), "slow-slice")


def pytest_report_header(config: pytest.Config) -> list[str]:
    seed = config.getoption("shuffle_seed")
    slow_slice = config.getoption("slow_slice", None)
    lines = [] if seed is None else [f"test order shuffled with --shuffle-seed {seed}"]
    if slow_slice is not None:
        lines.append(f"slow tests: slice {slow_slice.strip()} (--slow-slice)")
    if not marker_selected(config, "deep"):
        lines.append(
            "deep tests (kernel compiles, the mutation gate): deselected, -m deep runs them"
        )
    return lines


@pytest.fixture
def oracle_case(request: pytest.FixtureRequest) -> OracleCase:
    """Fill with tensors and meta; saved (with a replay command) only if the test fails."""
    return OracleCase(request.node.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    case = getattr(item, "funcargs", {}).get("oracle_case")
    if not isinstance(case, OracleCase) or not case.tensors:
        return
    try:
        command = case.save(item.config.getoption("oracle_results"))
        text = f"saved failing case: {case.saved_path}\nreplay: {command}"
    except Exception as exc:  # noqa: BLE001 - never mask the test's own failure
        text = f"could not save the failing case: {type(exc).__name__}: {exc}"
    report.sections.append(("oracle case", text))
