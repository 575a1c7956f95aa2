"""The node image's core (run.node_image), its states and waiters, its pcluster parses, the image wait
(triggers.image, against a scripted pcluster) and build_image's decisions on what it finds."""
from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from tests.fixtures.pcluster.fake_pcluster import FIXTURES, FakePcluster
from ultracluster.operators.node_image import BuildNodeImageOperator
from ultracluster.parsers.pcluster import (
    ImageAlreadyExistsError,
    ImageNotFoundError,
    image_ami,
    image_failure,
    image_status,
    image_tags,
    parse_cli_result,
    public_image_description,
)
from ultracluster.run import node_image
from ultracluster.run.neuron_versions import load_versions, pins_digest
from ultracluster.run.states import FAILED, GONE, PENDING, READY, image_verdict
from ultracluster.triggers.image import ImageStatusTrigger
from ultracluster.waiters import FAILURE, RETRY, SUCCESS, evaluate, load_waiter

VERSIONS = load_versions()
COMMIT = "a" * 40
PARAMETER = "/ultracluster/node-image/trn1"
IMAGE_ID = "uc-neuron-2-28-0-e333dec3-aaaaaaaaaaaa"
CONN_ID = "pcluster_image_unit"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


# --- the core ------------------------------------------------------------------------------------

def test_one_image_per_release_pins_and_commit():
    image_id = node_image.image_id_for(VERSIONS, COMMIT)
    assert image_id == f"uc-neuron-2-28-0-{pins_digest(VERSIONS)[:8]}-aaaaaaaaaaaa"
    assert node_image.image_id_for(VERSIONS, "b" * 40) != image_id
    assert node_image.image_id_for({**VERSIONS, "EFA_INSTALLER_VERSION": "1.99.0"}, COMMIT) != image_id
    assert node_image.ami_tags(VERSIONS, COMMIT, PARAMETER) == {
        "ultracluster:neuron-release": "2.28.0", "ultracluster:neuron-pins": pins_digest(VERSIONS),
        "ultracluster:commit": COMMIT, "ultracluster:node-image": PARAMETER}


def test_the_image_config_gets_what_each_build_adds():
    base = {"Build": {"InstanceType": "trn1.2xlarge"}, "Image": {"RootVolume": {"Size": 100}}}
    config = node_image.image_config(base, image_id=IMAGE_ID, region="us-east-1", parent_image="ami-0123456789abcdef0",
                                     script_uri="s3://b/runs/images/x/image-setup.sh", tags={"k": "v"})
    assert config == {"Build": {"InstanceType": "trn1.2xlarge", "ParentImage": "ami-0123456789abcdef0",
                                "Components": [{"Type": "script", "Value": "s3://b/runs/images/x/image-setup.sh"}]},
                      "Image": {"RootVolume": {"Size": 100}, "Name": IMAGE_ID, "Tags": [{"Key": "k", "Value": "v"}]},
                      "Region": "us-east-1"}
    assert base == {"Build": {"InstanceType": "trn1.2xlarge"}, "Image": {"RootVolume": {"Size": 100}}}  # untouched
    roles = node_image.image_config(base, image_id=IMAGE_ID, region="us-east-1", parent_image="ami-1",
                                    script_uri="s3://b/k", tags={}, permissions_boundary="arn:b", cleanup_role="arn:c")
    assert roles["Build"]["Iam"] == {"PermissionsBoundary": "arn:b", "CleanupLambdaRole": "arn:c"}
    with pytest.raises(node_image.NodeImageError, match="cannot create its build-image cleanup role"):
        node_image.image_config(base, image_id=IMAGE_ID, region="r", parent_image="ami-1", script_uri="s3://b/k",
                                tags={}, permissions_boundary="arn:b")
    with pytest.raises(node_image.NodeImageError, match="must leave Build.ParentImage"):
        node_image.image_config({"Build": {"ParentImage": "ami-1"}}, image_id=IMAGE_ID, region="r",
                                parent_image="ami-2", script_uri="s3://b/k", tags={})


def test_what_preflight_accepts_and_refuses():
    tags = node_image.ami_tags(VERSIONS, COMMIT, PARAMETER)
    assert node_image.image_problems("ami-1", tags, VERSIONS, "custom_ami") == []
    older = {**tags, "ultracluster:neuron-release": "2.27.1"}
    [stale] = node_image.image_problems("ami-1", older, VERSIONS, "custom_ami")
    assert stale.startswith("custom_ami: image ami-1 holds ultracluster:neuron-release=2.27.1, "
                            "ultracluster:neuron-pins=")
    assert "trigger the trn1_build_image DAG" in stale
    [untagged] = node_image.image_problems("ami-1", {}, VERSIONS, "custom_ami")
    assert "ultracluster:neuron-release=none" in untagged
    [missing] = node_image.image_problems("ami-1", None, VERSIONS, "custom_ami")
    assert "does not exist" in missing


def test_superseded_images_are_those_of_the_same_parameter():
    images = [{"imageId": "old", "tags": {"ultracluster:node-image": PARAMETER}},
              {"imageId": "new", "tags": {"ultracluster:node-image": PARAMETER}},
              {"imageId": "other", "tags": {"ultracluster:node-image": "/ultracluster/elsewhere"}},
              {"imageId": "foreign", "tags": {}}]
    assert node_image.superseded(images, "new", PARAMETER) == ["old"]


@pytest.mark.parametrize("name, ok", [("/ultracluster/node-image/trn1", True), ("/ultracluster/x", True),
                                      ("/other/x", False), ("ultracluster/x", False), ("/ultracluster/", False)])
def test_the_parameter_lies_where_the_airflow_role_may_write(name, ok):
    if ok:
        assert node_image.check_parameter(name) == name
    else:
        with pytest.raises(node_image.NodeImageError, match="under /ultracluster/"):
            node_image.check_parameter(name)


def test_the_commit_comes_from_the_environment_else_git(tmp_path):
    assert node_image.repository_commit({"ULTRACLUSTER_COMMIT": "ABCDEF0123"}) == "abcdef0123"
    with pytest.raises(node_image.NodeImageError, match="not a git commit id"):
        node_image.repository_commit({"ULTRACLUSTER_COMMIT": "main"})
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert node_image.repository_commit({}) == head  # this checkout's
    with pytest.raises(node_image.NodeImageError, match="set ULTRACLUSTER_COMMIT"):
        node_image.repository_commit({}, repo=tmp_path)  # no .git there


# --- states, waiters, parses -----------------------------------------------------------------------

@pytest.mark.parametrize("status, verdict, build, delete", [
    ("BUILD_IN_PROGRESS", PENDING, RETRY, RETRY), ("BUILD_COMPLETE", READY, SUCCESS, RETRY),
    ("BUILD_FAILED", FAILED, FAILURE, RETRY), ("DELETE_IN_PROGRESS", GONE, FAILURE, RETRY),
    ("DELETE_FAILED", FAILED, FAILURE, FAILURE), ("DELETE_COMPLETE", GONE, FAILURE, SUCCESS),
])
def test_image_states_and_waiters(status, verdict, build, delete):
    assert image_verdict(status) == verdict
    assert evaluate(load_waiter("pcluster", "ImageBuildComplete"), {"imageBuildStatus": status}) == build
    assert evaluate(load_waiter("pcluster", "ImageDeleteComplete"), {"imageBuildStatus": status}) == delete


def test_image_errors_are_typed_and_descriptions_parsed():
    not_found = json.dumps(fixture("error_describe_image_not_found"))
    with pytest.raises(ImageNotFoundError):
        parse_cli_result(1, not_found, "")
    for message in ("ParallelCluster image uc-x already exists.", "ParallelCluster build infrastructure for image "
                    "uc-x or a CloudFormation Stack with the same name already exists."):
        with pytest.raises(ImageAlreadyExistsError):
            parse_cli_result(1, json.dumps({"message": message}), "")
    assert evaluate(load_waiter("pcluster", "ImageDeleteComplete"), error=ImageNotFoundError("gone")) == SUCCESS
    complete, failed = fixture("describe_image_build_complete"), fixture("describe_image_build_failed")
    assert (image_status(complete), image_ami(complete)) == ("BUILD_COMPLETE", "ami-241039c7b2df296cf")
    assert image_tags(complete)["ultracluster:neuron-release"] == "2.28.0" and image_tags(failed) == {}
    assert image_status({"image": {"imageBuildStatus": "BUILD_IN_PROGRESS"}}) == "BUILD_IN_PROGRESS"
    assert "aws-neuronx-tools 2.99.0.0" in image_failure(failed)
    assert "SECRETSIGNATURE" not in json.dumps(public_image_description(complete))


# --- the image wait ------------------------------------------------------------------------------

@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakePcluster:
    fake = FakePcluster(tmp_path / "pcluster")
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", fake.connection_json())
    return fake


def run_trigger(waiter: str, *image_ids: str) -> dict:
    trigger = ImageStatusTrigger(image_ids=list(image_ids), waiter_name=waiter, pcluster_conn_id=CONN_ID,
                                 poll_interval=0, max_attempts=5)
    classpath, kwargs = trigger.serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs and classpath == "ultracluster.triggers.image.ImageStatusTrigger"

    async def first():
        async for event in ImageStatusTrigger(**kwargs).run():
            return event.payload
    return asyncio.run(first())


def test_a_build_waited_for_until_complete(fake):
    fake.respond("describe-image", "describe_image_build_in_progress.json", "describe_image_build_complete.json")
    event = run_trigger("ImageBuildComplete", IMAGE_ID)
    assert (event["status"], event["reason"]) == ("success", "complete")
    assert image_ami(event["images"][IMAGE_ID]) == "ami-241039c7b2df296cf"
    assert "SECRETSIGNATURE" not in json.dumps(event)
    assert fake.verbs() == ["describe-image", "describe-image"]


def test_a_failed_build_is_failed_with_image_builders_reason(fake):
    fake.respond("describe-image", "describe_image_build_in_progress.json", "describe_image_build_failed.json")
    event = run_trigger("ImageBuildComplete", IMAGE_ID)
    assert (event["status"], event["reason"]) == ("failed", "image_failed")
    assert "is not in the apt repositories" in event["message"]


def test_an_image_gone_while_building_and_a_deletion_done(fake):
    fake.respond("describe-image", ("error_describe_image_not_found.json", 1))
    assert run_trigger("ImageBuildComplete", IMAGE_ID)["reason"] == "image_gone"
    event = run_trigger("ImageDeleteComplete", "uc-a", "uc-b")
    assert (event["reason"], sorted(event["images"])) == ("complete", ["uc-a", "uc-b"])
    fake.respond_text("describe-image", "Traceback: boom", rc=1)
    assert run_trigger("ImageDeleteComplete", "uc-a")["reason"] == "api_error"  # 5 failures in a row


# --- build_image's decisions -------------------------------------------------------------------------

def operator() -> BuildNodeImageOperator:
    return BuildNodeImageOperator(task_id="build_image", parameter=PARAMETER, region_name="us-east-1",
                                  image_os="ubuntu2204", artifacts_s3_uri="s3://b/runs", pcluster_conn_id=CONN_ID,
                                  poll_interval=0)


@pytest.fixture
def this_commit(monkeypatch):
    monkeypatch.setenv("ULTRACLUSTER_COMMIT", COMMIT)
    assert node_image.image_id_for(VERSIONS, COMMIT) == IMAGE_ID, "the fixtures' image id: update them with the pins"


def test_an_image_of_this_commit_is_returned_waited_for_or_named(fake, this_commit):
    fake.respond("describe-image", "describe_image_build_complete.json")
    found = operator().execute({})
    assert (found["built"], found["ami_id"], found["image_id"]) == (False, "ami-241039c7b2df296cf", IMAGE_ID)
    assert "build-image" not in fake.verbs()
    fake.respond("describe-image", "describe_image_build_in_progress.json")
    with pytest.raises(TaskDeferred) as deferred:
        operator().execute({})
    assert deferred.value.trigger.serialize()[1]["waiter_name"] == "ImageBuildComplete"
    fake.respond("describe-image", "describe_image_build_failed.json")
    with pytest.raises(AirflowFailException, match=f"failed to build: .*pcluster delete-image -i {IMAGE_ID}"):
        operator().execute({})


def test_the_wait_s_end_decides(fake, this_commit):
    complete = fixture("describe_image_build_complete")
    event = {"status": "success", "reason": "complete", "message": "", "image_ids": [IMAGE_ID],
             "images": {IMAGE_ID: complete}}
    assert operator().execute_complete({}, event)["built"] is True
    stale = dict(complete, ec2AmiInfo=dict(complete["ec2AmiInfo"], tags=[]))
    with pytest.raises(AirflowFailException, match="ultracluster:neuron-release=none"):
        operator().execute_complete({}, dict(event, images={IMAGE_ID: stale}))
    with pytest.raises(AirflowFailException, match="failed to build"):
        operator().execute_complete({}, {"status": "failed", "reason": "image_failed", "message": "boom",
                                         "image_ids": [IMAGE_ID], "images": {}})
    with pytest.raises(RuntimeError, match="timeout"):  # a retry reattaches to the build
        operator().execute_complete({}, {"status": "error", "reason": "timeout", "message": "slow",
                                         "image_ids": [IMAGE_ID], "images": {}})
