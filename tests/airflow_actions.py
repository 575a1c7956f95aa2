"""Why the Airflow role holds each action that the local run under enforcement does not call
(docs/operations.md, "Least privilege"; tests/e2e/test_pipeline.py compares).

Every (Sid, action) of include/cluster/iam/airflow-policy.json is either needed by a recorded call of
that run (``tests.iam_policy.exercised``), or has a reason here:

- ``CLOUDFORMATION``: the EC2 actions CloudFormation's handlers call with the role's own credentials
  while create_vpc and delete_vpc create and delete include/cluster/vpc.yaml's resources (no service
  role: the caller's). Derived, not listed: the create and delete permissions of each resource type's
  provider schema (``tests.pcluster_actions.required_actions``, less its reviewed UNUSED rows). moto's
  CloudFormation makes its resources in-process, so no run of the local cluster shows them.
- ``NOT_IN_A_LOCAL_RUN``: a reviewed table, each row with its reason: what only production, a failure
  path or another DAG calls, and what AWS authorizes without a call of its own.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from tests.pcluster_actions import required_actions

VPC_TEMPLATE = Path(__file__).resolve().parents[1] / "include" / "cluster" / "vpc.yaml"
EC2_SIDS = ("EC2DescribeCallsSupportNoResourceLevelPermissionsSoResourceIsStar",
            "EC2ResourcesOfVpcYamlOnlyWhenCloudFormationCreatesOrDeletesThem")
_ARTIFACTS = "S3ArtifactsConfigResultsLogsCheckpointsReportsSweepIndex"
_KMS = "KmsForSseKmsOnlyDropWithAES256"
_CFN = "CloudFormationNetworkStacksOfRunsAndSweeps"

NOT_IN_A_LOCAL_RUN: dict[tuple[str, str], str] = {
    ("S3DatasetBucketHeadForPreflight", "s3:ListBucket"):
        "preflight's HeadBucket, only after the dataset's HEAD failed: a missing bucket is told from a missing "
        "key (operators/account_checks.py; tests/integration/test_preflight.py)",
    (_ARTIFACTS, "s3:PutObjectTagging"):
        "no call of its own: S3 authorizes an upload's Tagging header with it (render_config tags the run's "
        "scratch object for the reaper); moto does not check it",
    (_ARTIFACTS, "s3:GetObjectTagging"):
        "the ultracluster_reaper DAG reads the scratch objects' tags (reaper/reaper.py, find_scratch; "
        "tests/e2e/test_reaper_e2e.py)",
    (_KMS, "kms:GenerateDataKey"):
        "SSE-KMS only (s3_encryption aws:kms): S3 asks KMS as the uploader; the local profile writes AES256",
    (_KMS, "kms:Decrypt"):
        "SSE-KMS only: S3 asks KMS as the reader; the local profile writes AES256",
    (_CFN, "cloudformation:DescribeStackEvents"):
        "only after a stack failed to create or delete: the failed resources' reasons (hooks/network_stack.py, "
        "failed_resources; tests/integration/test_pcluster_operators.py, the fault matrix's CREATE_FAILED)",
    (_CFN, "cloudformation:TagResource"):
        "no call of its own: CloudFormation authorizes CreateStack's Tags (create_vpc's ownership tags) with "
        "it; moto does not check it",
    ("StsAssumeThePclusterRoleThePclusterDefaultConnectionRunsAs", "sts:AssumeRole"):
        "production only: the pcluster CLI assumes ultracluster-pcluster through the pcluster_default "
        "connection's AWS config profile; the local stand-in runs with the local cluster's own keys",
    ("SsmTheNodeImageParameterPreflightReadsAndTrn1BuildImageWrites", "ssm:PutParameter"):
        "the trn1_build_image DAG records the image it built (operators/node_image_records.py; "
        "tests/e2e/test_node_image_e2e.py)",
    (EC2_SIDS[0], "ec2:DescribeImages"):
        "preflight reads the node image's Neuron tags only when the profile's parameter or custom_ami names one "
        "(operators/image_checks.py; the enforced run's moto holds none), and trn1_build_image's record_image",
    ("ResourceGroupsListACapacityReservationGroupsReservations", "resource-groups:ListGroupResources"):
        "preflight, with capacity_reservation_group_arn only; moto 5.2.5 routes no ListGroupResources "
        "(tests/integration/test_capacity_checks.py answers it with a botocore Stubber)",
}


@cache
def vpc_template() -> dict[str, Any]:
    from cfnlint.decode import decode_str

    template, errors = decode_str(VPC_TEMPLATE.read_text())
    if errors:
        raise ValueError(f"{VPC_TEMPLATE}: {errors}")
    return template


def cloudformation_actions() -> dict[str, dict[str, str]]:
    """{action: {resource type: its origin}} CloudFormation needs for vpc.yaml with the caller's rights."""
    return required_actions([vpc_template()])


def reasons(granted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """A reason for each granted (Sid, action) that needs none of a local run's calls."""
    needed = cloudformation_actions()
    found = {key: why for key, why in NOT_IN_A_LOCAL_RUN.items() if key in granted}
    for sid, action in granted:
        if sid in EC2_SIDS and action in needed:
            origins = ", ".join(f"{kind} ({where})" for kind, where in sorted(needed[action].items()))
            found[(sid, action)] = f"CloudFormation's handlers for vpc.yaml: {origins}"
    return found
