"""The AWS side of a cluster, against the moto server named by AWS_ENDPOINT_URL.

What pcluster would create in the account, reduced to what moto accepts: a CloudFormation stack
named after the cluster (tagged like pcluster's, holding the head-node security group when the
subnet is known to moto), and the cluster config in a pcluster-like S3 bucket.
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

from .shapes import PCLUSTER_VERSION

CONFIG_NAME = "cluster-config.yaml"
HOME_PARAMETER = "LocalUltraClusterHome"
DEFAULT_REGION = "us-east-1"
_FAST_FAIL = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=30)


class AwsUnavailable(Exception):
    """The moto endpoint did not answer."""


def region_from_env() -> str:
    return os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or DEFAULT_REGION


DEFAULT_ENDPOINT = "http://127.0.0.1:5055"


class NotLoopback(Exception):
    """The endpoint would send traffic off this machine."""


def endpoint_url() -> str:
    """moto's URL; the local UltraCluster never talks to anything off loopback (127.0.0.0/8)."""
    url = os.environ.get("AWS_ENDPOINT_URL") or DEFAULT_ENDPOINT
    if not (urlparse(url).hostname or "").startswith("127."):
        raise NotLoopback(f"AWS_ENDPOINT_URL={url} is not a loopback address: the local UltraCluster only "
                          "talks to a moto server on 127.0.0.0/8")
    return url


class Aws:
    def __init__(self, region: str) -> None:
        self.region = region
        self._session = boto3.session.Session(region_name=region)

    def client(self, service: str) -> Any:
        return self._session.client(service, endpoint_url=endpoint_url(), config=_FAST_FAIL)

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
                     bucket: str, config_key: str, home: Path) -> str:
        template = _stack_template(cluster_name, vpc_id)
        parameters = {
            "Scheduler": "slurm", "ResourcesS3Bucket": bucket,
            "ArtifactS3RootDirectory": config_key.rsplit("/configs/", 1)[0],
            "ConfigVersion": "", "ClusterUser": os.environ.get("LOCAL_UC_SSH_USER", "ultracluster"),
            # Not in pcluster's stacks: lets `local-ultracluster reap` find stacks whose home lost them.
            HOME_PARAMETER: str(home),
        }
        response = self.client("cloudformation").create_stack(
            StackName=cluster_name, TemplateBody=json.dumps(template),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
            Tags=[{"Key": k, "Value": v} for k, v in tags],
        )
        return response["StackId"]

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
