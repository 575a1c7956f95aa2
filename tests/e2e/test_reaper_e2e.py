"""The ultracluster_reaper DAG under the real scheduler, on the shared deployment: it asks the Task
SDK for run states, deletes the network stack of a pipeline run that has ended, and leaves an
unmarked stack and one of an unknown run that has not expired. The ended run is its own: a conf
that preflight refuses ends a pipeline run in seconds, with nothing created."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tests.e2e.conftest import DAG_ID, RUNTIME_READY
from tests.e2e.test_sweep import unpaused  # noqa: F401 - fixture
from tests.fixtures_localcluster import FAKE_AWS_CLIENT
from tests.localcluster.test_reaper_local import create_stack, stack_status
from ultracluster.run.tags import DAG_ID_TAG, RUN_ID_TAG, ownership_tags

pytestmark = [pytest.mark.e2e, pytest.mark.localcluster,
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]

REAPER_DAG_ID = "ultracluster_reaper"


def test_the_reaper_dag_deletes_an_ended_runs_stack_and_nothing_else(airflow_local, unpaused):
    import boto3

    api, env = airflow_local
    kw = dict(region_name="us-east-1", endpoint_url=env["AWS_ENDPOINT_URL"], **FAKE_AWS_CLIENT)
    aws = {"cfn": boto3.client("cloudformation", **kw), "ec2": boto3.client("ec2", **kw)}
    ended = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                     {"logical_date": None, "conf": {"num_nodes": 2, "max_nodes": 1}})["dag_run_id"]
    assert api.wait_for_run(DAG_ID, ended, 300) == "failed"  # preflight refused it: nothing was created
    now = datetime.now(timezone.utc)
    create_stack(aws, "uc-vpc-e2e-reap-ended", ownership_tags(DAG_ID, ended, started_at=now, ttl_hours=24))
    create_stack(aws, "uc-vpc-e2e-reap-unmarked", {DAG_ID_TAG: DAG_ID, RUN_ID_TAG: ended})
    create_stack(aws, "uc-vpc-e2e-reap-fresh", ownership_tags(DAG_ID, "manual__no_such_run", started_at=now,
                                                             ttl_hours=24))
    try:
        # Triggered while paused (no scheduled hourly run meets it), then unpaused so it is scheduled.
        run_id = api.call("POST", f"/api/v2/dags/{REAPER_DAG_ID}/dagRuns",
                          {"logical_date": None, "conf": {"artifacts_s3_uri": None}})["dag_run_id"]
        api.call("PATCH", f"/api/v2/dags/{REAPER_DAG_ID}", {"is_paused": False})
        assert api.wait_for_run(REAPER_DAG_ID, run_id, 600) == "success"
        # Unpausing also scheduled the latest hourly run, which may have been first: read every run.
        summaries = []
        for run in api.call("GET", f"/api/v2/dags/{REAPER_DAG_ID}/dagRuns")["dag_runs"]:
            assert api.wait_for_run(REAPER_DAG_ID, run["dag_run_id"], 600) == "success", run
            summaries.append(api.call("GET", f"/api/v2/dags/{REAPER_DAG_ID}/dagRuns/{run['dag_run_id']}/"
                                             "taskInstances/reap/xcomEntries/return_value")["value"])
        assert stack_status(aws, "uc-vpc-e2e-reap-ended") is None, summaries
        assert stack_status(aws, "uc-vpc-e2e-reap-unmarked") == "CREATE_COMPLETE", summaries
        assert stack_status(aws, "uc-vpc-e2e-reap-fresh") == "CREATE_COMPLETE", summaries
        deleted = [line for summary in summaries for line in summary["deleted"]]
        assert any("uc-vpc-e2e-reap-ended" in line and "run ended" in line for line in deleted), summaries
    finally:
        api.call("PATCH", f"/api/v2/dags/{REAPER_DAG_ID}", {"is_paused": True})
        for run in api.call("GET", f"/api/v2/dags/{REAPER_DAG_ID}/dagRuns")["dag_runs"]:
            if run["state"] in ("queued", "running"):  # no run left to later tests
                api.wait_for_run(REAPER_DAG_ID, run["dag_run_id"], 600)
        for name in ("uc-vpc-e2e-reap-ended", "uc-vpc-e2e-reap-unmarked", "uc-vpc-e2e-reap-fresh"):
            if stack_status(aws, name) is not None:
                aws["cfn"].delete_stack(StackName=name)
