"""ParallelClusterHook and the pcluster parser, against recorded pcluster outputs.

The hook runs a real subprocess: a stand-in `pcluster` (tests/fixtures/pcluster/fake_pcluster.py)
that prints recorded JSON, so argv building, env passing, parsing and typed errors are all exercised.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from tests.fixtures.pcluster.fake_pcluster import RECORDED, FakePcluster
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.parsers.pcluster import (
    ClusterAlreadyExistsError,
    ClusterNotFoundError,
    ClusterValidationError,
    PclusterAccessDeniedError,
    PclusterError,
    cluster_status,
    failures,
    head_node_address,
    parse_cli_result,
)
from ultracluster.run.errors import denial_in
from ultracluster.run.tags import tags_dict

CONN_ID = "pcluster_unit"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakePcluster:
    fake = FakePcluster(tmp_path / "pcluster")
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", fake.connection_json(region="us-east-1"))
    return fake


# --- parser ----------------------------------------------------------------------------------

def test_parse_success_returns_json():
    assert parse_cli_result(0, '{"clusters": []}', "") == {"clusters": []}


def test_parse_skips_log_lines_before_json():
    assert parse_cli_result(0, 'INFO something\n{"status": "RUNNING"}', "") == {"status": "RUNNING"}


@pytest.mark.parametrize("name", ["error_describe_cluster_not_found.json", "error_delete_cluster_not_found.json",
                                  "error_describe_compute_fleet_not_found.json"])
def test_parse_not_found_is_typed(name):
    with pytest.raises(ClusterNotFoundError) as err:
        parse_cli_result(1, recorded(name), "")
    assert "does not exist" in err.value.message
    assert err.value.exit_code == 1


def test_parse_already_exists_is_typed():
    with pytest.raises(ClusterAlreadyExistsError, match="already exists"):
        parse_cli_result(1, recorded("error_cluster_already_exists.json"), "")


def test_parse_validation_errors_carry_details():
    with pytest.raises(ClusterValidationError) as err:
        parse_cli_result(1, recorded("validation_min_gt_max.json"), "")
    errors = err.value.configuration_validation_errors
    assert err.value.message == "Invalid cluster configuration."
    assert {"ComputeResourceSizeValidator", "KeyPairValidator"} <= {e["type"] for e in errors}
    assert "Max count must be greater than or equal to min count." in str(err.value)


def test_parse_other_errors_keep_pclusters_message():
    with pytest.raises(PclusterError) as err:
        parse_cli_result(1, recorded("error_config_file_not_found.json"), "")
    assert type(err.value) is PclusterError
    assert err.value.message == "Bad Request: File not found: '/nonexistent.yaml'"
    assert err.value.payload == json.loads(recorded("error_config_file_not_found.json"))


def test_parse_a_denial_is_typed_and_names_the_action():
    with pytest.raises(PclusterAccessDeniedError) as err:
        parse_cli_result(1, recorded("error_list_clusters_access_denied.json"), "")
    assert err.value.action == "cloudformation:DescribeStacks"
    assert "AWS denied pcluster's cloudformation:DescribeStacks" in str(err.value) and "assumed-role" in str(err.value)
    # As botocore's ClientError answers it: run.errors.denial_in, and so the retry policy, find it.
    assert denial_in(err.value) is err.value and err.value.response["Error"]["Code"] == "AccessDenied"


@pytest.mark.parametrize("message, action", [
    # AWS's full wording (IAM User Guide, "Troubleshoot access denied error messages").
    ("User: arn:aws:sts::123456789012:assumed-role/ultracluster-pcluster/s is not authorized to perform: "
     "iam:CreateRole on resource: arn:aws:iam::123456789012:role/parallelcluster/x because no identity-based "
     "policy allows the iam:CreateRole action", "iam:CreateRole"),
    # EC2's UnauthorizedOperation names no action; S3's AccessDenied, through pcluster's own wording, neither.
    ("You are not authorized to perform this operation. Encoded authorization failure message: abc", None),
    ("You do not have access to the S3 bucket 'b': 'Access Denied'", None),
])
def test_parse_denials_in_awss_other_wordings(message, action):
    with pytest.raises(PclusterAccessDeniedError) as err:
        parse_cli_result(1, json.dumps({"message": message}), "")
    assert err.value.action == action
    assert ("one of pcluster's calls" in str(err.value)) is (action is None)


def test_parse_non_json_failure_reports_stderr():
    with pytest.raises(PclusterError, match="Traceback: boom"):
        parse_cli_result(2, "", "Traceback: boom")


def test_parse_exit_zero_without_json_is_an_error():
    with pytest.raises(PclusterError, match="did not print a JSON object"):
        parse_cli_result(0, "not json", "")


def test_description_helpers():
    from tests.fixtures.pcluster.fake_pcluster import FIXTURES

    complete = json.loads((FIXTURES / "describe_cluster_create_complete.json").read_text())
    failed = json.loads((FIXTURES / "describe_cluster_create_failed.json").read_text())
    created = json.loads((FIXTURES / "create_cluster.json").read_text())
    assert head_node_address(complete) == "198.51.100.44"
    assert tags_dict(complete)["ultracluster:run-id"] == "manual__2026-11-30T08:00:00+00:00"
    assert failures(failed)[0]["failureCode"] == "OnNodeConfiguredExecutionFailure"
    # create nests the cluster under "cluster", describe does not.
    assert cluster_status(created) == "CREATE_IN_PROGRESS"
    assert cluster_status(complete) == "CREATE_COMPLETE"


# --- hook --------------------------------------------------------------------------------------

def test_create_cluster_argv_and_env(fake, tmp_path):
    fake.respond("create-cluster", "create_cluster.json")
    config = tmp_path / "cluster.yaml"
    config.write_text("Region: us-east-1\n")
    result = ParallelClusterHook(CONN_ID).create_cluster(
        "uc-test", str(config), suppress_validators=["type:KeyPairValidator"]
    )
    assert result["cluster"]["clusterStatus"] == "CREATE_IN_PROGRESS"
    assert fake.calls() == [[
        "create-cluster", "--cluster-name", "uc-test", "--cluster-configuration", str(config),
        "--rollback-on-failure", "false", "--suppress-validators", "type:KeyPairValidator",
        "--region", "us-east-1",
    ]]


def test_region_override_wins_over_connection(fake):
    fake.respond("describe-cluster", "describe_cluster_create_complete.json")
    ParallelClusterHook(CONN_ID, region_name="us-west-2").describe_cluster("uc-test")
    assert fake.calls()[0][-2:] == ["--region", "us-west-2"]


def test_create_cluster_validation_failure_raises_typed(fake, tmp_path):
    fake.respond("create-cluster", ("validation_keypair_missing.json", 1))
    with pytest.raises(ClusterValidationError) as err:
        ParallelClusterHook(CONN_ID).create_cluster("uc-test", str(tmp_path / "c.yaml"))
    assert any(e["type"] == "KeyPairValidator" for e in err.value.configuration_validation_errors)


def test_describe_and_delete(fake):
    fake.respond("describe-cluster", "describe_cluster_create_complete.json")
    fake.respond("delete-cluster", "delete_cluster.json")
    hook = ParallelClusterHook(CONN_ID)
    assert hook.describe_cluster("uc-test")["clusterStatus"] == "CREATE_COMPLETE"
    assert hook.delete_cluster("uc-test")["cluster"]["clusterStatus"] == "DELETE_IN_PROGRESS"
    assert fake.calls()[1][:3] == ["delete-cluster", "--cluster-name", "uc-test"]


def test_describe_missing_cluster_raises_not_found(fake):
    fake.respond("describe-cluster", ("error_describe_cluster_not_found.json", 1))
    with pytest.raises(ClusterNotFoundError):
        ParallelClusterHook(CONN_ID).describe_cluster("nothere")


def test_describe_cluster_instances_follows_next_token(fake):
    fake.respond("describe-cluster-instances", "describe_cluster_instances_page1.json",
                 "describe_cluster_instances_page2.json")
    instances = ParallelClusterHook(CONN_ID).describe_cluster_instances("uc-test")
    assert [i["nodeType"] for i in instances] == ["HeadNode", "ComputeNode"]
    assert "--next-token" not in fake.calls()[0]
    assert fake.calls()[1][fake.calls()[1].index("--next-token") + 1] == "page2"


def test_list_clusters_and_compute_fleet(fake):
    fake.respond("list-clusters", "list_clusters.json")
    fake.respond("describe-compute-fleet", "describe_compute_fleet.json")
    fake.respond("update-compute-fleet", "update_compute_fleet.json")
    hook = ParallelClusterHook(CONN_ID)
    assert [c["clusterName"] for c in hook.list_clusters()] == ["uc-test"]
    assert hook.describe_compute_fleet("uc-test")["status"] == "RUNNING"
    assert hook.update_compute_fleet("uc-test", "STOP_REQUESTED")["status"] == "STOP_REQUESTED"
    assert fake.calls()[2][:5] == ["update-compute-fleet", "--cluster-name", "uc-test", "--status", "STOP_REQUESTED"]


def test_adescribe_cluster_runs_async(fake):
    fake.respond("describe-cluster", "describe_cluster_create_in_progress.json")
    result = asyncio.run(ParallelClusterHook(CONN_ID).adescribe_cluster("uc-test"))
    assert result["clusterStatus"] == "CREATE_IN_PROGRESS"


def test_adescribe_missing_cluster_raises_not_found(fake):
    fake.respond("describe-cluster", ("error_describe_cluster_not_found.json", 1))
    with pytest.raises(ClusterNotFoundError):
        asyncio.run(ParallelClusterHook(CONN_ID).adescribe_cluster("nothere"))


def test_missing_binary_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PCLUSTER_NOBIN", json.dumps(
        {"conn_type": "pcluster", "extra": {"binary": "pcluster-does-not-exist-here"}}))
    with pytest.raises(PclusterError, match="pcluster-does-not-exist-here.*not found"):
        ParallelClusterHook("pcluster_nobin").describe_cluster("x")


def test_a_profile_keeps_the_workers_keys_from_the_cli(monkeypatch, tmp_path):
    """The worker's own keys would win over the profile in botocore: the CLI would sign as Airflow
    (tests/integration/test_pcluster_role_principal.py shows it against the real CLI)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAAIRFLOWOWNKEY000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "airflow-secret")
    extra = {"binary": "/bin/true", "env": {"AWS_PROFILE": "ultracluster-pcluster", "AWS_CONFIG_FILE": "/etc/c"}}
    monkeypatch.setenv("AIRFLOW_CONN_PCLUSTER_PROFILE", json.dumps({"conn_type": "pcluster", "extra": extra}))
    env = ParallelClusterHook("pcluster_profile").get_conn()["env"]
    assert env["AWS_PROFILE"] == "ultracluster-pcluster" and "AWS_ACCESS_KEY_ID" not in env
    assert "AWS_SECRET_ACCESS_KEY" not in env
    extra["env"]["AWS_SECRET_ACCESS_KEY"] = "a-stored-secret"
    monkeypatch.setenv("AIRFLOW_CONN_PCLUSTER_BOTH", json.dumps({"conn_type": "pcluster", "extra": extra}))
    with pytest.raises(PclusterError, match="pcluster_both.*profile and sets AWS_SECRET_ACCESS_KEY") as refused:
        ParallelClusterHook("pcluster_both").get_conn()
    assert "a-stored-secret" not in str(refused.value)


# --- create-cluster --dryrun true ----------------------------------------------------------------

def test_dryrun_that_would_succeed_is_returned_not_raised(fake, tmp_path):
    # pcluster answers a config it would accept with exit 1 (recorded from 3.16.1).
    fake.respond("create-cluster", ("create_cluster_dryrun.json", 1))
    result = ParallelClusterHook(CONN_ID).create_cluster(
        "uc-test", str(tmp_path / "c.yaml"), suppress_validators=["type:KeyPairValidator"], dryrun=True)
    assert result["message"] == "Request would have succeeded, but DryRun flag is set."
    assert {m["type"] for m in result["validationMessages"]} >= {"DeletionPolicyValidator"}
    assert fake.calls() == [[
        "create-cluster", "--cluster-name", "uc-test", "--cluster-configuration", str(tmp_path / "c.yaml"),
        "--rollback-on-failure", "false", "--suppress-validators", "type:KeyPairValidator",
        "--dryrun", "true", "--region", "us-east-1",
    ]]


def test_dryrun_refusal_raises_typed_and_is_a_config_refusal(fake, tmp_path):
    from ultracluster.parsers.pcluster import config_refused, dryrun_succeeded

    fake.respond("create-cluster", ("validation_min_gt_max.json", 1))
    with pytest.raises(ClusterValidationError) as err:
        ParallelClusterHook(CONN_ID).create_cluster("uc-test", str(tmp_path / "c.yaml"), dryrun=True)
    assert config_refused(err.value) and not dryrun_succeeded(err.value)


@pytest.mark.parametrize("name", [
    "error_subnet_not_found.json",         # "Invalid cluster configuration: The subnet ID ... does not exist"
    "error_cluster_name_pattern.json",     # "Bad Request: ..."
    "error_cluster_already_exists.json",   # "Bad Request: Cluster ... already exists."
])
def test_plain_400s_are_config_refusals(name):
    from ultracluster.parsers.pcluster import config_refused

    with pytest.raises(PclusterError) as err:
        parse_cli_result(1, recorded(name), "")
    assert config_refused(err.value)


def test_throttling_or_a_crash_is_not_a_config_refusal():
    from ultracluster.parsers.pcluster import config_refused

    for stdout in ('{"message": "Limit exceeded: Rate exceeded"}', "Traceback (most recent call last): ..."):
        with pytest.raises(PclusterError) as err:
            parse_cli_result(1, stdout, "boom")
        assert not config_refused(err.value), stdout


# --- stack events and head node logs ----------------------------------------------------------------

def test_stack_events_log_streams_and_log_events(fake):
    from ultracluster.parsers.pcluster import (
        HEAD_NODE_LOG_FILTER,
        bootstrap_log_stream,
        failed_stack_events,
        is_config_failure,
        log_event_messages,
    )

    fake.respond("get-cluster-stack-events", "get_cluster_stack_events_create_failed.json")
    fake.respond("list-cluster-log-streams", "list_cluster_log_streams_head_node.json")
    fake.respond("get-cluster-log-events", "get_cluster_log_events_cfn_init.json")
    hook = ParallelClusterHook(CONN_ID)
    events = hook.get_cluster_stack_events("uc-test")
    streams = hook.list_cluster_log_streams("uc-test", filters=[HEAD_NODE_LOG_FILTER])
    tail = hook.get_cluster_log_events("uc-test", streams[0]["logStreamName"], limit=50, start_from_head=False)
    assert [argv[:5] for argv in fake.calls()] == [
        ["get-cluster-stack-events", "--cluster-name", "uc-test", "--region", "us-east-1"],
        ["list-cluster-log-streams", "--cluster-name", "uc-test", "--filters", "Name=node-type,Values=HeadNode"],
        ["get-cluster-log-events", "--cluster-name", "uc-test", "--log-stream-name",
         "ip-10-0-1-196.i-1234567890abcdef0.cfn-init"]]
    assert fake.calls()[2][5:9] == ["--limit", "50", "--start-from-head", "false"]

    failed = failed_stack_events(events, limit=5)
    assert [(e["logicalResourceId"], e["resourceStatus"]) for e in failed] == [
        ("uc-test", "CREATE_FAILED"), ("HeadNodeWaitCondition20261130080116", "CREATE_FAILED")]
    assert failed_stack_events(list(reversed(events)), limit=1) == failed[:1]   # newest first, whatever the order
    on_node_configured = [{"failureCode": "OnNodeConfiguredExecutionFailure"}]
    assert bootstrap_log_stream(streams, on_node_configured).endswith(".cfn-init")
    assert bootstrap_log_stream(streams, [{"failureCode": "FsxMountFailure"}]).endswith(".chef-client")
    assert bootstrap_log_stream([{"logStreamName": "ip-1.i-1.cloud-init-output"}], []) == "ip-1.i-1.cloud-init-output"
    assert bootstrap_log_stream([{"logStreamName": "ip-1.i-1.slurmctld"}], []) is None
    assert is_config_failure(on_node_configured) and not is_config_failure([{"failureCode": "HeadNodeBootstrapFailure"}])
    assert log_event_messages(tail)[-1].endswith("BUILD FAILED!------------------------")
    assert log_event_messages({"events": [{"message": "curl https://b.s3.amazonaws.com/k?X-Amz-Signature=abc\n"}]}) == [
        "curl <redacted presigned URL>"]


def test_stack_events_follow_next_token_a_few_pages(fake, tmp_path):
    page = json.loads((RECORDED / "get_cluster_stack_events.json").read_text())
    fake.respond_text("get-cluster-stack-events", json.dumps({**page, "nextToken": "more"}))
    events = ParallelClusterHook(CONN_ID).get_cluster_stack_events("uc-test", max_pages=2)
    assert len(events) == 2 * len(page["events"])
    assert fake.calls()[1][3:5] == ["--next-token", "more"]
