"""run.events: the one shape of every trigger event, and every trigger building its events with it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ultracluster.run.events import REASONS, STATUSES, EventError, deterministic, event, event_problems

TRIGGERS = Path(__file__).resolve().parents[2] / "plugins" / "ultracluster" / "triggers"


def test_an_event_s_status_follows_from_its_reason():
    payload = event("job_failed", "Slurm job 4 ended FAILED", job_id="4", state="FAILED")
    assert payload == {"status": "failed", "reason": "job_failed", "message": "Slurm job 4 ended FAILED",
                       "job_id": "4", "state": "FAILED"}
    assert event_problems(payload) == []
    assert {status for status, _ in REASONS.values()} == set(STATUSES)


def test_a_bad_event_is_refused():
    with pytest.raises(EventError, match="unknown event reason"):
        event("budget")
    assert event_problems({"status": "success", "reason": "job_failed", "message": ""}) == [
        "reason 'job_failed' goes with status 'failed', not 'success'"]
    assert "status 'failure' is not one of" in event_problems({"status": "failure", "reason": "x", "message": 1})[0]


def test_no_retry_helps_a_budget_stop_or_a_host_key_mismatch():
    assert deterministic(event("budget_exceeded")) and deterministic(event("host_key_mismatch"))
    assert not deterministic(event("job_failed")) and not deterministic(event("unreachable"))


@pytest.mark.parametrize("path", sorted(TRIGGERS.glob("*.py")), ids=lambda p: p.name)
def test_every_trigger_event_is_built_by_run_events(path):
    """Each ``TriggerEvent(...)`` a trigger module makes takes ``event(...)``'s payload (which checks it);
    tests/conftest.py also checks every payload they emit while the suite runs."""
    built = [node for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "TriggerEvent"]
    for call in built:
        assert isinstance(call.args[0], ast.Call) and getattr(call.args[0].func, "id", None) == "event", (
            f"{path.name}:{call.lineno}: TriggerEvent({ast.unparse(call.args[0])}) is not built by event()")


def test_the_contract_lists_every_reason():
    text = (TRIGGERS.parents[2] / "docs" / "contracts.md").read_text()
    assert [reason for reason in REASONS if f"| `{reason}` | {REASONS[reason][0]} |" not in text] == []
