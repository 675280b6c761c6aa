"""The default job's contracts family: the ABI result and the entry-call binding result."""

from __future__ import annotations

import types

import pytest


def _report(resolved: int, total: int):
    counts = {"entry_calls": total, "resolved_entry_calls": resolved}
    return types.SimpleNamespace(ok=True, violations=[], counts=counts, by_rule=lambda: {})


@pytest.mark.parametrize(("resolved", "total", "status"), [(23, 23, "pass"), (22, 23, "fail")])
def test_one_unbound_launch_fails_the_entry_call_check(monkeypatch, resolved, total, status):
    import oracle.contracts
    from oracle.checks import contracts

    monkeypatch.setattr(oracle.contracts, "check_b12x", lambda: _report(resolved, total))
    abi, entry = contracts.run()
    assert abi.name == "contracts.abi" and abi.status == "pass"
    assert entry.name == "contracts.entry_calls" and entry.status == status
    assert entry.metrics == {"resolved": resolved, "total": total}


def test_b12x_binds_every_launch_today():
    from oracle.checks import contracts

    results = {r.name: r for r in contracts.run()}
    entry = results["contracts.entry_calls"]
    assert entry.status == "pass", entry.reason
    assert entry.metrics["total"] >= 23  # every compiled-kernel launch site is counted
