"""The orphan reaper against the real moto server and the local pcluster CLI (no fakes of AWS or
pcluster): what it deletes is verified gone, what it must not touch is still there, a stack that
fails to delete is reported with its failed resources and deleted again.

Run states come from the reaper's state callable: a dict here (the DAG asks the Task SDK, the CLI
the REST API; the CLI's is exercised against a REST API stub below).
"""
from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.fixtures_localcluster import REGION, TEST_SLOTS, wait_for_status, wait_until_gone
from tests.unit.airflow_stub import DAG, cli, run
from tests.unit.airflow_stub import no_ambient_config, stub  # noqa: F401 - fixtures
from ultracluster.run.names import safe_run_id
from ultracluster.reaper import build_reaper
from ultracluster.run.tags import ownership_tags, s3_tagging

pytestmark = pytest.mark.localcluster

VPC_TEMPLATE = Path(__file__).resolve().parents[2] / "include" / "cluster" / "vpc.yaml"
PIPELINE = "trn1_bert_pretrain"
ENDED, LIVE, GONE, FRESH = "manual__ended", "manual__live", "manual__gone", "manual__fresh"
STATES = {ENDED: "success", LIVE: "running"}  # GONE and FRESH: Airflow has no such run
BUCKET, ARTIFACTS = "ultracluster-artifacts", "s3://ultracluster-artifacts/runs"
NOW = datetime.now(timezone.utc)


def marked(run_id: str, *, expired: bool = True) -> dict[str, str]:
    start = NOW - timedelta(hours=30 if expired else 0)
    return ownership_tags(PIPELINE, run_id, started_at=start, ttl_hours=24)


@pytest.fixture
def airflow_connections(uc_home: Path, uc_env: dict[str, str], monkeypatch) -> Iterator[dict[str, Any]]:
    """The hooks' connections as `local-ultracluster up` wrote them (airflow.env), and boto3 clients."""
    for line in (uc_home / "airflow.env").read_text().splitlines():
        if line.startswith("AIRFLOW_CONN_"):
            name, _, value = line.partition("=")
            monkeypatch.setenv(name, shlex.split(value)[0])
    for name in (*TEST_SLOTS, "LOCAL_UC_PROVISIONING_DELAY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, uc_env[name])
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)  # the connection names the endpoint
    kw = dict(region_name=REGION, endpoint_url=uc_env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
              aws_secret_access_key="testing")
    clients = {"cfn": boto3.client("cloudformation", **kw), "ec2": boto3.client("ec2", **kw),
               "s3": boto3.client("s3", **kw)}
    yield clients
    # The moto server lives for the session: leave no stack of ours (nor a blocker) to later tests.
    for stack in clients["cfn"].describe_stacks()["Stacks"]:
        tags = {t["Key"]: t["Value"] for t in stack.get("Tags") or []}
        if tags.get("ultracluster:dag-id") != PIPELINE or "parallelcluster:cluster-name" in tags:
            continue
        vpc = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs") or []}.get("VpcId")
        owned = {r.get("PhysicalResourceId") for r in clients["cfn"].describe_stack_resources(
            StackName=stack["StackName"])["StackResources"]}
        for subnet in clients["ec2"].describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]:
            if subnet["SubnetId"] not in owned:
                clients["ec2"].delete_subnet(SubnetId=subnet["SubnetId"])
        clients["cfn"].delete_stack(StackName=stack["StackName"])
    for run_id in (ENDED, LIVE):
        prefix = f"runs/{PIPELINE}/{safe_run_id(run_id)}/"
        for found in clients["s3"].list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []):
            clients["s3"].delete_object(Bucket=BUCKET, Key=found["Key"])


def create_stack(aws: dict[str, Any], name: str, tags: dict[str, str]) -> str:
    zone = aws["ec2"].describe_availability_zones()["AvailabilityZones"][0]
    aws["cfn"].create_stack(StackName=name, TemplateBody=VPC_TEMPLATE.read_text(), Parameters=[
        {"ParameterKey": "AvailabilityZone", "ParameterValue": zone["ZoneName"]},
        {"ParameterKey": "AvailabilityZoneId", "ParameterValue": zone["ZoneId"]},
    ], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    stack = aws["cfn"].describe_stacks(StackName=name)["Stacks"][0]
    assert stack["StackStatus"] == "CREATE_COMPLETE", stack
    return {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}["VpcId"]


def stack_status(aws: dict[str, Any], name: str) -> str | None:
    try:
        return aws["cfn"].describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
    except ClientError as err:
        assert "does not exist" in str(err)
        return None


def put_scratch(aws: dict[str, Any], run_id: str, tags: dict[str, str]) -> str:
    prefix = f"runs/{PIPELINE}/{safe_run_id(run_id)}"
    aws["s3"].put_object(Bucket=BUCKET, Key=f"{prefix}/on_node_configured.sh", Body=b"#!/bin/sh\n",
                         Tagging=s3_tagging(tags))
    aws["s3"].put_object(Bucket=BUCKET, Key=f"{prefix}/cluster-config.yaml", Body=b"Region: us-east-1\n")
    return prefix


def keys(aws: dict[str, Any]) -> set[str]:
    return {o["Key"] for o in aws["s3"].list_objects_v2(Bucket=BUCKET, Prefix="runs/").get("Contents", [])}


def cluster_exists(pcluster: Callable[..., tuple[int, Any]], name: str) -> bool:
    code, described = pcluster("describe-cluster", "-n", name)
    assert code == 0 or "does not exist" in described.get("message", ""), described
    return code == 0


def reaper(**options: Any):
    return build_reaper(lambda dag_id, run_id: STATES.get(run_id), region_name=REGION, artifacts_s3_uri=ARTIFACTS,
                        poll_s=0.2, **options)


def test_reap_deletes_marked_orphans_verified_and_touches_nothing_else(
        airflow_connections, pcluster, make_cluster_config, uc_env) -> None:
    aws = airflow_connections
    # Clusters: an ended run's (up and running), an expired unknown run's, a live run's, an unmarked one.
    # The last three stay CREATE_IN_PROGRESS (a long provisioning delay): no daemons needed to judge them.
    slow = {"local-ultracluster:provisioning-delay": "600"}
    for name, tags in (("orphan-ended", {**marked(ENDED, expired=False), "local-ultracluster:provisioning-delay": "0"}),
                       ("orphan-gone", {**marked(GONE), **slow}), ("live", {**marked(LIVE), **slow}),
                       ("unmarked", {"ultracluster:run-id": ENDED, "team": "other", **slow})):
        code, created = pcluster("create-cluster", "-n", name, "-c", str(make_cluster_config(tags=tags)))
        assert code == 0, created
    assert wait_for_status(uc_env, "orphan-ended", {"CREATE_COMPLETE"})["clusterStatus"] == "CREATE_COMPLETE"
    # Network stacks: the same four, and an unknown run's that has not expired yet.
    create_stack(aws, "uc-vpc-ended", marked(ENDED, expired=False))
    create_stack(aws, "uc-vpc-gone", marked(GONE))
    create_stack(aws, "uc-vpc-live", marked(LIVE))
    create_stack(aws, "uc-vpc-fresh", marked(FRESH, expired=False))
    create_stack(aws, "someone-elses", {"ultracluster:run-id": ENDED, "ultracluster:dag-id": PIPELINE})
    ended_scratch = put_scratch(aws, ENDED, marked(ENDED))
    live_scratch = put_scratch(aws, LIVE, marked(LIVE))
    before = keys(aws)

    dry = reaper().reap(dry_run=True)
    orphans = sorted((v.kind, v.name, v.reason) for v in dry.orphans)
    assert orphans == [
        ("cluster", "orphan-ended", "run ended (success)"),
        ("cluster", "orphan-gone", f"expired {marked(GONE)['ultracluster:expires-at']} and run unknown"),
        ("scratch", f"s3://{BUCKET}/{ended_scratch}/on_node_configured.sh", "run ended (success)"),
        ("stack", "uc-vpc-ended", "run ended (success)"),
        ("stack", "uc-vpc-gone", f"expired {marked(GONE)['ultracluster:expires-at']} and run unknown"),
    ]
    assert dry.deleted == [] and dry.left == {}
    assert all(cluster_exists(pcluster, n) for n in ("orphan-ended", "orphan-gone", "live", "unmarked"))
    assert stack_status(aws, "uc-vpc-ended") == stack_status(aws, "uc-vpc-gone") == "CREATE_COMPLETE"
    assert keys(aws) == before

    result = reaper().reap()
    assert sorted(v.name for v in result.deleted) == sorted(v.name for v in dry.orphans)
    assert result.left == {}
    # Gone, as the provider reports it, not as the reaper says.
    assert not cluster_exists(pcluster, "orphan-ended") and not cluster_exists(pcluster, "orphan-gone")
    assert stack_status(aws, "uc-vpc-ended") is None and stack_status(aws, "uc-vpc-gone") is None
    assert keys(aws) == before - {f"{ended_scratch}/on_node_configured.sh"}  # the config is a record: kept
    # Untouched: the live run's, the unmarked, the not-yet-expired.
    assert cluster_exists(pcluster, "live") and cluster_exists(pcluster, "unmarked")
    for name in ("uc-vpc-live", "uc-vpc-fresh", "someone-elses"):
        assert stack_status(aws, name) == "CREATE_COMPLETE", name
    assert f"{live_scratch}/on_node_configured.sh" in keys(aws)
    kept = {v.name: v.reason for v in result.verdicts if not v.reap}
    assert kept["live"] == kept["uc-vpc-live"] == "kept: run is running"
    assert kept["unmarked"] == kept["someone-elses"] == "kept: no ultracluster:created-by=ultracluster marker"
    assert kept["uc-vpc-fresh"].startswith("kept: run unknown, expires ")

    for name in ("live", "unmarked"):  # leave the home as found
        pcluster("delete-cluster", "-n", name)
        wait_until_gone(uc_env, name)


def test_a_delete_failed_stack_is_reported_with_its_failed_resources_and_deleted_again(
        airflow_connections, caplog) -> None:
    aws = airflow_connections
    # A subnet made outside the stack in its VPC: the VPC cannot be deleted (DependencyViolation),
    # so the stack ends DELETE_FAILED, as on AWS. Removed between the attempts: the second succeeds.
    healed_vpc = create_stack(aws, "uc-vpc-heals", marked(ENDED))
    healed_blocker = aws["ec2"].create_subnet(VpcId=healed_vpc, CidrBlock="10.0.16.0/24")["Subnet"]["SubnetId"]
    stuck_vpc = create_stack(aws, "uc-vpc-stuck", marked(ENDED))
    aws["ec2"].create_subnet(VpcId=stuck_vpc, CidrBlock="10.0.17.0/24")
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if stack_status(aws, "uc-vpc-heals") == "DELETE_FAILED":  # its blocker goes away before the retry
            aws["ec2"].delete_subnet(SubnetId=healed_blocker)

    with caplog.at_level(logging.INFO):
        result = reaper(sleep=pause, retry_delay_s=7, max_delete_attempts=3).reap()

    assert [v.name for v in result.deleted] == ["uc-vpc-heals"]
    assert stack_status(aws, "uc-vpc-heals") is None
    assert stack_status(aws, "uc-vpc-stuck") == "DELETE_FAILED"
    reasons = result.left["stack uc-vpc-stuck"]
    assert any(r.startswith("Vpc (AWS::EC2::VPC) DELETE_FAILED: ") and "has dependencies" in r for r in reasons), reasons
    # Retried: a pause after each failed attempt but the last; every attempt's failure logged.
    assert pauses == [7, 7, 7]  # heals: one failed attempt; stuck: three, two pauses
    text = caplog.text
    assert "Deleting stack uc-vpc-heals, attempt 2/3" in text
    assert "Deleting stack uc-vpc-stuck, attempt 3/3" in text
    assert text.count("stack uc-vpc-stuck: Vpc (AWS::EC2::VPC) DELETE_FAILED") >= 3


def test_cli_reap_dry_run_lists_what_and_why_and_deletes_nothing(
        airflow_connections, stub, capsys) -> None:
    aws = airflow_connections
    create_stack(aws, "uc-cli-ended", marked(ENDED, expired=False))
    create_stack(aws, "uc-cli-gone", marked(GONE))
    create_stack(aws, "uc-cli-live", marked(LIVE))
    stub.on("GET", f"{DAG}/dagRuns/{ENDED}", run(ENDED, "failed"))
    stub.on("GET", f"{DAG}/dagRuns/{LIVE}", run(LIVE, "queued"))  # GONE: the stub's 404

    code = cli(stub, "reap", "--dry-run", "--region", REGION, "--artifacts-s3-uri", ARTIFACTS)

    out, err = capsys.readouterr()
    assert code == 0, err
    expiry = marked(GONE)["ultracluster:expires-at"]
    assert out.splitlines() == [
        f"would delete: stack uc-cli-ended  run {PIPELINE}/{ENDED}  run ended (failed)",
        f"would delete: stack uc-cli-gone  run {PIPELINE}/{GONE}  expired {expiry} and run unknown",
    ]
    for name in ("uc-cli-ended", "uc-cli-gone", "uc-cli-live"):
        assert stack_status(aws, name) == "CREATE_COMPLETE"
    asked = {path for method, path, _ in stub.requests if method == "GET"}
    assert asked == {f"{DAG}/dagRuns/{r}" for r in (ENDED, GONE, LIVE)}
