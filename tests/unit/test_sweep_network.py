"""hold_network (trn1_sweep_network): one deferral until the shared network can go, then the trigger
ends the task itself. The sweep index lives in in-process moto S3; the runs' states, which the
triggerer's supervisor serves through the Task SDK in a deployment, come from a table the test moves on."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred
from airflow.triggers.base import TaskSuccessEvent

import ultracluster.triggers.sweep_network as hold_trigger_module
from tests.unit.triggerer import in_triggerer
from ultracluster.operators.sweep_network import SweepNetworkHoldOperator
from ultracluster.run.sweep import GIVE_UP, HOLD, RELEASE, network_hold, write_index_entry
from ultracluster.triggers.sweep_network import SweepNetworkTrigger

ARTIFACTS = "s3://ultracluster-artifacts/runs"
DAG_ID = "trn1_bert_pretrain"
VPC = "vpc-0123"
RUNS = [f"manual__2026-12-03T10:0{i}:00+00:00" for i in range(3)]


@pytest.fixture
def index(monkeypatch):
    """The sweep index in moto S3: two points on the shared network, one on another network."""
    from moto import mock_aws

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": {"region_name": "us-east-1"}}))
    with mock_aws():
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook

        s3 = S3Hook(aws_conn_id="aws_default")
        s3.create_bucket("ultracluster-artifacts")
        for run_id, vpc in zip(RUNS, (VPC, VPC, "vpc-other")):
            write_index_entry(s3, ARTIFACTS, DAG_ID, run_id, {"sweep_point": {"id": "s1"}, "existing_vpc_id": vpc}, {})
        yield s3


@pytest.fixture
def states(monkeypatch):
    """run id -> state; each read counted (one per run and look)."""
    table = {RUNS[0]: "running", RUNS[1]: "running", RUNS[2]: "running"}
    reads = []

    def get_dagrun_state(dag_id, run_id):
        reads.append(run_id)
        return table.get(run_id)

    monkeypatch.setattr(hold_trigger_module, "get_dagrun_state", get_dagrun_state)
    return SimpleNamespace(table=table, reads=reads)


def hold_op(**overrides) -> SweepNetworkHoldOperator:
    kwargs = dict(task_id="hold_network", network={"vpc_id": VPC}, sweep_id="s1", points=2, source_dag_id=DAG_ID,
                  artifacts_s3_uri=ARTIFACTS, poll_interval=0)
    kwargs.update(overrides)
    return SweepNetworkHoldOperator(**kwargs)


def test_the_hold_defers_once_and_its_trigger_ends_the_task_when_the_points_have_ended(index, states, pushed):
    deferrals = 0
    with pytest.raises(TaskDeferred) as deferred:
        hold_op().execute({})
    deferrals += 1
    trigger = in_triggerer(deferred.value.trigger, "hold_network")
    assert isinstance(trigger, SweepNetworkTrigger)
    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)

    looks = []

    async def wait():
        async for fired in trigger.run():
            return fired

    real_look = hold_trigger_module.look

    def look(log, **kw):
        looks.append(1)
        if len(looks) == 2:
            states.table[RUNS[0]] = "success"
        if len(looks) == 3:
            states.table[RUNS[1]] = "failed"  # an ended point, failed or not, no longer needs the network
        return real_look(log, **kw)

    hold_trigger_module.look = look
    try:
        ended = asyncio.run(wait())
    finally:
        hold_trigger_module.look = real_look
    assert deferrals == 1 and len(looks) == 3  # three looks in one deferral, not three deferrals
    assert isinstance(ended, TaskSuccessEvent)
    assert pushed == {"return_value": {"vpc_id": VPC, "sweep_id": "s1", "expected": 2,
                                            "runs": {RUNS[0]: "success", RUNS[1]: "failed"}}}
    assert RUNS[2] not in states.reads  # a run on another network is never asked about


def test_a_sweep_already_over_returns_at_once_without_deferring(index, states):
    states.table.update({RUNS[0]: "success", RUNS[1]: None})  # a deleted run has ended too
    assert hold_op().execute({}) == {"vpc_id": VPC, "sweep_id": "s1", "expected": 2,
                                     "runs": {RUNS[0]: "success", RUNS[1]: "missing"}}


def test_looks_that_keep_failing_end_the_wait_and_fail_the_task(index, states, monkeypatch):
    def broken(dag_id, run_id):
        raise ConnectionError("API server unreachable")

    with pytest.raises(TaskDeferred) as deferred:
        hold_op().execute({})
    monkeypatch.setattr(hold_trigger_module, "get_dagrun_state", broken)
    monkeypatch.setattr(hold_trigger_module, "MAX_CONSECUTIVE_ERRORS", 2)

    async def wait():
        return [fired async for fired in deferred.value.trigger.run()]

    [ended] = asyncio.run(wait())
    assert (ended.payload["status"], ended.payload["reason"]) == ("error", "api_error")
    with pytest.raises(AirflowException, match="API server unreachable"):
        hold_op().execute_complete({}, ended.payload)


@pytest.mark.parametrize("states_seen, held_s, verdict", [
    ({RUNS[0]: "running", RUNS[1]: "success"}, 0, HOLD),
    ({RUNS[0]: "success"}, 0, HOLD),  # the second point has not registered yet
    ({RUNS[0]: "success", RUNS[1]: "failed"}, 0, RELEASE),
    ({RUNS[0]: "running", RUNS[1]: "success"}, 3 * 3600 + 1, GIVE_UP),
])
def test_network_hold_verdicts(states_seen, held_s, verdict):
    entries = [{"run_id": run, "plan": {"existing_vpc_id": VPC}} for run in states_seen]
    found, summary, open_runs = network_hold(entries, states_seen, vpc_id=VPC, sweep_id="s1", points=2,
                                             held_s=held_s, max_hold_hours=3)
    assert found == verdict
    assert open_runs == sorted(run for run, state in states_seen.items() if state == "running")
    assert summary.get("gave_up", False) is (verdict == GIVE_UP)


def test_outside_a_triggerer_the_hold_resumes_its_task_with_the_same_value(index, states):
    """dag.test() runs triggers inline, without a task instance (triggers.task_end)."""
    with pytest.raises(TaskDeferred) as deferred:
        hold_op().execute({})
    states.table.update({RUNS[0]: "success", RUNS[1]: "success"})

    async def wait():
        async for fired in deferred.value.trigger.run():
            return fired

    plain = asyncio.run(wait())
    assert plain.payload["status"] == "success"
    assert hold_op().execute_complete({}, plain.payload) == {
        "vpc_id": VPC, "sweep_id": "s1", "expected": 2, "runs": {RUNS[0]: "success", RUNS[1]: "success"}}
