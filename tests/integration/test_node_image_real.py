"""The node image against the real ParallelCluster (aws-parallelcluster 3.16.1 in .venvs/pcluster) and a
moto server, set up as for the cluster's real dry run (test_pcluster_real_schema.py):

- the image configuration trn1_build_image renders (include/cluster/image-config.yaml plus what each
  build adds, ``run.node_image.image_config``) passes `pcluster build-image --dryrun true`, with and
  without the roles ParallelCluster's PermissionsBoundary mode needs;
- the production cluster config with the node image on its training queue passes `pcluster
  create-cluster --dryrun true`, the image tagged as trn1_build_image's are.
"""
from __future__ import annotations

import json

import boto3
import pytest
import yaml

from tests.integration.test_pcluster_real_schema import (  # noqa: F401 - fixtures
    MOTO_GAPS,
    moto_account,
    moto_config,
    pcluster_python,
    real_hook,
    real_pcluster,
)
from ultracluster.parsers.pcluster import DRYRUN_SUCCEEDED
from ultracluster.run.neuron_versions import load_versions, render_on_node_configured
from ultracluster.run.node_image import ami_tags, image_config, image_id_for
from ultracluster.run.profiles import include_dir

pytestmark = pytest.mark.localcluster  # a moto server, and the real pcluster
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PARAMETER = "/ultracluster/node-image/trn1"


def ec2_of(moto_account: dict):
    return boto3.client("ec2", endpoint_url=moto_account["endpoint"], region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def parallelcluster_ami(moto_account: dict) -> str:
    """The 'ParallelCluster AMI' moto_account made (pcluster looks it up by name)."""
    images = ec2_of(moto_account).describe_images(
        Owners=["self"], Filters=[{"Name": "name", "Values": ["aws-parallelcluster-3.16.1-ubuntu-2204-lts-hvm-*"]}])
    return images["Images"][0]["ImageId"]


def rendered_image_config(moto_account: dict, **roles: str) -> str:
    s3 = boto3.client("s3", endpoint_url=moto_account["endpoint"], region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    versions = load_versions()
    image_id = image_id_for(versions, COMMIT)
    key = f"runs/images/{image_id}/image-setup.sh"
    s3.put_object(Bucket="ultracluster-artifacts", Key=key, Body=render_on_node_configured().encode())
    base = yaml.safe_load((include_dir() / "cluster" / "image-config.yaml").read_text())
    config = image_config(base, image_id=image_id, region="us-east-1", parent_image=parallelcluster_ami(moto_account),
                          script_uri=f"s3://ultracluster-artifacts/{key}", tags=ami_tags(versions, COMMIT, PARAMETER),
                          **roles)
    return yaml.safe_dump(config, sort_keys=False)


CLEANUP_ROLE = "arn:aws:iam::{account}:role/parallelcluster/ultracluster-image-cleanup"


# Always with a cleanup role: without one, pcluster creates its own before the dry run and attaches
# AWSLambdaBasicExecutionRole, an AWS managed policy moto does not have.
@pytest.mark.parametrize("roles", [{"cleanup_role": CLEANUP_ROLE}, {
    "permissions_boundary": "arn:aws:iam::{account}:policy/ultracluster-pcluster-boundary",
    "cleanup_role": CLEANUP_ROLE}], ids=["cleanup-role", "permissions-boundary"])
def test_real_build_image_dryrun_accepts_the_rendered_image_config(real_hook, moto_account, tmp_path, roles):
    roles = {k: v.format(account=moto_account["account"]) for k, v in roles.items()}
    if roles:  # pcluster's validators read both (iam:GetPolicy, iam:GetRole)
        iam = boto3.client("iam", endpoint_url=moto_account["endpoint"], region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        try:
            iam.create_policy(PolicyName="ultracluster-pcluster-boundary", PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}))
            iam.create_role(RoleName="ultracluster-image-cleanup", Path="/parallelcluster/",
                            AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [{
                                "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
                                "Action": "sts:AssumeRole"}]}))
        except iam.exceptions.EntityAlreadyExistsException:
            pass
    path = tmp_path / "image-config.yaml"
    path.write_text(rendered_image_config(moto_account, **roles))
    result = real_hook.build_image("uc-neuron-dryrun", str(path), dryrun=True)
    assert result["message"] == DRYRUN_SUCCEEDED
    assert all(m["level"] in ("INFO", "WARNING") for m in result["validationMessages"]), result


def test_real_dryrun_accepts_the_node_image_on_the_training_queue(real_hook, moto_account, tmp_path):
    ec2 = ec2_of(moto_account)
    [instance] = ec2.run_instances(ImageId=parallelcluster_ami(moto_account), MinCount=1, MaxCount=1)["Instances"]
    ami = ec2.create_image(InstanceId=instance["InstanceId"], Name="uc-neuron-real-dryrun 2026-12-01")["ImageId"]
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    tags = {**ami_tags(load_versions(), COMMIT, PARAMETER), "parallelcluster:version": "3.16.1",
            "parallelcluster:os": "ubuntu2204", "parallelcluster:build_status": "available",
            "parallelcluster:image_id": "uc-neuron-real-dryrun"}
    ec2.create_tags(Resources=[ami], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    try:
        path = tmp_path / "cluster-config.yaml"
        text = moto_config(moto_account, custom_ami=ami)
        assert yaml.safe_load(text)["Scheduling"]["SlurmQueues"][0]["Image"] == {"CustomAmi": ami}
        path.write_text(text)
        result = real_hook.create_cluster("uc-real-dryrun", str(path), suppress_validators=MOTO_GAPS, dryrun=True)
        assert result["message"] == DRYRUN_SUCCEEDED
        assert all(m["level"] in ("INFO", "WARNING") for m in result["validationMessages"]), result
    finally:
        ec2.deregister_image(ImageId=ami)


def test_the_image_config_names_nothing_a_build_adds():
    base = yaml.safe_load((include_dir() / "cluster" / "image-config.yaml").read_text())
    assert base["Build"]["InstanceType"] == "trn1.2xlarge" and base["Build"]["UpdateOsPackages"]["Enabled"] is False
    assert not {"ParentImage", "Components", "Iam"} & set(base["Build"]) and not {"Name", "Tags"} & set(base["Image"])
