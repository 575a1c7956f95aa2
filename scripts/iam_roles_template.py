"""The CloudFormation template that creates ultracluster's roles, generated from the policy files.

    python scripts/iam_roles_template.py          rewrite include/cluster/iam/roles.cfn.json
    python scripts/iam_roles_template.py --check  exit 1 when it disagrees with the policy files

One source for each policy: include/cluster/iam/{airflow-policy,pcluster-role-policy,
pcluster-image-build-policy,node-kms-policy,pcluster-permissions-boundary,image-cleanup-role-policy}.json,
with their ``<placeholders>``. The pcluster role's image-build statements are a managed policy of their own
(a role's inline policies may hold 10,240 characters); the image builds' cleanup role (ParallelCluster's
own, which it would create without a boundary) is the deployment's. Here every placeholder becomes a
stack parameter or a pseudo parameter (``Fn::Sub``), ``arn:aws:`` takes the stack's partition, and a
statement that names the compile cache or the KMS key is kept only when that parameter is set
(docs/operations.md, "Least privilege").
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from generated import write_or_check  # scripts/generated.py

REPO = Path(__file__).resolve().parents[1]
IAM = REPO / "include" / "cluster" / "iam"
OUT = IAM / "roles.cfn.json"
AIRFLOW_ROLE, PCLUSTER_ROLE = "ultracluster-airflow", "ultracluster-pcluster"
BOUNDARY = "ultracluster-pcluster-boundary"
NODE_KMS = "ultracluster-node-kms"  # the nodes' kms:Decrypt, attached by the config (run/node_iam.py)
IMAGE_BUILDS = "ultracluster-pcluster-image-builds"
# On ParallelCluster's path: the pcluster role passes roles of /parallelcluster/ to Lambda.
IMAGE_CLEANUP_ROLE = "ultracluster-image-cleanup"

# Placeholder -> Fn::Sub variable. A prefix placeholder takes its slash along: the parameter holds
# the prefix with its trailing slash, or nothing (the whole bucket).
SUBSTITUTIONS = {
    "<region>": "${AWS::Region}", "<account-id>": "${AWS::AccountId}",
    "<artifacts-bucket>": "${ArtifactsBucket}", "<artifacts-prefix>/": "${ArtifactsPrefix}",
    "<dataset-bucket>": "${DatasetBucket}", "<dataset-key>": "${DatasetKey}",
    "<compile-cache-bucket>": "${CompileCacheBucket}", "<compile-cache-prefix>/": "${CompileCachePrefix}",
    "<kms-key-arn>": "${KmsKeyArn}",
}
# A statement naming one of these is there only when its condition holds.
CONDITIONAL = {"<compile-cache-bucket>": "HasCompileCache", "<kms-key-arn>": "HasKmsKey"}

def _prefix(uri_param: str, default: str, empty: str) -> dict[str, str]:
    """A key prefix parameter: with its trailing slash, or empty (``empty`` says what that means)."""
    return {"Type": "String", "Default": default, "AllowedPattern": "(|[^*?]+/)",
            "Description": f"{uri_param}'s key prefix with its trailing slash; empty: {empty}"}


PARAMETERS = {
    "AirflowTrustedPrincipalArn": {
        "Type": "String", "Default": "",
        "Description": "The IAM principal (role or user ARN) that runs Airflow and assumes ultracluster-airflow; "
                       "empty: the account, whose IAM policies then say who may"},
    "ArtifactsBucket": {"Type": "String", "AllowedPattern": "[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]",
                        "Description": "artifacts_s3_uri's bucket"},
    "ArtifactsPrefix": _prefix("artifacts_s3_uri", "runs/", "all of it"),
    "DatasetBucket": {"Type": "String", "Default": "neuron-s3", "Description": "dataset_s3_uri's bucket"},
    "DatasetKey": {"Type": "String", "Description": "dataset_s3_uri's key (the tar)",
                   "Default": "training_datasets/bert_pretrain_wikicorpus_tokenized_hdf5/"
                              "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128.tar"},
    "CompileCacheBucket": {"Type": "String", "Default": "",
                           "Description": "compile_cache_s3_uri's bucket; empty: no compile cache"},
    "CompileCachePrefix": _prefix("compile_cache_s3_uri", "", "all of it, or no compile cache"),
    "KmsKeyArn": {"Type": "String", "Default": "",
                  "Description": "s3_kms_key_id as a key ARN with SSE-KMS; empty with SSE-S3 (AES256)"},
}


def _placeholders(value: Any) -> set[str]:
    return set(re.findall(r"<[a-z0-9-]+>", json.dumps(value)))


def _sub(value: Any) -> Any:
    """Strings with a placeholder or an ARN become Fn::Sub; lists and objects are walked."""
    if isinstance(value, dict):
        return {key: _sub(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_sub(item) for item in value]
    if isinstance(value, str) and ("<" in value or value.startswith("arn:aws:")):
        text = value.replace("arn:aws:", "arn:${AWS::Partition}:")
        for placeholder, variable in SUBSTITUTIONS.items():
            text = text.replace(placeholder, variable)
        left = re.findall(r"<[a-z0-9-]+>", text)
        if left:
            raise ValueError(f"no stack parameter for {left} in {value!r}")
        return {"Fn::Sub": text}
    return value


def policy_document(path: Path, *, under: str | None = None) -> dict:
    """The file's policy for the template; ``under``: the condition its resource has already."""
    document = json.loads(path.read_text())
    statements = []
    for statement in document["Statement"]:
        conditions = sorted({CONDITIONAL[p] for p in _placeholders(statement) if p in CONDITIONAL} - {under})
        converted: Any = _sub(statement)
        for condition in conditions:
            converted = {"Fn::If": [condition, converted, {"Ref": "AWS::NoValue"}]}
        statements.append(converted)
    return {"Version": document["Version"], "Statement": statements}


def template() -> dict:
    account_root = {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"}
    airflow_principal = {"Fn::If": ["HasAirflowPrincipal", {"Ref": "AirflowTrustedPrincipalArn"}, account_root]}
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": "ultracluster's roles: ultracluster-airflow (what the pipeline calls), "
                       "ultracluster-pcluster (what the pcluster CLI and its stacks need, assumed through the "
                       "pcluster_default connection), the boundary of every role pcluster creates, the cleanup "
                       "role of the node image's builds, and with a customer managed KMS key the nodes' "
                       "kms:Decrypt on it. "
                       f"Generated by scripts/{Path(__file__).name} from include/cluster/iam/*.json: do not edit.",
        "Parameters": PARAMETERS,
        "Conditions": {
            "HasAirflowPrincipal": {"Fn::Not": [{"Fn::Equals": [{"Ref": "AirflowTrustedPrincipalArn"}, ""]}]},
            "HasCompileCache": {"Fn::Not": [{"Fn::Equals": [{"Ref": "CompileCacheBucket"}, ""]}]},
            "HasKmsKey": {"Fn::Not": [{"Fn::Equals": [{"Ref": "KmsKeyArn"}, ""]}]},
        },
        "Resources": {
            "PclusterBoundary": {
                "Type": "AWS::IAM::ManagedPolicy",
                "Properties": {
                    "ManagedPolicyName": BOUNDARY,
                    "Description": "The permissions boundary of every role pcluster creates for a cluster",
                    "PolicyDocument": policy_document(IAM / "pcluster-permissions-boundary.json"),
                },
            },
            "AirflowRole": {
                "Type": "AWS::IAM::Role",
                "Properties": {
                    "RoleName": AIRFLOW_ROLE,
                    "Description": "Airflow's own calls (aws_default): S3, the network stacks, EC2 reads, quotas",
                    "AssumeRolePolicyDocument": {"Version": "2012-10-17", "Statement": [{
                        "Effect": "Allow", "Principal": {"AWS": airflow_principal}, "Action": "sts:AssumeRole"}]},
                    "Policies": [{"PolicyName": AIRFLOW_ROLE,
                                  "PolicyDocument": policy_document(IAM / "airflow-policy.json")}],
                },
            },
            "PclusterRole": {
                "Type": "AWS::IAM::Role",
                "Properties": {
                    "RoleName": PCLUSTER_ROLE,
                    "Description": "The pcluster CLI (pcluster_default) and the cluster stacks it creates",
                    "AssumeRolePolicyDocument": {"Version": "2012-10-17", "Statement": [{
                        "Effect": "Allow", "Principal": {"AWS": {"Fn::GetAtt": ["AirflowRole", "Arn"]}},
                        "Action": "sts:AssumeRole"}]},
                    "Policies": [{"PolicyName": PCLUSTER_ROLE,
                                  "PolicyDocument": policy_document(IAM / "pcluster-role-policy.json")}],
                    "ManagedPolicyArns": [{"Ref": "PclusterImageBuilds"}],
                },
                "DependsOn": "PclusterBoundary",
            },
            "NodeKmsPolicy": {
                "Type": "AWS::IAM::ManagedPolicy",
                "Condition": "HasKmsKey",
                "Properties": {
                    "ManagedPolicyName": NODE_KMS,
                    "Description": "The cluster nodes' kms:Decrypt on the customer managed key, through S3 only",
                    "PolicyDocument": policy_document(IAM / "node-kms-policy.json", under="HasKmsKey"),
                },
            },
            "PclusterImageBuilds": {
                "Type": "AWS::IAM::ManagedPolicy",
                "Properties": {
                    "ManagedPolicyName": IMAGE_BUILDS,
                    "Description": "What pcluster build-image and delete-image need (trn1_build_image's node image)",
                    "PolicyDocument": policy_document(IAM / "pcluster-image-build-policy.json"),
                },
            },
            "ImageCleanupRole": {
                "Type": "AWS::IAM::Role",
                "Properties": {
                    "RoleName": IMAGE_CLEANUP_ROLE,
                    "Path": "/parallelcluster/",
                    "Description": "Build.Iam.CleanupLambdaRole of the node image's builds: ParallelCluster's "
                                   "cleanup function deletes the build stack with it",
                    "AssumeRolePolicyDocument": {"Version": "2012-10-17", "Statement": [{
                        "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
                        "Action": "sts:AssumeRole"}]},
                    "ManagedPolicyArns": [
                        {"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"}],
                    "Policies": [{"PolicyName": "ParallelClusterCleanupInline",
                                  "PolicyDocument": policy_document(IAM / "image-cleanup-role-policy.json")}],
                },
            },
        },
        "Outputs": {
            "AirflowRoleArn": {"Value": {"Fn::GetAtt": ["AirflowRole", "Arn"]}},
            "PclusterRoleArn": {"Value": {"Fn::GetAtt": ["PclusterRole", "Arn"]}},
            "PermissionsBoundaryArn": {"Description": "the profile's permissions_boundary_arn",
                                       "Value": {"Ref": "PclusterBoundary"}},
            "NodeKmsPolicyArn": {"Description": "the profile's node_kms_policy_arn", "Condition": "HasKmsKey",
                                 "Value": {"Ref": "NodeKmsPolicy"}},
            "ImageCleanupRoleArn": {"Description": "the profile's image_cleanup_role_arn",
                                    "Value": {"Fn::GetAtt": ["ImageCleanupRole", "Arn"]}},
        },
    }


def render() -> str:
    return json.dumps(template(), indent=1) + "\n"


def main(argv: list[str]) -> int:
    return write_or_check(OUT, render(), argv, __file__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
