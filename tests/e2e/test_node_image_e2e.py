"""trn1_build_image under the real scheduler and triggerer, on the shared deployment: triggered
through the REST API, it builds the node image on the local UltraCluster (the rendered node script in
a scratch root), waits deferred, records the image in the local profile's SSM parameter and deletes
the image it supersedes. Afterwards the test deletes the new image and the parameter: nothing is left.
No Slurm cluster is involved: an image build needs none."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.e2e.conftest import REPO, RUNTIME_READY, assert_nothing_left, s3_client
from tests.fixtures_localcluster import REGION, run_pcluster
from ultracluster.run.neuron_versions import load_versions, pins_digest
from ultracluster.run.node_image import TAG_PARAMETER, image_problems
from ultracluster.run.profiles import load_profile

pytestmark = [pytest.mark.e2e, pytest.mark.localcluster,
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]

IMAGE_DAG_ID = "trn1_build_image"
PARAMETER = load_profile("local")["node_image_parameter"]
TASKS = ("build_image", "record_image", "delete_superseded")


def clients(env: dict[str, str], *names: str):
    import boto3

    return [boto3.client(n, region_name=REGION, endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                         aws_secret_access_key="testing") for n in names]


def earlier_image(env: dict[str, str]) -> str:
    """An image an earlier run built for the parameter (another release), recorded there: superseded. As
    ParallelCluster leaves a built image, an AMI with its tags (a local build's own: test_image_build.py)."""
    ec2, ssm = clients(env, "ec2", "ssm")
    ami = ec2.register_image(Name="uc-earlier 2026-11-01T00-00-00.000Z", Architecture="x86_64",
                             RootDeviceName="/dev/sda1", VirtualizationType="hvm")["ImageId"]
    tags = {"parallelcluster:image_id": "uc-earlier", "parallelcluster:build_status": "available",
            "parallelcluster:version": "3.16.1", TAG_PARAMETER: PARAMETER, "ultracluster:neuron-release": "2.27.1"}
    ec2.create_tags(Resources=[ami], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    ssm.put_parameter(Name=PARAMETER, Value=ami, Type="String", DataType="aws:ec2:image", Overwrite=True)
    return ami


def test_the_image_dag_builds_records_and_deletes_the_superseded_image(airflow_local, e2e_home):
    api, env = airflow_local
    (ssm,) = clients(env, "ssm")
    earlier = earlier_image(env)
    built = None
    try:
        api.wait_for_dag(IMAGE_DAG_ID)
        run_id = api.call("POST", f"/api/v2/dags/{IMAGE_DAG_ID}/dagRuns",
                          {"logical_date": None, "conf": {"delete_superseded": True}})["dag_run_id"]
        state = api.wait_for_run(IMAGE_DAG_ID, run_id, 600)
        states = api.task_states(IMAGE_DAG_ID, run_id)
        xcoms = {task: api.call("GET", f"/api/v2/dags/{IMAGE_DAG_ID}/dagRuns/{run_id}/taskInstances/{task}"
                                       "/xcomEntries/return_value")["value"] for task in TASKS}
        xcoms = {task: value if isinstance(value, dict) else json.loads(value) for task, value in xcoms.items()}
        built = xcoms["build_image"]
        assert (state, states) == ("success", {task: "success" for task in TASKS}), xcoms

        # Built from this commit's pins, tagged so; what preflight accepts.
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        versions = load_versions()
        # built: the image came from the build the triggerer waited for (execute_complete), not found as it was.
        assert built["built"] is True and built["tags"]["ultracluster:commit"] == commit
        assert built["tags"]["ultracluster:neuron-pins"] == pins_digest(versions)
        assert image_problems(built["ami_id"], built["tags"], versions, "the recorded image") == []
        # Recorded in the parameter the profile names, replacing the earlier image, which is gone.
        assert xcoms["record_image"]["previous_ami_id"] == earlier
        assert ssm.get_parameter(Name=PARAMETER)["Parameter"]["Value"] == built["ami_id"]
        assert xcoms["delete_superseded"] == {"deleted": ["uc-earlier"]}
        code, gone = run_pcluster(env, "describe-image", "-i", "uc-earlier")
        assert code == 1 and gone["message"].startswith("No image or stack associated"), gone
    finally:
        for image_id in ([built["image_id"]] if built else []) + ["uc-earlier"]:
            run_pcluster(env, "delete-image", "-i", image_id, "--force", "true")
        try:
            ssm.delete_parameter(Name=PARAMETER)
        except ssm.exceptions.ParameterNotFound:
            pass
        s3 = s3_client(env["AWS_ENDPOINT_URL"])
        for item in s3.list_objects_v2(Bucket="ultracluster-artifacts", Prefix="runs/images/").get("Contents", []):
            s3.delete_object(Bucket="ultracluster-artifacts", Key=item["Key"])
    assert_nothing_left(env, e2e_home)
