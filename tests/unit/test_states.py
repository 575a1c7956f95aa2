"""run.states: one verdict per state, and the pcluster waiters derived from it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ultracluster.run import states
from ultracluster.run.states import FAILED, GONE, PENDING, READY
from ultracluster.waiters import FAILURE, RETRY, SUCCESS, evaluate, load_waiter

WAITERS = Path(states.__file__).resolve().parents[1] / "waiters" / "pcluster.json"


def test_the_waiter_models_are_the_states_module_s():
    assert json.loads(WAITERS.read_text())["waiters"] == states.pcluster_waiters()


@pytest.mark.parametrize("status, verdict, create, delete", [
    ("CREATE_IN_PROGRESS", PENDING, RETRY, RETRY),
    ("CREATE_COMPLETE", READY, SUCCESS, RETRY),
    ("CREATE_FAILED", FAILED, FAILURE, RETRY),
    ("UPDATE_IN_PROGRESS", READY, SUCCESS, RETRY),
    ("UPDATE_COMPLETE", READY, SUCCESS, RETRY),
    ("UPDATE_FAILED", FAILED, FAILURE, RETRY),
    ("DELETE_IN_PROGRESS", GONE, FAILURE, RETRY),
    ("DELETE_COMPLETE", GONE, FAILURE, SUCCESS),
    ("DELETE_FAILED", FAILED, FAILURE, FAILURE),
])
def test_each_cluster_state_has_one_verdict_and_the_waits_follow_it(status, verdict, create, delete):
    assert states.cluster_verdict(status) == verdict
    assert evaluate(load_waiter("pcluster", "ClusterCreateComplete"), {"clusterStatus": status}) == create
    assert evaluate(load_waiter("pcluster", "ClusterDeleteComplete"), {"clusterStatus": status}) == delete


def test_unknown_states_wait_and_a_missing_stack_is_gone():
    assert states.cluster_verdict("SOMETHING_NEW") == PENDING and states.cluster_verdict(None) == PENDING
    assert states.fleet_verdict("") == PENDING and states.fleet_verdict("PROTECTED") == FAILED
    assert states.stack_verdict(None) == GONE and states.stack_verdict("ROLLBACK_COMPLETE") == FAILED
    assert states.stack_verdict("UPDATE_COMPLETE_CLEANUP_IN_PROGRESS") == PENDING


@pytest.mark.parametrize("state, verdict", [("PENDING", PENDING), ("RUNNING", PENDING), ("COMPLETING+", PENDING),
                                            ("COMPLETED", READY), ("CANCELLED by 0", FAILED), ("NODE_FAIL", FAILED),
                                            ("UNKNOWN", GONE)])
def test_job_states(state, verdict):
    assert states.job_verdict(state) == verdict


def test_every_verdict_is_one_of_four():
    for table in (states.CLUSTER_STATES, states.STACK_STATES, states.FLEET_STATES):
        assert set(table.values()) <= set(states.VERDICTS)
