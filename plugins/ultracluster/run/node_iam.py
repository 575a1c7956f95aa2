"""What the cluster's node roles may do (docs/operations.md, "Least privilege", "The node roles").

The nodes read; Airflow writes. Every transfer of the pipeline goes through presigned URLs that
Airflow's role signs, so a node's own role needs S3 only for what ParallelCluster fetches with it:
``on_node_configured.sh``, under the run's prefix of the artifacts bucket. ``Iam.S3Access`` names that
prefix without ``EnableWriteAccess`` (ParallelCluster then grants ``s3:Get*`` and ``s3:List*`` on it).
When the deployment encrypts with a customer managed KMS key, the nodes also need ``kms:Decrypt`` on
it to read the script. ParallelCluster 3.16.1's config takes no inline policy, only managed policy
ARNs (``AdditionalIamPolicies``), so that grant is a managed policy the deployment creates
(``include/cluster/iam/node-kms-policy.json``; roles.cfn.json's ``NodeKmsPolicyArn`` output), named by
the profile's ``node_kms_policy_arn``. The head node also gets ``AmazonSSMManagedInstanceCore``:
people reach it through SSM Session Manager, not SSH (run.ssh_access). What ParallelCluster adds itself
(its bucket, ``CloudWatchAgentServerPolicy`` for the CloudWatch agent) stays as it makes it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from ultracluster.run.s3 import customer_kms_key, split_s3_uri

SSM_POLICY = "AmazonSSMManagedInstanceCore"
_POLICY_ARN = re.compile(r"^arn:aws(-[a-z]+)*:iam::(\d{12}|aws):policy/[\w+=,.@/-]+$")
_WHERE = "roles.cfn.json's {} output (docs/operations.md, \"Least privilege\")"


def partition(region: str) -> str:
    """The ARN partition of a region."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def aws_managed_policy(name: str, region: str) -> str:
    return f"arn:{partition(region)}:iam::aws:policy/{name}"


def s3_access(on_node_configured_s3_uri: str) -> list[dict[str, str]]:
    """``Iam.S3Access`` of the head node and every queue: read-only, the prefix that holds the node
    script (the run's own: ``<artifacts>/<dag_id>/<safe run id>/``)."""
    bucket, key = split_s3_uri(on_node_configured_s3_uri)
    prefix = key.rpartition("/")[0]
    return [{"BucketName": bucket, "KeyName": f"{prefix}/*" if prefix else key}]


def additional_policies(region: str, sse: Mapping[str, str] | None,
                        node_kms_policy_arn: str | None) -> dict[str, list[str]]:
    """``Iam.AdditionalIamPolicies`` as ``{"head_node": [...], "compute": [...]}`` (policy ARNs)."""
    kms = [node_kms_policy_arn] if customer_kms_key(sse) and node_kms_policy_arn else []
    return {"head_node": [aws_managed_policy(SSM_POLICY, region), *kms], "compute": kms}


def iam_problems(sse: Mapping[str, str] | None, node_kms_policy_arn: str | None,
                 permissions_boundary_arn: str | None = None, boundary_required: bool = False) -> list[str]:
    """The deployment's IAM settings that cannot make a working, bounded cluster, one line each."""
    problems = []
    key, kms_policy = customer_kms_key(sse), (node_kms_policy_arn or "").strip()
    if key and not kms_policy:
        problems.append(
            f"node_kms_policy_arn: not set, but s3_kms_key_id {key!r} is a customer managed key: the cluster's "
            "nodes could not decrypt on_node_configured.sh, and every node would fail its boot. Set it "
            "(the production profile reads ULTRACLUSTER_NODE_KMS_POLICY_ARN) to " + _WHERE.format("NodeKmsPolicyArn"))
    elif kms_policy and not key:
        problems.append(f"node_kms_policy_arn: {kms_policy!r} is set, but no customer managed KMS key encrypts "
                        "the run's objects (s3_encryption, s3_kms_key_id): clear it, the nodes need no kms:Decrypt")
    boundary = (permissions_boundary_arn or "").strip()
    if boundary_required and not boundary:
        problems.append(
            "permissions_boundary_arn: not set. The pcluster role may create the cluster's roles only with the "
            "boundary ultracluster-pcluster-boundary (include/cluster/iam/pcluster-role-policy.json), so the "
            "cluster stack's first iam:CreateRole would be denied after the network is up. Set it (the production "
            "profile reads ULTRACLUSTER_PERMISSIONS_BOUNDARY_ARN) to " + _WHERE.format("PermissionsBoundaryArn"))
    for name, value in (("node_kms_policy_arn", kms_policy), ("permissions_boundary_arn", boundary)):
        if value and not _POLICY_ARN.match(value):
            problems.append(f"{name}: {value!r} is not an IAM policy ARN (arn:aws:iam::<account-id>:policy/<name>)")
    return problems
