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
* Failing cases are saved automatically: a test takes the ``oracle_case`` fixture and fills it
  (``oracle_case.add(name, tensor)``, ``oracle_case.meta.update(...)``, or
  ``oracle_case.from_case(grid_case)``); when the test then fails, the plugin calls
  :func:`oracle.report.results.save_case` under ``--oracle-results DIR`` (default ``results``) and
  prints the exact ``python -m oracle replay ...`` command in the report (section "oracle case").
  A passing test saves nothing; a failing test that filled nothing saves nothing.
* ``--shuffle-seed N`` runs the collected tests in a pseudo-random order fixed by ``N`` (the
  same permutation in every xdist worker, so their collections agree), to show that no test
  depends on what ran before it in the same process (the seed is printed in the header, so a
  failing order can be replayed).

This module must not import torch at import time: the root conftest pins one GPU per xdist
worker before CUDA initialises, and this plugin is loaded right after it.
"""

from __future__ import annotations

import os
import random
import re
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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


def pytest_configure(config: pytest.Config) -> None:
    # after the root conftest pinned each xdist worker's GPU, so counting here initialises CUDA
    # only where the pinning already holds
    if config.getoption("require_gpu", False) and _cuda_device_count() == 0:
        raise pytest.UsageError(
            "--require-gpu: no CUDA device is visible; every gpu-marked test would be skipped "
            "and the run would pass without testing anything on a GPU"
        )


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("shuffle_seed")
    return None if seed is None else f"test order shuffled with --shuffle-seed {seed}"


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
