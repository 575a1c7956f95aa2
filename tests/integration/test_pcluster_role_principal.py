"""Two principals (docs/operations.md, "Least privilege"): the real `pcluster` CLI, run by ParallelClusterHook
as the operators run it, signs as the pcluster role, never as Airflow.

An enforcing moto server of its own (tests/fixtures/moto_enforced.py with ``--principal-log``: every
request signed by a known principal, judged by its policies, and logged with its signer) holds the two
principals of a deployment: Airflow's (here an IAM user with exactly airflow-policy.json) and the role
``ultracluster-pcluster`` (exactly pcluster-role-policy.json and the image builds' managed policy),
which trusts Airflow's principal only. The worker's environment carries Airflow's own keys;
``pcluster_default`` is configured as the docs say: an AWS config profile with ``role_arn`` and a
``source_profile`` that yields Airflow's identity (here through ``credential_process``). The pinned
aws-parallelcluster 3.16.1 then runs the verbs it can run against moto (list-clusters, describe-cluster of
a missing cluster, create-cluster --dryrun true of the production config); the log must show each of
its calls signed by the assumed pcluster role, and Airflow's principal only in the AssumeRole.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import boto3
import pytest
from airflow.sdk.definitions.retry_policy import RetryAction
from botocore.exceptions import ClientError

from tests.fixtures_enforced import client, make_role, make_user, put_role_policy, running_enforced_moto
from tests.iam_policy import AIRFLOW_POLICY, IMAGE_BUILD_POLICY, PCLUSTER_POLICY, render_policy
from tests.integration.test_pcluster_real_schema import (  # noqa: F401 - fixtures
    MOTO_GAPS,
    moto_config,
    pcluster_python,
    prepare_account,
    real_pcluster,
)
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.operators.retry_policy import DeniedCallsFail
from ultracluster.parsers.pcluster import DRYRUN_SUCCEEDED, ClusterNotFoundError, PclusterAccessDeniedError

pytestmark = pytest.mark.localcluster  # a moto server, and the real pcluster

REGION, ACCOUNT = "us-east-1", "123456789012"
VALUES = {"region": REGION, "account-id": ACCOUNT, "dataset-bucket": "neuron-s3", "dataset-key": "bert/data.tar",
          "artifacts-bucket": "ultracluster-artifacts", "artifacts-prefix": "runs",
          "compile-cache-bucket": "ultracluster-artifacts", "compile-cache-prefix": "neuron-cache",
          "kms-key-arn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/not-used-with-AES256"}
ROLE = "ultracluster-pcluster"   # the name airflow-policy.json's sts:AssumeRole names
CLUSTER = "uc-principal-check"   # the pcluster role's CloudFormation statement covers stack/uc-*
PCLUSTER_ONLY_STACK = f"uc-{'0' * 8}-principal"   # a cluster stack's name: not a network's (uc-vpc-*, uc-net-*)


@pytest.fixture(scope="module")
def principal_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("principals") / "principals.jsonl"


@pytest.fixture(scope="module")
def endpoint(principal_log, real_pcluster):
    with running_enforced_moto(principal_log) as url:
        yield url


@pytest.fixture(scope="module")
def principals(endpoint) -> dict:
    """Airflow's principal, and the pcluster role it may assume (as roles.cfn.json makes them)."""
    airflow = make_user(endpoint, "uc-airflow-principal", render_policy(AIRFLOW_POLICY.read_text(), VALUES))
    role_arn = make_role(endpoint, ROLE, pcluster_policy(), trusted_arn=airflow.arn, managed={
        "ultracluster-pcluster-image-builds": render_policy(IMAGE_BUILD_POLICY.read_text(), VALUES)})
    return {"airflow": airflow, "role_arn": role_arn, "account": prepare_account(endpoint)}


def pcluster_policy() -> dict:
    return render_policy(PCLUSTER_POLICY.read_text(), VALUES)


@pytest.fixture(scope="module")
def connection_env(principals, endpoint, tmp_path_factory) -> dict:
    """pcluster_default's ``env`` as docs/operations.md says: a profile that assumes the pcluster role
    from Airflow's identity (its source profile's credential_process hands out Airflow's keys)."""
    airflow, work = principals["airflow"], tmp_path_factory.mktemp("pcluster-home")
    process = work / "airflow-identity"
    process.write_text("#!/bin/sh\nexec cat \"$0.json\"\n")
    Path(f"{process}.json").write_text(json.dumps(
        {"Version": 1, "AccessKeyId": airflow.key, "SecretAccessKey": airflow.secret}))
    process.chmod(0o700)
    config = work / "aws-config"
    config.write_text(f"[profile {ROLE}]\nrole_arn = {principals['role_arn']}\nsource_profile = airflow-identity\n"
                      f"region = {REGION}\n\n[profile airflow-identity]\ncredential_process = {process}\n")
    return {"AWS_CONFIG_FILE": str(config), "AWS_PROFILE": ROLE, "AWS_ENDPOINT_URL": endpoint,
            "AWS_SHARED_CREDENTIALS_FILE": str(work / "no-credentials"),
            "HOME": str(work)}  # pcluster logs to ~/.parallelcluster


def as_the_worker(patch: pytest.MonkeyPatch, principals: dict, connection_env: dict, binary: Path) -> None:
    """A worker whose own environment holds Airflow's keys, and ``pcluster_default`` as the docs say."""
    airflow = principals["airflow"]
    for name, value in {"AWS_ACCESS_KEY_ID": airflow.key, "AWS_SECRET_ACCESS_KEY": airflow.secret,
                        "AWS_SESSION_TOKEN": ""}.items():   # present, and dropped with the keys
        patch.setenv(name, value)
    patch.setenv("AIRFLOW_CONN_PCLUSTER_DEFAULT", json.dumps({"conn_type": "pcluster", "extra": {
        "binary": str(binary), "region": REGION, "env": connection_env}}))


@pytest.fixture
def hook(principals, connection_env, real_pcluster, monkeypatch) -> ParallelClusterHook:
    as_the_worker(monkeypatch, principals, connection_env, real_pcluster)
    return ParallelClusterHook()   # the default connection, as the operators use it


def logged(principal_log: Path, since: int) -> list[dict]:
    """The requests the server judged after byte ``since`` of its log."""
    with principal_log.open(encoding="utf-8") as log:
        log.seek(since)
        return [json.loads(line) for line in log.read().splitlines()]


def calls_of(principal_log: Path, run) -> list[dict]:
    """``run()``, and every request the server judged meanwhile (only the CLI talks to it then)."""
    since = principal_log.stat().st_size if principal_log.exists() else 0
    run()
    return logged(principal_log, since)


@pytest.fixture(scope="module")
def cli_calls(principals, connection_env, real_pcluster, principal_log, tmp_path_factory) -> dict[str, list[dict]]:
    """The calls of three verbs of the real CLI, run through the hook (``hook``, module-scoped)."""
    work = tmp_path_factory.mktemp("dryrun")
    (work / "cluster-config.yaml").write_text(moto_config(principals["account"]))
    with pytest.MonkeyPatch.context() as patch:
        as_the_worker(patch, principals, connection_env, real_pcluster)
        hook = ParallelClusterHook()
        results: dict = {}
        started = time.monotonic()

        def describe_missing():
            with pytest.raises(ClusterNotFoundError):
                hook.describe_cluster("uc-not-there")

        def dryrun():
            results["dryrun"] = hook.create_cluster(CLUSTER, str(work / "cluster-config.yaml"),
                                                    suppress_validators=MOTO_GAPS, dryrun=True)

        calls = {"list-clusters": calls_of(principal_log, lambda: results.setdefault("list", hook.list_clusters())),
                 "describe-cluster": calls_of(principal_log, describe_missing),
                 "create-cluster --dryrun true": calls_of(principal_log, dryrun)}
    print(f"three pcluster verbs in {time.monotonic() - started:.0f} s")
    assert results["list"] == [] and results["dryrun"]["message"] == DRYRUN_SUCCEEDED
    return calls


def assumed_by(role: str) -> str:
    return f"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/"


def test_every_call_the_cli_makes_is_signed_by_the_pcluster_role(cli_calls, principals):
    airflow = principals["airflow"]
    for verb, calls in cli_calls.items():
        actions = sorted({c["action"] for c in calls})
        print(f"{verb}: {len(calls)} calls: {', '.join(actions)}")
        own = [c for c in calls if c["action"] != "sts:AssumeRole"]
        assert own, f"{verb} made no call of its own"
        assert [c for c in own if not c["principal"].startswith(assumed_by(ROLE))] == [], verb
        assert all(c["allowed"] for c in own), [c for c in own if not c["allowed"]]
        # Airflow's principal signs exactly the AssumeRole of the pcluster role, and nothing else.
        assert [(c["action"], c["resource"], c["allowed"]) for c in calls if c["principal"] == airflow.arn] == [
            ("sts:AssumeRole", principals["role_arn"], True)], verb
    # The dry run is the one that reaches past CloudFormation: EC2's reads, the node script's S3 object.
    dryrun_actions = {c["action"] for c in cli_calls["create-cluster --dryrun true"]}
    assert {"ec2:DescribeSubnets", "ec2:DescribeImages"} <= dryrun_actions, dryrun_actions


def test_airflow_is_denied_what_only_the_pcluster_role_may_do(endpoint, principals, principal_log):
    """What makes the split matter: a cluster's stack and ParallelCluster's bucket are the pcluster
    role's; the same calls signed by Airflow are denied (and by the role, allowed)."""
    airflow = principals["airflow"]
    template = '{"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}}'
    bucket = f"parallelcluster-{'0' * 16}-v1-do-not-delete"
    calls = {
        "cloudformation:CreateStack": lambda c: c("cloudformation").create_stack(StackName=PCLUSTER_ONLY_STACK,
                                                                                 TemplateBody=template),
        "s3:CreateBucket": lambda c: c("s3").create_bucket(Bucket=bucket),
    }
    since = principal_log.stat().st_size
    for call in calls.values():
        with pytest.raises(ClientError) as denied:
            call(airflow.client)
        assert denied.value.response["Error"]["Code"] == "AccessDenied", denied.value
    assert [(c["action"], c["allowed"]) for c in logged(principal_log, since) if c["principal"] == airflow.arn] == [
        (action, False) for action in calls]
    # The role, assumed as the CLI assumes it, may.
    creds = airflow.client("sts").assume_role(RoleArn=principals["role_arn"], RoleSessionName="check")["Credentials"]
    session = boto3.Session(aws_access_key_id=creds["AccessKeyId"], aws_secret_access_key=creds["SecretAccessKey"],
                            aws_session_token=creds["SessionToken"], region_name=REGION)
    for call in calls.values():
        call(lambda service: session.client(service, endpoint_url=endpoint))
    client(endpoint, "cloudformation").delete_stack(StackName=PCLUSTER_ONLY_STACK)
    client(endpoint, "s3").delete_bucket(Bucket=bucket)


def without(policy: dict, action: str) -> dict:
    statements = []
    for statement in policy["Statement"]:
        actions = [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
        kept = [a for a in actions if a != action or statement["Effect"] == "Deny"]
        if kept:
            statements.append({**statement, "Action": kept})
    return {**policy, "Statement": statements}


def test_a_call_the_role_lacks_fails_the_task_at_once_naming_the_action(hook, endpoint):
    put_role_policy(endpoint, ROLE, without(pcluster_policy(), "cloudformation:DescribeStacks"))
    try:
        with pytest.raises(PclusterAccessDeniedError) as denied:
            hook.list_clusters()
    finally:
        put_role_policy(endpoint, ROLE, pcluster_policy())
    err = denied.value
    assert err.action == "cloudformation:DescribeStacks"
    assert "cloudformation:DescribeStacks" in str(err) and f"assumed-role/{ROLE}/" in str(err)
    decision = DeniedCallsFail().evaluate(err, try_number=1, max_tries=3)
    assert decision.action == RetryAction.FAIL and "cloudformation:DescribeStacks" in decision.reason
    # Restored, the same call passes: the denial was the policy's, not the set-up's.
    assert hook.list_clusters() == []
