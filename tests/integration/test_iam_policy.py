"""The least-privilege policies (include/cluster/iam/, docs/operations.md "Least privilege"): their shape,
the boundary condition on every role the pcluster role may create, the CloudFormation template that
creates both roles, the small evaluator the end-to-end test judges the recorded calls with, and the
call recorder itself. tests/integration/test_pcluster_role_policy.py derives the pcluster role's
policy from ParallelCluster's own stack."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.airflow_actions import EC2_SIDS, NOT_IN_A_LOCAL_RUN, cloudformation_actions, reasons, vpc_template
from tests.iam_policy import (
    AIRFLOW_POLICY,
    BOUNDARY_POLICY,
    MANAGED_POLICY_ACTIONS,
    NODE_KMS_POLICY,
    IMAGE_BUILD_POLICY,
    IMAGE_CLEANUP_POLICY,
    PCLUSTER_POLICY,
    PLACEHOLDER,
    POLICY_DIR,
    allowing,
    denials,
    exercised,
    granted,
    is_allowed,
    reference_problems,
    render_policy,
    requests_of,
    statements,
    uncovered_actions,
)
from tests.integration.test_dataset import aws_conn, empty_bucket, moto_endpoint  # noqa: F401 - fixtures
from tests.pcluster_actions import unused_problems
from tests.integration.test_pcluster_real_schema import pcluster_python  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parents[2]
BOUNDARY_ARN = "arn:aws:iam::<account-id>:policy/ultracluster-pcluster-boundary"
# The role-writing actions IAM judges with iam:PermissionsBoundary: each needs the condition.
BOUNDED_ACTIONS = ("iam:CreateRole", "iam:PutRolePolicy", "iam:DeleteRolePolicy", "iam:AttachRolePolicy",
                   "iam:DetachRolePolicy")
VALUES = {"region": "us-east-1", "account-id": "123456789012", "dataset-bucket": "neuron-s3",
          "dataset-key": "training_datasets/bert.tar", "artifacts-bucket": "uc-artifacts", "artifacts-prefix": "runs",
          "compile-cache-bucket": "uc-cache", "compile-cache-prefix": "neuron",
          "kms-key-arn": "arn:aws:kms:us-east-1:123456789012:key/k1"}


@pytest.fixture(scope="module")
def policy() -> dict:
    return render_policy(AIRFLOW_POLICY.read_text(), VALUES)


def call(service: str, operation: str, **params) -> dict:
    return {"service": service, "operation": operation, "params": params, "argv": ["airflow"]}


# --- shape ---------------------------------------------------------------------------------------

def _shape(document: dict) -> None:
    assert set(document) == {"Version", "Statement"} and document["Version"] == "2012-10-17"
    sids = [s["Sid"] for s in document["Statement"]]
    assert len(sids) == len(set(sids)) and all(sid.isalnum() for sid in sids)  # IAM: Sid is [A-Za-z0-9]
    for statement in document["Statement"]:
        assert set(statement) <= {"Sid", "Effect", "Action", "Resource", "Condition"}, statement["Sid"]


def test_the_airflow_policy_has_iams_shape_and_no_wildcard_grants():
    document = json.loads(AIRFLOW_POLICY.read_text())
    _shape(document)
    for statement in document["Statement"]:
        assert statement["Effect"] == "Allow"
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        # Every action named: no "*", no "service:*", no "service:Describe*" style families.
        assert actions and all(":" in a and "*" not in a for a in actions), statement["Sid"]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        if "*" in resources:
            # The one exception: EC2 Describe* calls, which support no resource-level permissions. Said in the Sid.
            assert resources == ["*"] and all(a.startswith("ec2:Describe") for a in actions), statement["Sid"]
            assert "NoResourceLevelPermissions" in statement["Sid"]
        else:
            assert all(r.startswith("arn:aws:") or r == "<kms-key-arn>" for r in resources), statement["Sid"]


def test_every_placeholder_is_explained_in_the_docs():
    doc = (REPO / "docs" / "operations.md").read_text()
    used = {p for path in (AIRFLOW_POLICY, PCLUSTER_POLICY, BOUNDARY_POLICY, NODE_KMS_POLICY)
            for p in PLACEHOLDER.findall(path.read_text())}
    assert used >= {"<region>", "<account-id>", "<artifacts-bucket>", "<artifacts-prefix>"}
    assert [p for p in sorted(used) if f"`{p}`" not in doc] == []
    with pytest.raises(ValueError, match="no value for <account-id>"):
        render_policy(AIRFLOW_POLICY.read_text(), {k: v for k, v in VALUES.items() if k != "account-id"})


def test_the_pcluster_role_policy_has_iams_shape_and_no_service_wide_grants():
    document = json.loads(PCLUSTER_POLICY.read_text())
    _shape(document)
    for statement in document["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        # No "*", no "service:*" (the old policy's cloudformation:*, fsx:*, s3:*); ec2:Describe* is the one family.
        assert all(":" in a and (a == "ec2:Describe*" or "*" not in a) for a in actions), statement["Sid"]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        if "*" in resources and statement["Effect"] == "Allow":
            assert resources == ["*"] and "NoResourceLevelPermissions" in statement["Sid"], statement["Sid"]
        else:
            assert all(r.startswith("arn:aws:") for r in resources if r != "*"), statement["Sid"]
    # IAM's size limits, without whitespace: a role's inline policies 10,240 characters, a managed policy 6,144.
    assert len(json.dumps(render_policy(PCLUSTER_POLICY.read_text(), VALUES), separators=(",", ":"))) <= 10240
    _shape(json.loads(BOUNDARY_POLICY.read_text()))
    assert len(json.dumps(render_policy(BOUNDARY_POLICY.read_text(), VALUES), separators=(",", ":"))) <= 6144
    # The image-build statements: the same rules, a managed policy's limit; no IAM but the service-linked role.
    builds = json.loads(IMAGE_BUILD_POLICY.read_text())
    _shape(builds)
    for statement in builds["Statement"]:
        assert all("*" not in a for a in statement["Action"]), statement["Sid"]
        assert statement["Resource"] != "*" or "NoResourceLevelPermissions" in statement["Sid"], statement["Sid"]
        assert all(a == "iam:CreateServiceLinkedRole" for a in statement["Action"] if a.startswith("iam:"))
    assert len(json.dumps(render_policy(IMAGE_BUILD_POLICY.read_text(), VALUES), separators=(",", ":"))) <= 6144


@pytest.mark.parametrize("path", [AIRFLOW_POLICY, PCLUSTER_POLICY, BOUNDARY_POLICY, NODE_KMS_POLICY,
                                  IMAGE_BUILD_POLICY, IMAGE_CLEANUP_POLICY], ids=lambda p: p.stem)
def test_every_action_exists_takes_its_resources_and_its_condition_keys(path):
    """Against IAM's Service Authorization Reference: no unknown action, no action that has no
    resource-level permissions under named resources (never matched: denied in production), no
    condition key the action does not take."""
    assert reference_problems(render_policy(path.read_text(), VALUES)) == []
    # What it catches: the documented fsx:* on file systems never grants fsx:DescribeFileSystems.
    scoped = {"Statement": [{"Sid": "FSx", "Effect": "Allow", "Action": ["fsx:DescribeFileSystems", "fsx:Bogus"],
                             "Resource": ["arn:aws:fsx:us-east-1:123456789012:file-system/*"],
                             "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}}]}
    assert reference_problems(scoped) == [
        "FSx: fsx:DescribeFileSystems has no resource-level permissions: its Resource must be *",
        "FSx: fsx:DescribeFileSystems takes no condition key iam:PassedToService",
        "FSx: fsx:Bogus: no such action"]


def test_every_statement_that_writes_a_role_demands_the_boundary():
    """iam:CreateRole (and putting or attaching a policy to a role) is impossible without the boundary."""
    document = json.loads(PCLUSTER_POLICY.read_text())
    for action in BOUNDED_ACTIONS:
        found = allowing(document, action)
        assert found, f"{action}: the stack's roles need it"
        for statement in found:
            assert statement["Condition"]["StringEquals"]["iam:PermissionsBoundary"] == BOUNDARY_ARN, statement["Sid"]
            assert statement["Resource"] == ["arn:aws:iam::<account-id>:role/parallelcluster/*"], statement["Sid"]
    # Attaching: only the managed policies the stacks attach: AWS's for the CloudWatch agent and SSM, the
    # image build instance's, and the nodes' kms:Decrypt (include/cluster/iam/node-kms-policy.json), each named.
    for statement in allowing(document, "iam:AttachRolePolicy"):
        assert sorted(statement["Condition"]["ArnLike"]["iam:PolicyARN"]) == [
            "arn:aws:iam::<account-id>:policy/ultracluster-node-kms",
            "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
            "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy",
            "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder"]
    # Moving the boundary away, or rewriting it, is denied outright.
    denied = [s for s in statements(document) if s["Effect"] == "Deny"]
    assert uncovered_actions({"Statement": [dict(s, Effect="Allow") for s in denied]},
                             ["iam:PutRolePermissionsBoundary", "iam:DeleteRolePermissionsBoundary",
                              "iam:CreatePolicyVersion", "iam:SetDefaultPolicyVersion"]) == []
    # Nothing else of IAM that could make a principal or a key.
    granted = {a for s in statements(document) if s["Effect"] == "Allow" for a in s["Action"]}
    assert {a for a in granted if a.startswith("iam:")} <= {
        *BOUNDED_ACTIONS, "iam:DeleteRole", "iam:TagRole", "iam:UntagRole", "iam:GetRole", "iam:GetRolePolicy",
        "iam:ListRolePolicies", "iam:ListAttachedRolePolicies", "iam:GetInstanceProfile", "iam:CreateInstanceProfile",
        "iam:DeleteInstanceProfile", "iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile",
        "iam:PassRole", "iam:CreateServiceLinkedRole", "iam:GetPolicy"}


def test_the_nodes_kms_policy_grants_decrypt_on_the_key_through_s3_only_and_the_boundary_leaves_it():
    document = render_policy(NODE_KMS_POLICY.read_text(), VALUES)
    _shape(json.loads(NODE_KMS_POLICY.read_text()))
    [statement] = statements(document)
    assert (statement["Effect"], statement["Action"], statement["Resource"]) == (
        "Allow", ["kms:Decrypt"], [VALUES["kms-key-arn"]])
    assert statement["Condition"] == {"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}}
    boundary = render_policy(BOUNDARY_POLICY.read_text(), VALUES)
    assert statement in statements(boundary)  # the same statement: the boundary caps it to exactly that


def test_the_managed_policies_actions_are_aws_own():
    """The actions the boundary must leave the roles (tests/iam_policy.py) are in the AWS managed
    policies' documents (moto's copy of them), each named."""
    from moto.iam.aws_managed_policies import aws_managed_policies_data

    data = json.loads(aws_managed_policies_data)
    for arn, actions in MANAGED_POLICY_ACTIONS.items():
        document = data[arn.rsplit("/", 1)[1]]
        document = document.get("Document", document)
        granted = {a for s in statements(document) for a in ([s["Action"]] if isinstance(s["Action"], str)
                                                               else s["Action"])}
        assert set(actions) <= granted, (arn, set(actions) - granted)
    boundary = render_policy(BOUNDARY_POLICY.read_text(), VALUES)
    assert uncovered_actions(boundary, [a for actions in MANAGED_POLICY_ACTIONS.values() for a in actions]) == []
    assert uncovered_actions(boundary, ["ssm:SendCommand", "ssm:CreateAssociation"]) == [
        "ssm:CreateAssociation", "ssm:SendCommand"]


def test_a_role_without_the_boundary_cannot_be_created():
    """The condition, evaluated: CreateRole with the boundary is allowed, without it (or another) not."""
    document = render_policy(PCLUSTER_POLICY.read_text(), VALUES)
    boundary = BOUNDARY_ARN.replace("<account-id>", VALUES["account-id"])
    [statement] = allowing(document, "iam:CreateRole")
    condition = statement["Condition"]["StringEquals"]["iam:PermissionsBoundary"]
    assert condition == boundary
    assert condition != "" and condition != f"arn:aws:iam::{VALUES['account-id']}:policy/AdministratorAccess"
    # The PassRole statement passes the cluster's roles to EC2 and Lambda only.
    [passing] = allowing(document, "iam:PassRole")
    assert passing["Condition"] == {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com",
                                                                              "lambda.amazonaws.com"]}}


def test_the_airflow_role_may_assume_the_pcluster_role_and_nothing_else_of_iam(policy):
    assert is_allowed(policy, "sts:AssumeRole", "arn:aws:iam::123456789012:role/ultracluster-pcluster")
    assert not is_allowed(policy, "sts:AssumeRole", "arn:aws:iam::123456789012:role/other")
    assert not any(a.startswith("iam:") for s in statements(policy) for a in s["Action"])


def test_the_cloudformation_template_creates_both_roles_from_the_policy_files():
    from cfnlint.api import lint_all

    done = subprocess.run([sys.executable, str(REPO / "scripts" / "iam_roles_template.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    text = (POLICY_DIR / "roles.cfn.json").read_text()
    template = json.loads(text)
    roles = {r["Properties"]["RoleName"]: r["Properties"] for r in template["Resources"].values()
             if r["Type"] == "AWS::IAM::Role"}
    assert set(roles) == {"ultracluster-airflow", "ultracluster-pcluster", "ultracluster-image-cleanup"}
    # The image-build statements: a managed policy of the pcluster role (its inline policy is near IAM's limit).
    assert roles["ultracluster-pcluster"]["ManagedPolicyArns"] == [{"Ref": "PclusterImageBuilds"}]
    assert roles["ultracluster-image-cleanup"]["Path"] == "/parallelcluster/"  # the pcluster role may pass it
    trust = roles["ultracluster-pcluster"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust == [{"Effect": "Allow", "Principal": {"AWS": {"Fn::GetAtt": ["AirflowRole", "Arn"]}},
                      "Action": "sts:AssumeRole"}]
    assert "Fn::Sub" in json.dumps(template) and "<" not in text  # every placeholder became a parameter
    assert [str(m) for m in lint_all(text) if m.rule.id[0] in "EW"] == []  # errors and warnings; not I(nfo)


# --- why the Airflow role holds each action (tests/airflow_actions.py) ---------------------------

def test_the_airflow_policy_grants_what_cloudformation_needs_for_vpc_yaml(policy):
    """create_vpc's stack is created and deleted with the Airflow role's own rights: every create and
    delete permission of vpc.yaml's resource types (cfn-lint's provider schemas) is granted, in the EC2
    statements; and the CloudFormation-only statement holds nothing else."""
    assert unused_problems([vpc_template()]) == []
    needed = cloudformation_actions()
    ec2 = {"Statement": [s for s in statements(policy) if s["Sid"] in EC2_SIDS]}
    assert uncovered_actions(ec2, needed) == []
    [via_cloudformation] = [s for s in statements(policy) if "aws:CalledVia" in json.dumps(s.get("Condition"))]
    assert sorted(a for a in via_cloudformation["Action"] if a not in needed) == []


def test_every_reviewed_action_is_granted_and_says_why(policy):
    have = granted(policy)
    assert [key for key in NOT_IN_A_LOCAL_RUN if key not in have] == []
    assert all(len(why) > 40 for why in reasons(have).values())
    # The derived ones name their resource types: ec2:CreateNatGateway comes from AWS::EC2::NatGateway.
    assert "AWS::EC2::NatGateway (provider schema create)" in reasons(have)[(EC2_SIDS[1], "ec2:CreateNatGateway")]


def test_exercised_counts_a_statement_only_for_what_it_allows(policy):
    calls = [call("s3", "PutObject", Bucket="uc-artifacts", Key="runs/x"),
             call("ec2", "DescribeKeyPairs"), call("s3", "PutObject", Bucket="uc-artifacts", Key="elsewhere/x")]
    assert exercised(policy, calls, "us-east-1", "123456789012") == {
        ("S3ArtifactsConfigResultsLogsCheckpointsReportsSweepIndex", "s3:PutObject"),
        (EC2_SIDS[0], "ec2:DescribeKeyPairs")}


# --- the evaluator -------------------------------------------------------------------------------

def test_the_pipelines_calls_are_allowed(policy):
    calls = [
        call("s3", "HeadBucket", Bucket="neuron-s3"),
        call("s3", "HeadObject", Bucket="neuron-s3", Key="training_datasets/bert.tar"),
        call("s3", "GetObject", Bucket="neuron-s3", Key="training_datasets/bert.tar"),  # presigned
        call("s3", "GetObject", Bucket="neuron-s3", Key="training_datasets/bert.tar.sha256"),  # its checksum
        call("s3", "PutObject", Bucket="uc-artifacts", Key="runs/results/d/r/results.json"),
        call("s3", "DeleteObjects", Bucket="uc-artifacts", Keys=["runs/_preflight/r.probe"]),
        call("s3", "ListObjectsV2", Bucket="uc-artifacts"),
        call("s3", "GetPublicAccessBlock", Bucket="uc-artifacts"),
        call("s3", "PutObject", Bucket="uc-cache", Key="neuron/bert-tiny-mb8-s128-0123.tar"),
        call("cloudformation", "CreateStack", StackName="uc-vpc-manual-2026-12-01"),
        call("cloudformation", "DescribeStacks", StackName="uc-net-s1-manual-2026"),
        call("ec2", "DescribeInstances"),
        call("service-quotas", "GetServiceQuota", ServiceCode="ec2", QuotaCode="L-2C3B7624"),
        # The node image: preflight reads the parameter and the AMI's tags, trn1_build_image writes it.
        call("ssm", "GetParameter", Name="/ultracluster/node-image/trn1"),
        call("ssm", "PutParameter", Name="/ultracluster/node-image/trn1"),
        call("ec2", "DescribeImages"),
        call("s3", "PutObject", Bucket="uc-artifacts", Key="runs/images/uc-neuron-2-28-0-x/image-setup.sh"),
    ]
    assert denials(policy, calls, "us-east-1", "123456789012") == []


@pytest.mark.parametrize("denied", [
    call("s3", "PutObject", Bucket="uc-artifacts", Key="elsewhere/x"),          # outside the prefix
    call("s3", "GetObject", Bucket="neuron-s3", Key="training_datasets/other.tar"),  # not the dataset
    call("s3", "PutObject", Bucket="neuron-s3", Key="training_datasets/bert.tar"),   # the dataset is read-only
    call("s3", "DeleteBucket", Bucket="uc-artifacts"),
    call("cloudformation", "DeleteStack", StackName="someone-elses-stack"),
    call("cloudformation", "CreateStack", StackName="uc-vpc-x", ),
    call("ec2", "TerminateInstances"),
    call("ec2", "CreateVpc"),                  # only through CloudFormation (a Condition): never directly
    call("iam", "PassRole"),
    call("service-quotas", "GetServiceQuota", ServiceCode="ec2", QuotaCode="L-OTHER"),
    call("ssm", "PutParameter", Name="/aws/service/ami-amazon-linux-latest/x"),  # only /ultracluster/ parameters
    call("ssm", "DeleteParameter", Name="/ultracluster/node-image/trn1"),
])
def test_anything_else_is_denied(policy, denied):
    region, account = ("eu-west-1", "123456789012") if denied["operation"] == "CreateStack" else ("us-east-1",
                                                                                                  "123456789012")
    assert len(denials(policy, [denied], region, account)) == 1


def test_wildcards_case_and_an_explicit_deny():
    policy = {"Statement": [
        {"Effect": "Allow", "Action": "S3:Get*", "Resource": "arn:aws:s3:::b/run?/*"},
        {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/run1/secret"},
    ]}
    assert is_allowed(policy, "s3:GetObject", "arn:aws:s3:::b/run1/x")   # actions are case-insensitive
    assert not is_allowed(policy, "s3:GetObject", "arn:aws:s3:::b/run12/x")  # ? is one character
    assert not is_allowed(policy, "s3:GetObject", "arn:aws:s3:::B/run1/x")  # resources are not
    assert not is_allowed(policy, "s3:GetObject", "arn:aws:s3:::b/run1/secret")  # Deny wins
    assert requests_of(call("s3", "DeleteObjects", Bucket="b", Keys=["k1", "k2"]), "r", "a") == [
        ("s3:DeleteObject", "arn:aws:s3:::b/k1"), ("s3:DeleteObject", "arn:aws:s3:::b/k2")]


def test_an_artifacts_uri_without_a_prefix_grants_the_whole_bucket():
    policy = render_policy(AIRFLOW_POLICY.read_text(), {**VALUES, "artifacts-prefix": ""})
    assert is_allowed(policy, "s3:PutObject", "arn:aws:s3:::uc-artifacts/results/d/r/x")


# --- the recorder (tests/fixtures/aws_call_recorder) -------------------------------------------------

def test_the_recorder_logs_calls_and_presigned_urls_of_a_process(aws_conn, moto_endpoint, tmp_path):
    empty_bucket(aws_conn, "uc-artifacts")
    log = tmp_path / "calls.jsonl"
    script = (
        "import boto3\n"
        f"c = boto3.client('s3', endpoint_url={moto_endpoint!r}, region_name='us-east-1',"
        " aws_access_key_id='testing', aws_secret_access_key='testing')\n"
        "c.put_object(Bucket='uc-artifacts', Key='runs/a', Body=b'x')\n"
        "c.delete_objects(Bucket='uc-artifacts', Delete={'Objects': [{'Key': 'runs/a'}]})\n"
        "c.generate_presigned_url('get_object', Params={'Bucket': 'uc-artifacts', 'Key': 'runs/b'})\n"
    )
    env = {**os.environ, "UC_AWS_CALL_LOG": str(log),
           "PYTHONPATH": str(REPO / "tests" / "fixtures" / "aws_call_recorder")}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(c["operation"], c["params"], c["presigned"]) for c in calls] == [
        ("PutObject", {"Bucket": "uc-artifacts", "Key": "runs/a"}, False),
        ("DeleteObjects", {"Bucket": "uc-artifacts", "Keys": ["runs/a"]}, False),
        ("GetObject", {"Bucket": "uc-artifacts", "Key": "runs/b"}, True),
    ]
    assert calls[0]["argv"] == ["-c"] and calls[0]["prefix"] == sys.prefix
    # Off unless asked: without UC_AWS_CALL_LOG nothing is written anywhere.
    del env["UC_AWS_CALL_LOG"]
    log.unlink()
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    assert not log.exists()


def test_the_image_cleanup_role_is_parallelclusters_own_but_for_its_condition_key(pcluster_python):
    """include/cluster/iam/image-cleanup-role-policy.json is what the pinned aws-parallelcluster gives the
    cleanup role it makes (imagebuilder_utils._expected_inline_policy), with one change: its DeleteStack
    condition names cloudformation:ResourceTag/..., a key CloudFormation does not have (IAM's Service
    Authorization Reference: DeleteStack takes aws:ResourceTag/${TagKey}), so it never matches and the
    build stack would never be deleted; here it is aws:ResourceTag/parallelcluster:image_id."""
    code = ("import json\nfrom pcluster.imagebuilder_utils import _expected_inline_policy\n"
            "print(_expected_inline_policy('<account-id>', 'aws'))\n")
    done = subprocess.run([str(pcluster_python), "-c", code], capture_output=True, text=True, timeout=120,
                          check=True)
    theirs = json.loads(done.stdout)
    ours = json.loads(IMAGE_CLEANUP_POLICY.read_text())
    [delete_stack] = [s for s in theirs["Statement"] if s["Action"] == "cloudformation:DeleteStack"]
    condition = delete_stack["Condition"]["ForAnyValue:StringLike"]
    key = "parallelcluster:image_id"
    condition[f"aws:ResourceTag/{key}"] = condition.pop(f"cloudformation:ResourceTag/{key}")
    assert ours == theirs
    assert reference_problems({"Statement": [dict(delete_stack, Sid="theirs", Condition={"ForAnyValue:StringLike": {
        "cloudformation:ResourceTag/parallelcluster:image_id": "*"}})]}) == [
        "theirs: cloudformation:DeleteStack takes no condition key cloudformation:ResourceTag/parallelcluster:image_id"]


def test_the_pcluster_role_may_read_a_capacity_reservation_group_as_parallelclusters_validators_do(pcluster_python):
    """With CapacityReservationResourceGroupArn the pinned aws-parallelcluster's config and validators
    read the group through its ResourceGroupsClient (pcluster/aws/resource_groups.py): every boto3 call
    that client makes is allowed on a group of the account, and on nothing of another account."""
    code = ("import inspect, json, re\nfrom pcluster.aws.resource_groups import ResourceGroupsClient\n"
            "print(json.dumps(sorted(set(re.findall(r'self\\._client\\.(\\w+)\\(', "
            "inspect.getsource(ResourceGroupsClient))))))\n")
    done = subprocess.run([str(pcluster_python), "-c", code], capture_output=True, text=True, timeout=120,
                          check=True)
    operations = json.loads(done.stdout)
    assert operations == ["get_group_configuration", "list_group_resources"]  # a new call fails here first
    document = render_policy(PCLUSTER_POLICY.read_text(), VALUES)
    group = f"arn:aws:resource-groups:{VALUES['region']}:{VALUES['account-id']}:group/trn1-odcr"
    for operation in operations:
        action = "resource-groups:" + "".join(word.title() for word in operation.split("_"))
        assert is_allowed(document, action, group), action
        assert not is_allowed(document, action, group.replace(VALUES["account-id"], "210987654321")), action
