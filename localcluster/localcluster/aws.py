"""The AWS side of a cluster, against the moto server named by AWS_ENDPOINT_URL.

What pcluster would create in the account, reduced to what moto accepts: a CloudFormation stack
named after the cluster (tagged like pcluster's, holding the head-node security group when the
subnet is known to moto, and the cluster's log group), the head node's CloudWatch alarms
(monitoring.py), and the cluster config in a pcluster-like S3 bucket.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from . import monitoring
from .shapes import PCLUSTER_VERSION, iso_time

CONFIG_NAME = "cluster-config.yaml"
HOME_PARAMETER = "LocalUltraClusterHome"
DEFAULT_REGION = "us-east-1"
_FAST_FAIL = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=30)


class AwsUnavailable(Exception):
    """The moto endpoint did not answer."""


class LogGroupExists(Exception):
    """The cluster's log group name is taken (retained by an earlier cluster of the same name)."""


def region_from_env() -> str:
    return os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or DEFAULT_REGION


DEFAULT_ENDPOINT = "http://127.0.0.1:5055"


class NotLoopback(Exception):
    """The endpoint would send traffic off this machine."""


def endpoint_url(url: str | None = None) -> str:
    """moto's URL; the local UltraCluster never talks to anything off loopback (127.0.0.0/8)."""
    url = url or os.environ.get("AWS_ENDPOINT_URL") or DEFAULT_ENDPOINT
    if not (urlparse(url).hostname or "").startswith("127."):
        raise NotLoopback(f"AWS_ENDPOINT_URL={url} is not a loopback address: the local UltraCluster only "
                          "talks to a moto server on 127.0.0.0/8")
    return url


# moto takes any credentials. The local ones are fakes a log scan recognises: an access key id's
# shape, and the "ucfake" marker in both (tests/log_scan.py; docs/local-cluster.md).
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIAUCFAKELOCAL00000",
                    "AWS_SECRET_ACCESS_KEY": "ucfakeSecretLocalUltraCluster/0000000000"}

# Any AMI id does for moto; instances record node lives, they run nothing.
LOCAL_AMI = "ami-0ac1057e1a5e1a5e1"
LIVE_STATES = ["pending", "running", "stopping", "stopped"]


class Aws:
    def __init__(self, region: str, endpoint: str | None = None) -> None:
        self.region = region
        self.endpoint = endpoint_url(endpoint)
        # Slurm's power programs run with a bare environment: moto takes any credentials.
        self._session = boto3.session.Session(
            region_name=region,
            aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID") or FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY") or FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def client(self, service: str) -> Any:
        return self._session.client(service, endpoint_url=self.endpoint, config=_FAST_FAIL)

    def run_instance(self, cluster_name: str, node_type: str, instance_type: str, hostname: str,
                     queue: str | None = None, resource: str | None = None) -> tuple[str, str]:
        """An EC2 instance tagged as pcluster tags a node: (instance id, launch time ISO-8601)."""
        tags = {"Name": hostname, "parallelcluster:cluster-name": cluster_name, "parallelcluster:node-type": node_type}
        if queue:
            tags.update({"parallelcluster:queue-name": queue, "parallelcluster:compute-resource-name": resource or ""})
        launched = self.client("ec2").run_instances(
            ImageId=LOCAL_AMI, InstanceType=instance_type, MinCount=1, MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance",
                                "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}])["Instances"][0]
        return launched["InstanceId"], iso_time(launched["LaunchTime"])

    def live_cluster_instances(self, cluster_name: str) -> list[str]:
        pages = self.client("ec2").get_paginator("describe_instances").paginate(Filters=[
            {"Name": "tag:parallelcluster:cluster-name", "Values": [cluster_name]},
            {"Name": "instance-state-name", "Values": LIVE_STATES}])
        return [i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def terminate_instances(self, instance_ids: list[str]) -> None:
        if instance_ids:
            self.client("ec2").terminate_instances(InstanceIds=list(instance_ids))

    # --- lookups used by validation -------------------------------------------------------
    def key_pair_exists(self, key_name: str) -> bool:
        try:
            self.client("ec2").describe_key_pairs(KeyNames=[key_name])
            return True
        except ClientError as error:
            if error.response["Error"]["Code"] == "InvalidKeyPair.NotFound":
                return False
            raise

    def subnet_vpc(self, subnet_id: str) -> str | None:
        try:
            subnets = self.client("ec2").describe_subnets(SubnetIds=[subnet_id])["Subnets"]
        except ClientError as error:
            if error.response["Error"]["Code"] in ("InvalidSubnetID.NotFound", "InvalidSubnetID.Malformed"):
                return None
            raise
        return subnets[0]["VpcId"] if subnets else None

    def stack_exists(self, name: str) -> bool:
        try:
            stacks = self.client("cloudformation").describe_stacks(StackName=name)["Stacks"]
        except ClientError as error:
            if "does not exist" in error.response["Error"].get("Message", ""):
                return False
            raise
        return any(s["StackStatus"] != "DELETE_COMPLETE" for s in stacks)

    # --- the cluster's resources ----------------------------------------------------------
    def account_id(self) -> str:
        return self.client("sts").get_caller_identity()["Account"]

    def pcluster_bucket(self) -> str:
        """Same naming scheme as pcluster: parallelcluster-<hash>-v1-do-not-delete."""
        suffix = hashlib.sha256((self.account_id() + self.region).encode()).hexdigest()[:16]
        return f"parallelcluster-{suffix}-v1-do-not-delete"

    def ensure_bucket(self, bucket: str) -> None:
        s3 = self.client("s3")
        try:
            s3.head_bucket(Bucket=bucket)
        except ClientError:
            if self.region == "us-east-1":
                s3.create_bucket(Bucket=bucket)
            else:
                s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": self.region})

    def upload_config(self, cluster_name: str, config_text: str) -> tuple[str, str]:
        bucket = self.pcluster_bucket()
        self.ensure_bucket(bucket)
        artifact_dir = f"parallelcluster/{PCLUSTER_VERSION}/clusters/{cluster_name}-{secrets.token_hex(8)}"
        key = f"{artifact_dir}/configs/{CONFIG_NAME}"
        self.client("s3").put_object(Bucket=bucket, Key=key, Body=config_text.encode())
        return bucket, key

    def presigned_config_url(self, bucket: str, key: str) -> str:
        return self.client("s3").generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=3600)

    def delete_config(self, bucket: str, key: str) -> None:
        artifact_dir = key.rsplit("/configs/", 1)[0]
        s3 = self.client("s3")
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=artifact_dir + "/").get("Contents", [])
        for item in listed:
            s3.delete_object(Bucket=bucket, Key=item["Key"])

    def create_stack(self, cluster_name: str, vpc_id: str | None, tags: list[tuple[str, str]],
                     bucket: str, config_key: str, home: Path, cluster_user: str,
                     log_group: tuple[int, str] | None) -> str:
        """``log_group``: (retention days, DeletionPolicy), or None when CloudWatch logging is off."""
        template = _stack_template(cluster_name, vpc_id)
        if log_group is not None:
            resource = monitoring.log_group_resource(cluster_name, *log_group)
            name = resource["Properties"]["LogGroupName"]
            # AWS fails the stack on it later; moto's create_stack would raise and leave the stack stuck.
            if self.client("logs").describe_log_groups(logGroupNamePrefix=name).get("logGroups"):
                raise LogGroupExists(name)
            template["Resources"]["CloudWatchLogGroup"] = resource
        parameters = {
            "Scheduler": "slurm", "ResourcesS3Bucket": bucket,
            "ArtifactS3RootDirectory": config_key.rsplit("/configs/", 1)[0],
            "ConfigVersion": "", "ClusterUser": cluster_user,
            # Not in pcluster's stacks: lets `local-ultracluster reap` find stacks whose home lost them.
            HOME_PARAMETER: str(home),
        }
        response = self.client("cloudformation").create_stack(
            StackName=cluster_name, TemplateBody=json.dumps(template),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
            Tags=[{"Key": k, "Value": v} for k, v in tags],
        )
        return response["StackId"]

    def put_head_node_alarms(self, cluster_name: str, head_instance_id: str, with_heartbeat: bool) -> str:
        return monitoring.put_head_node_alarms(self.client("cloudwatch"), cluster_name, head_instance_id,
                                               with_heartbeat, self.region, self.account_id())

    def delete_head_node_alarms(self, cluster_name: str) -> None:
        monitoring.delete_head_node_alarms(self.client("cloudwatch"), cluster_name)

    def stacks_of_home(self, home: Path) -> list[str]:
        """Names of live cluster stacks created from this home."""
        names = []
        paginator = self.client("cloudformation").get_paginator("describe_stacks")
        for page in paginator.paginate():
            for stack in page["Stacks"]:
                parameters = {p["ParameterKey"]: p.get("ParameterValue") for p in stack.get("Parameters", [])}
                if stack["StackStatus"] != "DELETE_COMPLETE" and parameters.get(HOME_PARAMETER) == str(home):
                    names.append(stack["StackName"])
        return names

    def delete_stack(self, cluster_name: str) -> None:
        """The stack and what it holds: the head node's alarms too (put outside moto's CloudFormation)."""
        self.delete_head_node_alarms(cluster_name)
        try:
            self.client("cloudformation").delete_stack(StackName=cluster_name)
        except ClientError as error:
            if "does not exist" not in error.response["Error"].get("Message", ""):
                raise


def _stack_template(cluster_name: str, vpc_id: str | None) -> dict[str, Any]:
    parameter_names = ("Scheduler", "ResourcesS3Bucket", "ArtifactS3RootDirectory", "ConfigVersion", "ClusterUser",
                       HOME_PARAMETER)
    parameters = {name: {"Type": "String", "Default": ""} for name in parameter_names}
    if vpc_id:
        resources: dict[str, Any] = {"HeadNodeSecurityGroup": {
            "Type": "AWS::EC2::SecurityGroup",
            "Properties": {"GroupDescription": f"Enable access to the head node of {cluster_name}",
                           "VpcId": vpc_id},
        }}
    else:
        # The subnet is not in moto (config written for real AWS): keep the stack resource trivial.
        resources = {"ClusterWaitConditionHandle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}
    return {"AWSTemplateFormatVersion": "2010-09-09", "Description": f"AWS ParallelCluster stack {cluster_name}",
            "Parameters": parameters, "Resources": resources}
