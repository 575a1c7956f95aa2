"""preflight's node image check (operators.image_checks) and trn1_build_image's record and delete steps,
against in-process moto (SSM, EC2) and a scripted pcluster: which image a run gets, what is refused and
why, the parameter written, and an image still in use kept and named."""
from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from tests.fixtures.pcluster.fake_pcluster import FakePcluster
from ultracluster.operators.image_checks import node_image_problems
from ultracluster.operators.node_image_records import DeleteSupersededImagesOperator, RecordNodeImageOperator
from ultracluster.run.neuron_versions import load_versions
from ultracluster.run.node_image import ami_tags

REGION = "us-east-1"
PARAMETER = "/ultracluster/node-image/trn1"
LOG = logging.getLogger("test")


@pytest.fixture
def aws(monkeypatch):
    from moto import mock_aws

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": {"region_name": REGION}}))
    with mock_aws():
        import boto3

        yield SimpleNamespace(ssm=boto3.client("ssm", region_name=REGION), ec2=boto3.client("ec2", region_name=REGION))


def image(aws, **overrides: str) -> str:
    ami = aws.ec2.register_image(Name=f"uc-neuron-{len(overrides)}-{sorted(overrides)}"[:100],
                                 RootDeviceName="/dev/sda1", VirtualizationType="hvm")["ImageId"]
    tags = {**ami_tags(load_versions(), "0" * 40, PARAMETER), **overrides}
    aws.ec2.create_tags(Resources=[ami], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    return ami


def check(plan: dict, install_at_boot: bool = False) -> list[str]:
    return node_image_problems(plan, aws_conn_id="aws_default", parameter=PARAMETER, install_at_boot=install_at_boot,
                               log=LOG)


def test_the_run_gets_the_recorded_image_or_its_own(aws):
    recorded, own = image(aws), image(aws, **{"ultracluster:commit": "1" * 40})
    aws.ssm.put_parameter(Name=PARAMETER, Value=recorded, Type="String", DataType="aws:ec2:image")
    plan = {"region": REGION, "custom_ami": None}
    assert check(plan) == [] and plan == {"region": REGION, "custom_ami": recorded, "install_neuron_at_boot": False}
    plan = {"region": REGION, "custom_ami": own}
    assert check(plan) == [] and plan["custom_ami"] == own


@pytest.mark.parametrize("tag", ["ultracluster:neuron-release", "ultracluster:neuron-pins"])
def test_an_image_of_other_pins_is_refused_even_where_nodes_may_install(aws, tag):
    aws.ssm.put_parameter(Name=PARAMETER, Value=image(aws, **{tag: "0.0.1"}), Type="String")
    for install_at_boot in (False, True):
        [problem] = check({"region": REGION, "custom_ami": None}, install_at_boot)
        assert f"{tag}=0.0.1" in problem and "trigger the trn1_build_image DAG" in problem


def test_no_image_is_refused_unless_the_deployment_installs_at_boot(aws):
    [problem] = check({"region": REGION, "custom_ami": None})
    assert problem.startswith(f"custom_ami: no node image ({PARAMETER} holds none)")
    plan = {"region": REGION, "custom_ami": None}
    assert check(plan, install_at_boot=True) == [] and plan["custom_ami"] is None
    [missing] = check({"region": REGION, "custom_ami": "ami-0123456789abcdef0"}, install_at_boot=True)
    assert "ami-0123456789abcdef0 does not exist" in missing


def test_record_writes_the_parameter_and_says_what_it_held(aws):
    built = {"image_id": "uc-neuron-x", "ami_id": image(aws), "parameter": PARAMETER,
             "tags": ami_tags(load_versions(), "0" * 40, PARAMETER)}
    op = RecordNodeImageOperator(task_id="record_image", image=built, region_name=REGION)
    first = op.execute({})
    assert (first["previous_ami_id"], first["version"]) == (None, 1)
    second = op.execute({})
    assert (second["previous_ami_id"], second["version"]) == (built["ami_id"], 2)
    [written] = aws.ssm.describe_parameters(ParameterFilters=[{"Key": "Name", "Values": [PARAMETER]}])["Parameters"]
    assert written["Description"] == "ultracluster node image uc-neuron-x: Neuron 2.28.0, commit 000000000000"


def test_an_image_instances_still_use_is_kept_and_named(aws, tmp_path, monkeypatch):
    fake = FakePcluster(tmp_path / "pcluster")
    monkeypatch.setenv("AIRFLOW_CONN_PCLUSTER_DEFAULT", fake.connection_json())
    kept = image(aws)
    aws.ssm.put_parameter(Name=PARAMETER, Value=kept, Type="String")
    summaries = {"images": [{"imageId": i, "imageBuildStatus": "BUILD_COMPLETE", "region": REGION, "version": "3.16.1"}
                            for i in ("uc-old", "uc-new")]}
    fake.respond_text("list-images", json.dumps(summaries))
    old = {"imageId": "uc-old", "imageBuildStatus": "BUILD_COMPLETE", "ec2AmiInfo": {
        "amiId": "ami-0000000000000000a", "tags": [{"key": "ultracluster:node-image", "value": PARAMETER}]}}
    fake.respond_text("describe-image", json.dumps(old))
    refusal = ("Bad Request: Unable to delete image and stack: Image uc-old is used by instances "
               "['i-0123456789abcdef0'].")
    fake.respond_text("delete-image", json.dumps({"message": refusal}), rc=1)
    op = DeleteSupersededImagesOperator(task_id="delete_superseded", delete=True, region_name=REGION,
                                        image={"image_id": "uc-new", "parameter": PARAMETER})
    with pytest.raises(AirflowFailException) as failed:
        op.execute({})
    assert str(failed.value).startswith(f"deleted nothing; pcluster delete-image refused uc-old: {refusal}")
    assert fake.calls()[1:] == [["describe-image", "--image-id", "uc-old", "--region", REGION],
                                ["delete-image", "--image-id", "uc-old", "--region", REGION]]  # the new one untouched
