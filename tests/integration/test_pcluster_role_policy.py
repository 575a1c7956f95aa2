"""The pcluster role's policy against ParallelCluster's own stack (docs/operations.md, "Least privilege").

The pinned aws-parallelcluster synthesizes the cluster's CloudFormation templates itself
(scripts/pcluster_synth.py in .venvs/pcluster: `pcluster create-cluster`'s code, stopped at its
CreateStack) for the config render_config renders with the production profile: the seed's 16
trn1.32xlarge with EFA and a placement group, FSx for Lustre, CloudWatch logs, its dashboard and alarms.
moto stands in for the account, set up as for the real dry run (test_pcluster_real_schema.py).

Then include/cluster/iam/pcluster-role-policy.json must grant every action that creates or deletes a
resource type of those templates (tests/pcluster_actions.py: CloudFormation's provider schemas as
cfn-lint ships them, and a reviewed table for the types without), every call the CLI made on its
way, and the roles the stack creates must be ones its conditions allow: on ParallelCluster's path,
with the boundary, with only the managed policies it names. The boundary
(pcluster-permissions-boundary.json) must leave those roles what the stack grants them.
"""
from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.iam_policy import (
    BOUNDARY_POLICY,
    PCLUSTER_POLICY,
    allowing,
    denials,
    render_policy,
    uncovered_actions,
)
from tests.integration.test_pcluster_real_schema import (  # noqa: F401 - fixtures
    MOTO_GAPS,
    RUN_ID,
    moto_account,
    moto_config,
    pcluster_python,
    real_pcluster,
)
from tests.pcluster_actions import (
    LEGACY,
    handler_actions,
    required_actions,
    resolve,
    resource_types,
    resources_of,
    unused_problems,
)
from ultracluster.run.names import cluster_name_for

pytestmark = pytest.mark.localcluster  # a moto server, and pcluster's CDK on Node.js

REPO = Path(__file__).resolve().parents[2]
SYNTH = REPO / "scripts" / "pcluster_synth.py"
REGION, ACCOUNT = "us-east-1", "123456789012"  # moto's account
VALUES = {"region": REGION, "account-id": ACCOUNT,  # and the production profile's artifacts_s3_uri
          "artifacts-bucket": "ultracluster-artifacts", "artifacts-prefix": "runs"}
BOUNDARY_ARN = f"arn:aws:iam::{ACCOUNT}:policy/ultracluster-pcluster-boundary"
CLUSTER = cluster_name_for(RUN_ID)
# What CloudFormation fills in for the stack's pseudo parameters.
PSEUDO = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::URLSuffix": "amazonaws.com",
          "AWS::StackName": CLUSTER,
          "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{CLUSTER}/5b2c6a10-2f0e-11f1-9c1e-0a1b"}

# The AWS managed policy ParallelCluster attaches to the roles it creates (the nodes'), and its actions
# (AWS Managed Policy Reference Guide, "CloudWatchAgentServerPolicy"): the boundary must leave them.
MANAGED_POLICY_ACTIONS = {
    "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy": (
        "cloudwatch:PutMetricData", "ec2:DescribeVolumes", "ec2:DescribeTags", "logs:PutLogEvents",
        "logs:PutRetentionPolicy", "logs:DescribeLogStreams", "logs:DescribeLogGroups", "logs:CreateLogStream",
        "logs:CreateLogGroup", "xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules",
        "xray:GetSamplingTargets", "xray:GetSamplingStatisticSummaries", "ssm:GetParameter"),
    # The node image's build instance (test_pcluster_image_policy.py). EC2 Image Builder User Guide, "Using
    # managed policies for EC2 Image Builder", EC2InstanceProfileForImageBuilder (its kms:Decrypt only for
    # components Image Builder encrypted); AWS Managed Policy Reference Guide, AmazonSSMManagedInstanceCore.
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
# botocore service names whose IAM prefix differs.
IAM_PREFIX = {"efs": "elasticfilesystem", "resourcegroupstaggingapi": "tag", "service-quotas": "servicequotas"}
# Calls that need no permission.
FREE_CALLS = {("sts", "GetCallerIdentity")}


@pytest.fixture(scope="module")
def policy() -> dict:
    return render_policy(PCLUSTER_POLICY.read_text(), VALUES)


@pytest.fixture(scope="module")
def boundary() -> dict:
    return render_policy(BOUNDARY_POLICY.read_text(), VALUES)


@pytest.fixture(scope="module")
def synthesized(real_pcluster, pcluster_python, moto_account, tmp_path_factory) -> dict:
    """`pcluster create-cluster` of the seed's config, up to its CreateStack: templates and the CLI's calls."""
    import boto3

    # The boundary exists before the cluster: pcluster's validator reads it (iam:GetPolicy).
    iam = boto3.client("iam", endpoint_url=moto_account["endpoint"], region_name=REGION,
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        iam.create_policy(PolicyName=BOUNDARY_ARN.rsplit("/", 1)[1],
                          PolicyDocument=json.dumps(render_policy(BOUNDARY_POLICY.read_text(), VALUES)))
    except iam.exceptions.EntityAlreadyExistsException:
        pass
    # A first cluster in the account: ParallelCluster creates its bucket (another test's run may have made it).
    s3 = boto3.resource("s3", endpoint_url=moto_account["endpoint"], region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing")
    for bucket in s3.buckets.all():
        if bucket.name.startswith("parallelcluster-"):
            bucket.object_versions.delete()
            bucket.objects.delete()
            bucket.delete()
    work = tmp_path_factory.mktemp("synth")
    config, out = work / "cluster-config.yaml", work / "synth.json"
    config.write_text(moto_config(moto_account, permissions_boundary_arn=BOUNDARY_ARN))
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_account["endpoint"], "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION, "HOME": str(work)}
    started = time.monotonic()
    done = subprocess.run([str(pcluster_python), str(SYNTH), str(config), "--cluster-name", CLUSTER,
                           "--out", str(out), "--suppress-validators", *MOTO_GAPS],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    result["seconds"] = time.monotonic() - started
    assert result["pclusterVersion"] == "3.16.1" and result["stackName"] == CLUSTER
    return result


@pytest.fixture(scope="module")
def templates(synthesized) -> list[dict]:
    return [synthesized["template"], *synthesized["nestedTemplates"].values()]


def test_the_stack_is_the_seeds_cluster(synthesized, templates):
    types = resource_types(templates)
    print(f"synthesized in {synthesized['seconds']:.0f} s: {len(types)} resource types")
    for name, ids in types.items():
        print(f"  {name}: {len(ids)}")
    assert {"AWS::FSx::FileSystem", "AWS::EC2::PlacementGroup", "AWS::EC2::LaunchTemplate", "AWS::EC2::Instance",
            "AWS::CloudWatch::CompositeAlarm", "AWS::CloudWatch::Dashboard", "AWS::IAM::Role"} <= set(types)
    [(_, fsx)] = resources_of(templates, "AWS::FSx::FileSystem")
    assert (fsx["FileSystemType"], fsx["StorageCapacity"]) == ("LUSTRE", 1200)
    compute = [props["LaunchTemplateData"] for _, props in resources_of(templates, "AWS::EC2::LaunchTemplate")
               if props["LaunchTemplateData"].get("InstanceType") == "trn1.32xlarge"]
    assert compute, "no launch template for the trn1.32xlarge compute resource"
    efa = [i for i in compute[0]["NetworkInterfaces"] if i.get("InterfaceType") in ("efa", "efa-only")]
    assert len({i["NetworkCardIndex"] for i in efa}) == 8  # trn1.32xlarge: EFA on its 8 network cards
    assert "GroupName" in json.dumps(compute[0]["Placement"])  # the placement group


def test_every_type_has_handler_permissions_or_a_reviewed_row(templates):
    for type_name in resource_types(templates):
        handlers = handler_actions(type_name)
        key = "AWS::CloudFormation::CustomResource" if type_name.startswith("Custom::") else type_name
        assert (handlers is not None and handlers["create"] and handlers["delete"]) or key in LEGACY, type_name


def test_the_policy_grants_every_create_and_delete_action_of_the_stack(templates, policy):
    assert unused_problems(templates) == []
    needed = required_actions(templates)
    missing = uncovered_actions(policy, needed)
    assert missing == [], "\n".join(f"{a}: {', '.join(f'{t} ({o})' for t, o in needed[a].items())}" for a in missing)


def test_the_policy_grants_every_call_the_cli_made(synthesized, policy):
    calls = [c for c in synthesized["awsCalls"] if (c["service"], c["operation"]) not in FREE_CALLS]
    assert {"CreateBucket", "PutObject", "CreateStack", "DescribeInstanceTypes"} <= {c["operation"] for c in calls}
    # S3 and CloudFormation: action and resource (bucket, object, stack ARN); the rest by action.
    scoped = [c for c in calls if c["service"] in ("s3", "cloudformation")]
    assert denials(policy, scoped, REGION, ACCOUNT) == []
    actions = {f"{IAM_PREFIX.get(c['service'], c['service'])}:{c['operation']}" for c in calls if c not in scoped}
    assert uncovered_actions(policy, actions) == []


def _matches_any(arn: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(arn, pattern) for pattern in patterns)


def test_the_stacks_roles_meet_the_policys_conditions(templates, policy):
    roles = list(resources_of(templates, "AWS::IAM::Role"))
    assert len(roles) >= 3  # the head node's, the compute nodes', the cleanup functions'
    [create_role] = allowing(policy, "iam:CreateRole")
    [attach] = allowing(policy, "iam:AttachRolePolicy")
    [passing] = allowing(policy, "iam:PassRole")
    for logical_id, role in roles:
        # CreateRole's resource is the role's ARN: its path, then its (generated) name.
        assert _matches_any(f"arn:aws:iam::{ACCOUNT}:role{role.get('Path', '/')}generated", create_role["Resource"]), (
            logical_id, role.get("Path"))
        assert _matches_any(f"arn:aws:iam::{ACCOUNT}:role{role.get('Path', '/')}generated", passing["Resource"])
        assert resolve(role.get("PermissionsBoundary"), PSEUDO) == BOUNDARY_ARN, logical_id
        for managed in role.get("ManagedPolicyArns") or []:
            assert _matches_any(resolve(managed, PSEUDO), attach["Condition"]["ArnLike"]["iam:PolicyARN"]), (
                logical_id, managed)
    [profiles] = allowing(policy, "iam:CreateInstanceProfile")
    for logical_id, profile in resources_of(templates, "AWS::IAM::InstanceProfile"):
        assert _matches_any(f"arn:aws:iam::{ACCOUNT}:instance-profile{profile['Path']}generated", profiles["Resource"])
    # Terminating (delete-cluster's compute nodes) and changing instances: only those tagged with a
    # cluster name the condition names, as every instance the stack or its fleet launches is.
    [terminate] = allowing(policy, "ec2:TerminateInstances")
    wanted = terminate["Condition"]["StringLike"]["ec2:ResourceTag/parallelcluster:cluster-name"]
    tag_lists = [props.get("Tags") or [] for _, props in resources_of(templates, "AWS::EC2::Instance")]
    tag_lists += [spec["Tags"] for _, props in resources_of(templates, "AWS::EC2::LaunchTemplate")
                  for spec in props["LaunchTemplateData"].get("TagSpecifications", [])
                  if spec["ResourceType"] == "instance"]
    assert len(tag_lists) >= 2  # the head node and the compute resource
    for tags in tag_lists:
        names = {resolve(t["Value"], PSEUDO) for t in tags if t["Key"] == "parallelcluster:cluster-name"}
        assert names == {CLUSTER} and fnmatch.fnmatchcase(CLUSTER, wanted), tags


def test_the_stacks_named_resources_are_inside_the_policys_resources(synthesized, templates, policy):
    """Where the template names a resource, the statement that creates it covers that name."""
    named = {  # type: (its name property, the creating action, the resource ARN of a name)
        "AWS::Lambda::Function": ("FunctionName", "lambda:CreateFunction", "arn:aws:lambda:{r}:{a}:function:{n}"),
        "AWS::DynamoDB::Table": ("TableName", "dynamodb:CreateTable", "arn:aws:dynamodb:{r}:{a}:table/{n}"),
        "AWS::Logs::LogGroup": ("LogGroupName", "logs:CreateLogGroup", "arn:aws:logs:{r}:{a}:log-group:{n}"),
        "AWS::CloudWatch::Alarm": ("AlarmName", "cloudwatch:PutMetricAlarm", "arn:aws:cloudwatch:{r}:{a}:alarm:{n}"),
        "AWS::CloudWatch::CompositeAlarm": ("AlarmName", "cloudwatch:PutCompositeAlarm",
                                            "arn:aws:cloudwatch:{r}:{a}:alarm:{n}"),
        "AWS::CloudWatch::Dashboard": ("DashboardName", "cloudwatch:PutDashboard",
                                       "arn:aws:cloudwatch::{a}:dashboard/{n}"),
    }
    checked = 0
    for type_name, (prop, action, arn) in named.items():
        resources = [r for s in allowing(policy, action) for r in s["Resource"]]
        for logical_id, props in resources_of(templates, type_name):
            name = resolve(props[prop], PSEUDO)
            assert isinstance(name, str), (logical_id, props[prop])
            assert _matches_any(arn.format(r=REGION, a=ACCOUNT, n=name), resources), (logical_id, name, resources)
            checked += 1
    assert checked >= 10
    # The functions' code and the nested stacks' templates are in the cluster's bucket, which
    # CloudFormation reads with the role's own permissions.
    code = [resolve(props["Code"], PSEUDO) for _, props in resources_of(templates, "AWS::Lambda::Function")]
    reads = [{"service": "s3", "operation": "GetObject", "params": {"Bucket": c["S3Bucket"], "Key": c["S3Key"]}}
             for c in code]
    bucket = synthesized["createStack"]["TemplateURL"].split("//", 1)[1].split(".", 1)[0]
    reads += [{"service": "s3", "operation": "GetObject", "params": {"Bucket": bucket, "Key": key}}
              for key in synthesized["nestedTemplates"]]
    assert reads and denials(policy, reads, REGION, ACCOUNT) == []


def test_the_boundary_leaves_the_roles_what_the_stack_grants_them(templates, boundary):
    granted: set[str] = set()
    documents = [p["PolicyDocument"] for _, role in resources_of(templates, "AWS::IAM::Role")
                 for p in role.get("Policies") or []]
    documents += [props["PolicyDocument"] for _, props in resources_of(templates, "AWS::IAM::Policy")]
    for document in documents:
        for statement in document["Statement"]:
            if statement.get("Effect", "Allow") == "Allow":
                granted |= set([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    managed = {resolve(m, PSEUDO) for _, role in resources_of(templates, "AWS::IAM::Role")
               for m in role.get("ManagedPolicyArns") or []}
    assert managed and [m for m in managed if m not in MANAGED_POLICY_ACTIONS] == [], managed
    granted |= {a for m in managed for a in MANAGED_POLICY_ACTIONS[m]}
    # A wildcard the stack grants (S3Access: s3:* to write, s3:Get* and s3:List* to read) is capped by
    # the boundary on purpose: the nodes read, Airflow writes.
    assert {a for a in granted if "*" in a} <= {"s3:*", "s3:Get*", "s3:List*"}
    assert uncovered_actions(boundary, {a for a in granted if "*" not in a}) == []
    assert uncovered_actions(boundary, ["s3:PutObject", "s3:DeleteBucket", "iam:CreateRole"]) == [
        "iam:CreateRole", "s3:DeleteBucket", "s3:PutObject"]
