"""trn1_build_image's operators against the local `pcluster` (its image verbs, a real moto server):
build (deferred, the image trigger run to its event), record in SSM, delete what the new image
supersedes; a retry finds the image it built; a refused configuration fails without retries, naming
what to do. (An image still in use: tests/unit/test_node_image_records.py and the local CLI's refusal
in tests/localcluster/test_image_build.py.)"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
from types import SimpleNamespace

import boto3
import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, TaskDeferred

from tests.fixtures_localcluster import PCLUSTER_BIN, REGION, cli_env
from ultracluster.operators.node_image import BuildNodeImageOperator
from ultracluster.operators.node_image_records import DeleteSupersededImagesOperator, RecordNodeImageOperator
from ultracluster.run.neuron_versions import load_versions, pins_digest
from ultracluster.run.node_image import image_id_for

pytestmark = [pytest.mark.localcluster,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                 reason="the local image build needs root and unshare (a mount namespace)")]

PARAMETER = "/ultracluster/test/operators"
BUCKET = "ultracluster-artifacts"
COMMITS = ("a" * 40, "b" * 40, "c" * 40)


@pytest.fixture(scope="module")
def account(moto_server, tmp_path_factory):
    """A local pcluster of its own home and the moto server, as Airflow connections."""
    home = tmp_path_factory.mktemp("uc-image-ops")
    env = cli_env(home, moto_server)
    clients = {name: boto3.client(name, region_name=REGION, endpoint_url=moto_server, aws_access_key_id="testing",
                                  aws_secret_access_key="testing") for name in ("s3", "ssm", "ec2")}
    if BUCKET not in {b["Name"] for b in clients["s3"].list_buckets()["Buckets"]}:
        clients["s3"].create_bucket(Bucket=BUCKET)
    connections = {
        "AIRFLOW_CONN_UC_IMAGE_PCLUSTER": {"conn_type": "pcluster", "extra": {
            "binary": str(PCLUSTER_BIN), "region": REGION,
            "env": {k: env[k] for k in env if k.startswith(("AWS_", "LOCAL_UC", "LOCAL_ULTRACLUSTER"))}}},
        "AIRFLOW_CONN_UC_IMAGE_AWS": {"conn_type": "aws", "login": "testing", "password": "testing",
                                      "extra": {"endpoint_url": moto_server, "region_name": REGION}},
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in connections.items():
            patch.setenv(name, json.dumps(value))
        yield SimpleNamespace(home=home, **clients)
        for summary in _pcluster_images(env):
            os.system(f"{PCLUSTER_BIN} delete-image -i {summary} --force true > /dev/null")
        try:
            clients["ssm"].delete_parameter(Name=PARAMETER)
        except clients["ssm"].exceptions.ParameterNotFound:
            pass


def _pcluster_images(env) -> list[str]:
    from tests.fixtures_localcluster import run_pcluster

    return [i["imageId"] for status in ("AVAILABLE", "FAILED")
            for i in run_pcluster(env, "list-images", "--image-status", status)[1]["images"]]


def context() -> dict:
    return {"run_id": "manual__image", "params": {}, "ti": SimpleNamespace(xcom_push=lambda **_: None)}


def finish(op, deferred: TaskDeferred, **kwargs):
    """What the triggerer and the resumed task do: run the trigger to its event, then the method."""
    async def first_event():
        async for event in deferred.trigger.run():
            return event.payload
    payload = asyncio.run(first_event())
    return getattr(op, deferred.method_name)(context(), payload, **(deferred.kwargs or {}), **kwargs)


def build(monkeypatch, commit: str, **overrides):
    monkeypatch.setenv("ULTRACLUSTER_COMMIT", commit)
    op = BuildNodeImageOperator(task_id="build_image", parameter=PARAMETER, region_name=REGION, image_os="ubuntu2204",
                                artifacts_s3_uri=f"s3://{BUCKET}/runs", aws_conn_id="uc_image_aws",
                                pcluster_conn_id="uc_image_pcluster", poll_interval=0.5, **overrides)
    try:
        return op.execute(context())
    except TaskDeferred as deferred:
        assert deferred.trigger.serialize()[1]["image_ids"] == [image_id_for(load_versions(), commit)]
        return finish(op, deferred)


def record(image: dict) -> dict:
    return RecordNodeImageOperator(task_id="record_image", image=image, region_name=REGION,
                                   aws_conn_id="uc_image_aws").execute(context())


def delete_superseded(image: dict, delete=True) -> dict:
    op = DeleteSupersededImagesOperator(task_id="delete_superseded", image=image, delete=delete, region_name=REGION,
                                        aws_conn_id="uc_image_aws", pcluster_conn_id="uc_image_pcluster",
                                        poll_interval=0.5)
    try:
        return op.execute(context())
    except TaskDeferred as deferred:
        return finish(op, deferred)


def earlier_image(account, image_id: str, **tags: str) -> str:
    """An image built for the parameter before, as ParallelCluster leaves one: an AMI with its tags
    (registered straight into moto: its build is test_image_build.py's)."""
    ami = account.ec2.register_image(Name=f"{image_id} 2026-11-01T00-00-00.000Z", Architecture="x86_64",
                                     RootDeviceName="/dev/sda1", VirtualizationType="hvm")["ImageId"]
    tags = {"parallelcluster:image_id": image_id, "parallelcluster:build_status": "available",
            "parallelcluster:version": "3.16.1", "ultracluster:node-image": PARAMETER,
            "ultracluster:neuron-release": "2.27.1", **tags}
    account.ec2.create_tags(Resources=[ami], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    return ami


def test_build_record_and_delete_the_superseded_image(account, monkeypatch):
    versions = load_versions()
    older = earlier_image(account, "uc-neuron-older")
    account.ssm.put_parameter(Name=PARAMETER, Value=older, Type="String", DataType="aws:ec2:image", Overwrite=True)
    foreign = earlier_image(account, "uc-neuron-foreign", **{"ultracluster:node-image": "/ultracluster/elsewhere"})

    built = build(monkeypatch, COMMITS[0])
    assert built["built"] is True and built["image_id"] == f"uc-neuron-2-28-0-{pins_digest(versions)[:8]}-aaaaaaaaaaaa"
    assert built["tags"]["ultracluster:neuron-release"] == "2.28.0"
    assert built["tags"]["ultracluster:neuron-pins"] == pins_digest(versions)
    assert built["tags"]["ultracluster:commit"] == COMMITS[0]
    assert built["tags"]["ultracluster:node-image"] == PARAMETER
    # The component is the rendered node script, kept beside the run's artifacts.
    script = account.s3.get_object(Bucket=BUCKET, Key=f"runs/images/{built['image_id']}/image-setup.sh")
    assert "NEURON_RELEASE=2.28.0" in script["Body"].read().decode()
    # The same commit again (a retry, a second trigger): the image it built, not another.
    assert build(monkeypatch, COMMITS[0]) == dict(built, built=False)

    assert record(built) == {"parameter": PARAMETER, "ami_id": built["ami_id"], "image_id": built["image_id"],
                             "previous_ami_id": older, "version": 2}
    assert account.ssm.get_parameter(Name=PARAMETER)["Parameter"]["Value"] == built["ami_id"]
    with pytest.raises(AirflowSkipException, match="delete_superseded is off"):
        delete_superseded(built, delete=False)
    # The image built for another parameter stays; the one this parameter held before goes.
    assert delete_superseded(built) == {"deleted": ["uc-neuron-older"]}
    assert account.ec2.describe_images(ImageIds=[older])["Images"] == []
    assert account.ec2.describe_images(ImageIds=[foreign, built["ami_id"]])["Images"]

    account.ec2.deregister_image(ImageId=foreign)


def test_a_configuration_pcluster_refuses_fails_without_retries(account, monkeypatch):
    with pytest.raises(AirflowFailException,
                       match="refused the image configuration.*Invalid image 'ami-0000000000000000f'"):
        build(monkeypatch, "d" * 40, parent_image="ami-0000000000000000f")
    with pytest.raises(AirflowFailException, match="node_image_parameter '/elsewhere' must be an SSM parameter name"):
        BuildNodeImageOperator(task_id="b", parameter="/elsewhere", region_name=REGION, image_os="ubuntu2204",
                               artifacts_s3_uri=f"s3://{BUCKET}/runs").execute(context())
    with pytest.raises(AirflowFailException, match="cannot create its build-image cleanup role"):
        build(monkeypatch, "e" * 40, permissions_boundary_arn="arn:aws:iam::123456789012:policy/b")
