"""The least-privilege policies (include/cluster/iam/, docs/operations.md "Least privilege"): their shape,
the small evaluator the end-to-end test judges the recorded calls with, and the call recorder itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.iam_policy import AIRFLOW_POLICY, PLACEHOLDER, POLICY_DIR, denials, is_allowed, render_policy, requests_of
from tests.integration.test_dataset import aws_conn, empty_bucket, moto_endpoint  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[2]
PCLUSTER_POLICY = POLICY_DIR / "pcluster-user-policy.json"
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

def test_the_airflow_policy_has_iams_shape_and_no_wildcard_grants():
    document = json.loads(AIRFLOW_POLICY.read_text())
    assert set(document) == {"Version", "Statement"} and document["Version"] == "2012-10-17"
    sids = [s["Sid"] for s in document["Statement"]]
    assert len(sids) == len(set(sids)) and all(sid.isalnum() for sid in sids)  # IAM: Sid is [A-Za-z0-9]
    for statement in document["Statement"]:
        assert set(statement) <= {"Sid", "Effect", "Action", "Resource", "Condition"}, statement["Sid"]
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
    used = set(PLACEHOLDER.findall(AIRFLOW_POLICY.read_text())) | set(PLACEHOLDER.findall(PCLUSTER_POLICY.read_text()))
    assert used >= {"<region>", "<account-id>", "<artifacts-bucket>", "<artifacts-prefix>"}
    assert [p for p in sorted(used) if f"`{p}`" not in doc] == []
    with pytest.raises(ValueError, match="no value for <account-id>"):
        render_policy(AIRFLOW_POLICY.read_text(), {k: v for k, v in VALUES.items() if k != "account-id"})


def test_the_pcluster_policy_is_parallelclusters_documented_user_policy():
    document = json.loads(PCLUSTER_POLICY.read_text())
    assert document["Version"] == "2012-10-17"
    by_sid = {s["Sid"]: s for s in document["Statement"]}
    # Base user policy, FSx for Lustre additions, and the cluster's own roles (privileged IAM mode,
    # scoped to role/parallelcluster/*): pcluster creates its instance roles and passes them to EC2.
    assert {"EC2Read", "EC2Write", "CloudFormation", "IamPassRole", "FSx", "IamCreateRole"} <= set(by_sid)
    assert by_sid["IamPassRole"]["Resource"] == ["arn:aws:iam::<account-id>:role/parallelcluster/*"]
    assert "iam:PassedToService" in json.dumps(by_sid["IamPassRole"]["Condition"])
    render_policy(PCLUSTER_POLICY.read_text(), VALUES)


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
