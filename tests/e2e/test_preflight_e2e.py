"""Fail before spend, under a real scheduler: each bad conf fails its run in preflight, on the first
try, before any stack or cluster exists, and the failure names the field."""
from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import DAG_ID, RUNTIME_READY, s3_client, task_log  # noqa: F401 - task_log: others import it from here
from tests.e2e.test_sweep import unpaused  # noqa: F401 - fixture
from tests.fixtures_localcluster import FAKE_AWS_CLIENT

pytestmark = [pytest.mark.e2e, pytest.mark.localcluster,
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]

BAD_CONFS = {
    "cross-field": ({"num_nodes": 2, "max_nodes": 1}, "num_nodes (2) exceeds max_nodes (1)"),
    "dataset": ({"dataset_s3_uri": "s3://neuron-s3/training_datasets/typo.tar"},
                "dataset_s3_uri: no object s3://neuron-s3/training_datasets/typo.tar"),
    "key pair": ({"key_name": "no-such-key"}, "key_name: no key pair 'no-such-key'"),
    "aws tag": ({"extra_tags": {"aws:team": "ml"}}, "extra_tags: key 'aws:team' uses a reserved prefix"),
    "AZ offering": ({"availability_zone_id": "use1-az1"},
                    "instance_type: trn1.32xlarge is not offered in availability zone id use1-az1"),
    "world SSH": ({"ssh_allowed_cidr": "0.0.0.0/0"},
                  "ssh_allowed_cidr: 0.0.0.0/0 opens the head node's SSH (port 22) to the whole internet"),
    "reservation": ({"capacity_reservation_id": "cr-0000000000000000b"},
                    "capacity_reservation_id: cr-0000000000000000b: no such capacity reservation"),
    "existing cluster": ({"existing_cluster_name": "no-such-cluster"},
                         "existing_cluster_name: cluster no-such-cluster does not exist in region us-east-1"),
}


def test_bad_confs_fail_in_preflight_on_the_first_try_and_create_nothing(airflow_local, e2e_home, unpaused):
    api, env = airflow_local
    import boto3

    cfn = boto3.client("cloudformation", region_name="us-east-1", endpoint_url=env["AWS_ENDPOINT_URL"],
                       **FAKE_AWS_CLIENT)
    stacks_before = {s["StackId"] for s in cfn.list_stacks()["StackSummaries"]}
    started = time.monotonic()
    runs = {name: api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": conf})["dag_run_id"]
            for name, (conf, _) in BAD_CONFS.items()}
    for name, run_id in runs.items():
        assert api.wait_for_run(DAG_ID, run_id, 600) == "failed", name
    took = time.monotonic() - started
    for name, run_id in runs.items():
        tis = {ti["task_id"]: ti for ti in api.call(
            "GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]}
        assert (tis["preflight"]["state"], tis["preflight"]["try_number"]) == ("failed", 1), (name, tis["preflight"])
        assert tis["create_vpc"]["state"] == "upstream_failed" and tis["pcluster_create"]["state"] == "upstream_failed"
        assert BAD_CONFS[name][1] in task_log(api, run_id, "preflight"), name
    # Nothing was created: no stack, no probe object left in the artifacts bucket.
    assert {s["StackId"] for s in cfn.list_stacks()["StackSummaries"]} == stacks_before
    listed = s3_client(env["AWS_ENDPOINT_URL"]).list_objects_v2(Bucket="ultracluster-artifacts", Prefix="runs/_preflight/")
    assert listed.get("KeyCount", 0) == 0
    print(f"{len(runs)} bad confs failed in preflight, first try, in {took:.0f} s in all")
