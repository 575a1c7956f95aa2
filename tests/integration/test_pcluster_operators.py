"""pcluster_create / delete_cluster against the stand-in pcluster (recorded outputs) and moto S3."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from tests.fixtures.pcluster.fake_pcluster import FIXTURES, FakePcluster
from ultracluster.operators.pcluster import CreateClusterOperator
from ultracluster.operators.pcluster_delete import DeleteClusterOperator
from ultracluster.parsers.pcluster import ClusterAlreadyExistsError, ClusterValidationError
from ultracluster.run.events import event
from ultracluster.triggers.pcluster import ClusterStatusTrigger

REGION = "us-east-1"
RUN_ID = "manual__2026-11-30T08:00:00+00:00"  # tagged in the fixtures
CONFIG = {"cluster_name": "uc-test", "bucket": "ultracluster-artifacts", "config_s3_key": "runs/x/cluster-config.yaml",
          "config_s3_uri": "s3://ultracluster-artifacts/runs/x/cluster-config.yaml"}
CONFIG_YAML = "Region: us-east-1\nImage:\n  Os: ubuntu2204\n"


class RecordingTaskInstance:
    def __init__(self, try_number: int = 1):
        self.xcom = {}
        self.try_number = try_number

    def xcom_push(self, key, value):
        self.xcom[key] = value


def make_context(run_id: str = RUN_ID, try_number: int = 1) -> dict:
    return {"run_id": run_id, "params": {}, "dag": SimpleNamespace(dag_id="trn1_bert_pretrain"),
            "ti": RecordingTaskInstance(try_number)}


@pytest.fixture
def env(tmp_path, monkeypatch):
    from moto import mock_aws

    fake = FakePcluster(tmp_path / "pcluster")
    monkeypatch.setenv("AIRFLOW_CONN_PCLUSTER_DEFAULT", fake.connection_json())
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": {"region_name": REGION}}))
    with mock_aws():
        import boto3

        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket="ultracluster-artifacts")
        s3.put_object(Bucket="ultracluster-artifacts", Key=CONFIG["config_s3_key"], Body=CONFIG_YAML.encode())
        yield fake


def create_op(**overrides) -> CreateClusterOperator:
    kwargs = dict(task_id="pcluster_create", cluster_config=CONFIG, poll_interval=1, max_attempts=10)
    kwargs.update(overrides)
    return CreateClusterOperator(**kwargs)


def test_create_submits_the_config_from_s3_and_defers(env):
    env.respond("describe-cluster", "describe_cluster_create_in_progress.json")
    env.respond("create-cluster", "create_cluster.json")
    context = make_context()
    with pytest.raises(TaskDeferred) as deferred:
        create_op().execute(context)

    # A first try has no earlier cluster to find, and the wait starts from create-cluster's answer.
    assert env.verbs() == ["create-cluster"]
    create_argv = next(argv for argv in env.calls() if argv[0] == "create-cluster")
    assert create_argv[1:3] == ["--cluster-name", "uc-test"]
    config_path = create_argv[create_argv.index("--cluster-configuration") + 1]
    assert config_path.endswith("cluster-config.yaml")
    trigger = deferred.value.trigger
    assert isinstance(trigger, ClusterStatusTrigger)
    assert (trigger.waiter_name, trigger.owner_run_id, trigger.delete_on_kill) == ("ClusterCreateComplete", RUN_ID, True)
    # The stack's link was pushed before the deferral: it shows while the cluster is created.
    from ultracluster.links import ParallelClusterStackLink

    values = context["ti"].xcom[ParallelClusterStackLink.key]
    assert values["stack_name"].startswith("arn:aws:cloudformation:") and values["region_name"] == REGION
    assert ParallelClusterStackLink().format_link(**values).startswith(
        "https://console.aws.amazon.com/cloudformation/home?region=us-east-1#/stacks/stackinfo?"
        "stackId=arn%3Aaws%3Acloudformation%3Aus-east-1%3A")


def test_the_cli_got_the_yaml_render_config_uploaded(env, tmp_path, monkeypatch):
    # The stand-in records argv only; a wrapper copies the config file so the test can read it.
    copy = tmp_path / "seen.yaml"
    wrapper = tmp_path / "pcluster-wrapper"
    wrapper.write_text(
        "#!/bin/bash\nprev=''\nfor a in \"$@\"; do\n"
        f"  if [ \"$prev\" = --cluster-configuration ]; then cp \"$a\" {copy}; fi\n  prev=$a\ndone\n"
        f"exec {env.binary} \"$@\"\n"
    )
    wrapper.chmod(0o755)
    conn = json.loads(env.connection_json())
    conn["extra"]["binary"] = str(wrapper)
    monkeypatch.setenv("AIRFLOW_CONN_PCLUSTER_WRAPPED", json.dumps(conn))
    env.respond("create-cluster", "create_cluster.json")
    with pytest.raises(TaskDeferred):
        create_op(pcluster_conn_id="pcluster_wrapped").execute(make_context())
    assert copy.read_text() == CONFIG_YAML


def test_retry_reattaches_to_this_runs_cluster(env):
    env.respond("describe-cluster", "describe_cluster_create_in_progress.json")
    with pytest.raises(TaskDeferred):
        create_op().execute(make_context(try_number=2))
    assert "create-cluster" not in env.verbs()


def test_a_first_try_that_finds_its_cluster_taken_reattaches_only_to_this_runs(env):
    # An earlier try whose record was lost (or a second scheduler) created it: create-cluster says so.
    env.respond("create-cluster", ("error_cluster_already_exists.json", 1))
    env.respond("describe-cluster", "describe_cluster_create_in_progress.json")
    with pytest.raises(TaskDeferred) as deferred:
        create_op().execute(make_context())
    assert env.verbs() == ["create-cluster", "describe-cluster"]
    assert deferred.value.trigger.waiter_name == "ClusterCreateComplete"
    with pytest.raises(ClusterAlreadyExistsError, match="belongs to run"):
        create_op().execute(make_context(run_id="manual__someone_else"))
    assert "delete-cluster" not in env.verbs()


def test_retry_after_completion_returns_without_waiting(env):
    env.respond("describe-cluster", "describe_cluster_create_complete.json")
    result = create_op().execute(make_context(try_number=2))
    assert result["cluster_status"] == "CREATE_COMPLETE" and result["head_node"]["publicIpAddress"] == "198.51.100.44"
    assert "SECRETSIGNATURE" not in json.dumps(result)
    assert env.verbs() == ["describe-cluster"]


def test_a_cluster_being_deleted_is_waited_for_then_created_again(env):
    env.respond("describe-cluster", "describe_cluster_delete_in_progress.json",
                ("error_describe_cluster_not_found.json", 1), "describe_cluster_create_in_progress.json")
    env.respond("create-cluster", "create_cluster.json")
    op = create_op()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context(try_number=2))
    assert (deferred.value.trigger.waiter_name, deferred.value.method_name) == (
        "ClusterDeleteComplete", "create_after_delete")
    assert "create-cluster" not in env.verbs()
    with pytest.raises(TaskDeferred) as again:
        op.create_after_delete(make_context(try_number=2), event("complete", cluster_status="DELETE_COMPLETE"))
    assert again.value.trigger.waiter_name == "ClusterCreateComplete"
    assert env.verbs().count("create-cluster") == 1


def test_a_cluster_of_another_run_is_not_adopted(env):
    env.respond("describe-cluster", "describe_cluster_create_complete.json")
    with pytest.raises(ClusterAlreadyExistsError, match="belongs to run"):
        create_op().execute(make_context(run_id="manual__someone_else", try_number=2))
    assert "delete-cluster" not in env.verbs()


def test_validation_errors_are_raised_and_nothing_is_deleted(env):
    env.respond("create-cluster", ("validation_min_gt_max.json", 1))
    with pytest.raises(ClusterValidationError, match="Max count must be greater"):
        create_op().execute(make_context())
    assert "delete-cluster" not in env.verbs()


CREATE_FAILED_EVENT = event("cluster_failed", "cluster uc-test reached CREATE_FAILED", cluster_status="CREATE_FAILED",
                            failures=[{"failureCode": "OnNodeConfiguredExecutionFailure", "failureReason": "Failed"}])


DIAGNOSTIC_VERBS = ["get-cluster-stack-events", "list-cluster-log-streams", "get-cluster-log-events"]


def script_diagnostics(env):
    env.respond("get-cluster-stack-events", "get_cluster_stack_events_create_failed.json")
    env.respond("list-cluster-log-streams", "list_cluster_log_streams_head_node.json")
    env.respond("get-cluster-log-events", "get_cluster_log_events_cfn_init.json")


def test_create_failed_deletes_and_fails_only_once_the_cluster_is_gone(env, capsys):
    """delete_vpc must not start while the failed cluster still holds the network."""
    env.respond("describe-cluster", "describe_cluster_create_failed.json")
    env.respond("delete-cluster", "delete_cluster.json")
    script_diagnostics(env)
    op = create_op()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(make_context(), CREATE_FAILED_EVENT)
    assert env.verbs() == ["describe-cluster", *DIAGNOSTIC_VERBS, "delete-cluster"]
    assert (deferred.value.trigger.waiter_name, deferred.value.method_name) == (
        "ClusterDeleteComplete", "fail_after_delete")
    # The task log: the failed stack events, newest first, and the tail of the head node's cfn-init log
    # (a custom action failed: cfn-init runs it).
    log = capsys.readouterr().out
    assert "Last failed stack events of uc-test (newest first):" in log
    assert log.index("uc-test (AWS::CloudFormation::Stack) CREATE_FAILED") < log.index(
        "HeadNodeWaitCondition20261130080116 (AWS::CloudFormation::WaitCondition) CREATE_FAILED: WaitCondition "
        "received failed message: 'Failed to execute OnNodeConfigured script 1")
    assert "Last 8 lines of the head node's bootstrap log ip-10-0-1-196.i-1234567890abcdef0.cfn-init" in log
    assert "| 2026-11-30 08:12:58,402 [ERROR] Command runpostinstall" in log
    tail_argv = next(argv for argv in env.calls() if argv[0] == "get-cluster-log-events")
    assert tail_argv[1:9] == ["--cluster-name", "uc-test", "--log-stream-name",
                              "ip-10-0-1-196.i-1234567890abcdef0.cfn-init", "--limit", "50", "--start-from-head", "false"]
    streams_argv = next(argv for argv in env.calls() if argv[0] == "list-cluster-log-streams")
    assert streams_argv[3:5] == ["--filters", "Name=node-type,Values=HeadNode"]

    # The triggerer's wait: deleting, then gone. The OnNodeConfigured script is the config's: no retry.
    env.respond("describe-cluster", "describe_cluster_delete_in_progress.json",
                ("error_describe_cluster_not_found.json", 1))
    with pytest.raises(AirflowFailException,
                       match="OnNodeConfiguredExecutionFailure: Failed.*the cluster was deleted.*not retried"):
        resume(op, make_context(), deferred.value)


def test_diagnostics_that_cannot_be_fetched_never_mask_the_failure(env, capsys):
    env.respond("describe-cluster", "describe_cluster_create_failed.json")
    env.respond("delete-cluster", "delete_cluster.json")
    env.respond_text("get-cluster-stack-events", json.dumps({"message": "Rate exceeded"}), rc=1)
    env.respond_text("list-cluster-log-streams", json.dumps(
        {"message": "CloudWatch logging is not enabled for cluster uc-test."}), rc=1)
    with pytest.raises(TaskDeferred) as deferred:
        create_op().execute_complete(make_context(), CREATE_FAILED_EVENT)
    assert deferred.value.method_name == "fail_after_delete" and "delete-cluster" in env.verbs()
    log = capsys.readouterr().out
    assert "Could not fetch the stack events of uc-test: Rate exceeded" in log
    assert "Could not fetch the head node's bootstrap log of uc-test: CloudWatch logging is not enabled" in log


def test_a_create_failed_the_config_does_not_explain_is_retried(env, tmp_path):
    description = json.loads((FIXTURES / "describe_cluster_create_failed.json").read_text())
    description["failures"] = [{"failureCode": "HeadNodeBootstrapFailure", "failureReason": "Cluster creation timed out."}]
    env.respond_text("describe-cluster", json.dumps(description))
    env.respond("delete-cluster", "delete_cluster.json")
    env.respond_text("list-cluster-log-streams", json.dumps({"logStreams": []}))
    op = create_op()
    with pytest.raises(TaskDeferred) as deferred:  # a retry finds the first try's failed cluster
        op.execute(make_context(try_number=2))
    assert deferred.value.kwargs["deterministic"] is False
    with pytest.raises(RuntimeError, match="HeadNodeBootstrapFailure: Cluster creation timed out. \\(the cluster was"):
        op.fail_after_delete(make_context(), event("complete"), **deferred.value.kwargs)


def test_create_failed_whose_delete_fails_reports_both(env):
    env.respond("describe-cluster", "describe_cluster_create_failed.json")
    env.respond("delete-cluster", "delete_cluster.json")
    op = create_op()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context(try_number=2))
    assert deferred.value.method_name == "fail_after_delete"
    env.respond("describe-cluster", "describe_cluster_delete_failed.json")
    with pytest.raises(RuntimeError, match="cluster creation failed.*deleting it failed too.*DELETE_FAILED"):
        resume(op, make_context(), deferred.value)


def test_pcluster_errors_never_carry_a_presigned_url(env):
    """describe-cluster's clusterConfiguration.url is presigned; a garbled output must not leak it."""
    from ultracluster.parsers.pcluster import PclusterError, parse_cli_result

    recorded = (Path(__file__).resolve().parents[1] / "fixtures" / "pcluster"
                / "describe_cluster_create_complete.json").read_text()
    assert "SECRETSIGNATURE" in recorded
    env.respond_text("describe-cluster", recorded[:-3])  # cut JSON, exit 0
    with pytest.raises(PclusterError) as error:
        delete_op().execute(make_context())
    assert "SECRETSIGNATURE" not in str(error.value) and "<redacted presigned URL>" in str(error.value)

    env.respond_text("describe-cluster", "Traceback ...\n" + recorded[:-3], rc=1)
    with pytest.raises(PclusterError) as error:
        delete_op().execute(make_context())
    assert "SECRETSIGNATURE" not in str(error.value)

    aws_style = "https://b.s3.amazonaws.com/c.yaml?versionId=3&AWSAccessKeyId=AKIAEXAMPLE&Signature=SIGVALUE&Expires=1"
    for returncode, stdout, stderr in [
        (1, json.dumps({"message": f"Unable to read {aws_style}"}), ""),
        (1, "", "x" * 3000 + aws_style),  # longer than the tail kept
        (0, "[" + json.dumps(aws_style), ""),
    ]:
        with pytest.raises(PclusterError) as error:
            parse_cli_result(returncode, stdout, stderr)
        assert "SIGVALUE" not in str(error.value) and "AKIAEXAMPLE" not in str(error.value), str(error.value)


# --- the deployment's node cap ---------------------------------------------------------------------

def other_runs_cluster(tmp_path, nodes: int) -> str:
    """describe-cluster of another run's live cluster tagged with its node count (a recorded output)."""
    description = json.loads((FIXTURES / "describe_cluster_create_complete.json").read_text())
    description["clusterName"] = "uc-other"
    description["tags"] = [t for t in description["tags"] if t["key"] != "ultracluster:run-id"] + [
        {"key": "ultracluster:run-id", "value": "manual__other"}, {"key": "ultracluster:nodes", "value": str(nodes)}]
    path = tmp_path / "describe_other.json"
    path.write_text(json.dumps(description))
    listed = json.loads((FIXTURES / "list_clusters.json").read_text())
    listed["clusters"].append({**listed["clusters"][0], "clusterName": "uc-other"})
    (tmp_path / "list_other.json").write_text(json.dumps(listed))
    return str(path)


def test_a_cluster_over_the_node_cap_waits_without_creating(env, tmp_path):
    from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

    other = other_runs_cluster(tmp_path, nodes=2)
    env.respond("describe-cluster", other)
    env.respond("list-clusters", str(tmp_path / "list_other.json"))
    op = create_op(cluster_config={**CONFIG, "nodes": 2}, max_live_nodes=3)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context())
    assert isinstance(deferred.value.trigger, TimeDeltaTrigger)
    assert deferred.value.method_name == "admission_retry"
    assert "create-cluster" not in env.verbs()
    # Room now (the other cluster is gone): the retry creates.
    env.respond("describe-cluster", ("error_describe_cluster_not_found.json", 1),
                "describe_cluster_create_in_progress.json")
    env.respond("create-cluster", "create_cluster.json")
    with pytest.raises(TaskDeferred) as waiting:
        op.admission_retry(make_context(), None)
    assert isinstance(waiting.value.trigger, ClusterStatusTrigger) and "create-cluster" in env.verbs()


def test_a_cluster_that_fits_beside_the_others_is_created(env, tmp_path):
    env.respond("describe-cluster", other_runs_cluster(tmp_path, 2), "describe_cluster_create_in_progress.json")
    env.respond("list-clusters", str(tmp_path / "list_other.json"))
    env.respond("create-cluster", "create_cluster.json")
    with pytest.raises(TaskDeferred):
        create_op(cluster_config={**CONFIG, "nodes": 2}, max_live_nodes=4).execute(make_context())
    # The wait starts from create-cluster's own answer: no describe-cluster after it.
    assert env.verbs() == ["list-clusters", "describe-cluster", "create-cluster"]


def other_cluster(tmp_path, status: str, nodes_tag: int | None) -> None:
    """list-clusters/describe-cluster of another cluster ``uc-other`` in ``status``; tagged with its
    node count or not (a cluster made by hand)."""
    description = json.loads((FIXTURES / "describe_cluster_create_complete.json").read_text())
    description.update(clusterName="uc-other", clusterStatus=status)
    description["tags"] = [t for t in description["tags"] if not t["key"].startswith("ultracluster:")]
    if nodes_tag is not None:
        description["tags"].append({"key": "ultracluster:nodes", "value": str(nodes_tag)})
    (tmp_path / "describe_other.json").write_text(json.dumps(description))
    listed = json.loads((FIXTURES / "list_clusters.json").read_text())
    listed["clusters"].append({**listed["clusters"][0], "clusterName": "uc-other", "clusterStatus": status})
    (tmp_path / "list_other.json").write_text(json.dumps(listed))


def launch(cluster: str, node_type: str, count: int = 1, terminate: bool = False) -> None:
    """EC2 instances tagged as ParallelCluster tags a cluster's nodes (moto)."""
    ec2 = boto3.client("ec2", region_name=REGION)
    tags = [{"Key": "parallelcluster:cluster-name", "Value": cluster},
            {"Key": "parallelcluster:node-type", "Value": node_type}]
    ids = [i["InstanceId"] for i in ec2.run_instances(
        ImageId="ami-12c6146b", MinCount=count, MaxCount=count, InstanceType="trn1.32xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])["Instances"]]
    if terminate:
        ec2.terminate_instances(InstanceIds=ids)


@pytest.mark.parametrize("status, nodes_tag, live, fits", [
    # A stuck delete counts what still runs, not its MaxCount: 1 live of 4 leaves room for 2 under 3.
    ("DELETE_FAILED", 4, 1, True),
    ("DELETE_FAILED", 4, 2, False),
    # A cluster made by hand (no node tag) counts its live compute instances, never 0.
    ("CREATE_COMPLETE", None, 2, False),
    ("CREATE_COMPLETE", None, 1, True),
])
def test_the_cap_counts_live_instances_of_stuck_and_untagged_clusters(env, tmp_path, status, nodes_tag, live, fits):
    other_cluster(tmp_path, status, nodes_tag)
    launch("uc-other", "HeadNode")
    launch("uc-other", "Compute", count=2, terminate=True)  # gone: they hold nothing
    launch("uc-other", "Compute", count=live)
    env.respond("describe-cluster", str(tmp_path / "describe_other.json"), "describe_cluster_create_in_progress.json")
    env.respond("list-clusters", str(tmp_path / "list_other.json"))
    env.respond("create-cluster", "create_cluster.json")
    with pytest.raises(TaskDeferred) as deferred:
        create_op(cluster_config={**CONFIG, "nodes": 2}, max_live_nodes=3).execute(make_context())
    assert ("create-cluster" in env.verbs()) is fits
    assert deferred.value.method_name == ("execute_complete" if fits else "admission_retry")


def test_waiting_for_room_past_the_limit_fails_naming_what_holds_the_cap(env, tmp_path):
    import time

    from airflow.sdk.exceptions import AirflowFailException

    other_cluster(tmp_path, "CREATE_COMPLETE", 3)
    env.respond("describe-cluster", *[str(tmp_path / "describe_other.json")] * 3)
    env.respond("list-clusters", str(tmp_path / "list_other.json"))
    op = create_op(cluster_config={**CONFIG, "nodes": 2}, max_live_nodes=3, max_admission_wait=60)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context())
    since = deferred.value.kwargs["waiting_since"]
    with pytest.raises(TaskDeferred):  # within the limit: waits again, from the same start
        op.admission_retry(make_context(), None, waiting_since=since)
    with pytest.raises(AirflowFailException, match=r"still held: uc-other: 3 \(MaxCount\)"):
        op.admission_retry(make_context(), None, waiting_since=time.time() - 61)
    assert "create-cluster" not in env.verbs()


def test_a_cluster_bigger_than_the_cap_fails_at_once(env):
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match="can hold 5 nodes, more than the deployment's cap of 4"):
        create_op(cluster_config={**CONFIG, "nodes": 5}, max_live_nodes=4).execute(make_context())
    assert env.verbs() == []


def test_success_event_returns_the_cluster(env):
    from ultracluster.parsers.pcluster import public_description

    recorded = json.loads((FIXTURES / "describe_cluster_create_complete.json").read_text())
    # The trigger's event carries the public description: its creation time too (the budget guard's
    # "since" and the report's cluster wall time come from it).
    done = event("complete", cluster_status="CREATE_COMPLETE", description=public_description(recorded))
    result = create_op().execute_complete(make_context(), done)
    assert result["head_node"] == recorded["headNode"] and result["config_s3_uri"] == CONFIG["config_s3_uri"]
    assert result["created_at"] == recorded["creationTime"] == "2026-11-30T08:01:16.101Z"
    assert env.calls() == []


# --- delete_cluster ------------------------------------------------------------------------------

def delete_op(**overrides) -> DeleteClusterOperator:
    kwargs = dict(task_id="delete_cluster", cluster_name="uc-test", poll_interval=1, max_attempts=10)
    kwargs.update(overrides)
    return DeleteClusterOperator(**kwargs)


def test_delete_of_a_gone_cluster_succeeds(env):
    env.respond("describe-cluster", ("error_describe_cluster_not_found.json", 1))
    assert delete_op().execute(make_context())["deleted"] is True
    assert env.verbs() == ["describe-cluster"]


def test_delete_starts_and_defers(env):
    env.respond("describe-cluster", "describe_cluster_create_complete.json")
    env.respond("delete-cluster", "delete_cluster.json")
    with pytest.raises(TaskDeferred) as deferred:
        delete_op().execute(make_context())
    assert env.verbs() == ["describe-cluster", "delete-cluster"]
    assert deferred.value.trigger.waiter_name == "ClusterDeleteComplete"
    assert deferred.value.kwargs == {"delete_attempt": 1}


def created_value(**overrides) -> dict:
    """pcluster_create's return value for the recorded CREATE_COMPLETE cluster."""
    from ultracluster.parsers.pcluster import public_description
    from ultracluster.run.returns import cluster_created

    recorded = json.loads((FIXTURES / "describe_cluster_create_complete.json").read_text())
    return {**cluster_created("uc-test", public_description(recorded), None), **overrides}


def test_a_first_try_deletes_the_cluster_pcluster_create_returned_without_describing_it(env):
    env.respond("delete-cluster", "delete_cluster.json")
    context = make_context()
    with pytest.raises(TaskDeferred) as deferred:
        delete_op(cluster=created_value()).execute(context)
    assert env.verbs() == ["delete-cluster"]
    assert deferred.value.trigger.waiter_name == "ClusterDeleteComplete"
    from ultracluster.links import ParallelClusterStackLink

    link = context["ti"].xcom[ParallelClusterStackLink.key]
    assert link["region_name"] == REGION and link["stack_name"].startswith("arn:aws:cloudformation:")


@pytest.mark.parametrize("case", ["retry", "another name", "adopted", "none"])
def test_without_pcluster_creates_word_for_it_the_delete_describes_first(env, case):
    # A retry may find the cluster deleting or gone; an adopted cluster is never deleted; no value:
    # pcluster_create failed, and the cluster of that name may be another run's.
    env.respond("describe-cluster", "describe_cluster_create_complete.json")
    env.respond("delete-cluster", "delete_cluster.json")
    cluster = {"retry": created_value(), "another name": created_value(cluster_name="uc-other"),
               "adopted": created_value(existing=True), "none": None}[case]
    with pytest.raises(TaskDeferred):
        delete_op(cluster=cluster).execute(make_context(try_number=2 if case == "retry" else 1))
    assert env.verbs() == ["describe-cluster", "delete-cluster"]


def test_delete_in_progress_is_waited_on_not_repeated(env):
    env.respond("describe-cluster", "describe_cluster_delete_in_progress.json")
    with pytest.raises(TaskDeferred):
        delete_op().execute(make_context())
    assert "delete-cluster" not in env.verbs()


def test_delete_leaves_another_runs_cluster(env):
    env.respond("describe-cluster", "describe_cluster_create_complete.json")
    assert delete_op().execute(make_context(run_id="manual__other"))["deleted"] is False
    assert "delete-cluster" not in env.verbs()


def test_delete_failed_is_retried_then_reported(env):
    env.respond("describe-cluster", "describe_cluster_delete_failed.json")
    env.respond("delete-cluster", "delete_cluster.json")
    failed = event("cluster_failed", "reached DELETE_FAILED", cluster_status="DELETE_FAILED",
                   description={"cloudformationStackArn": "arn:aws:cloudformation:us-east-1:1:stack/uc-test/1"})
    with pytest.raises(TaskDeferred) as deferred:
        delete_op(max_delete_attempts=2).execute_complete(make_context(), failed, delete_attempt=1)
    assert deferred.value.kwargs == {"delete_attempt": 2}
    assert env.verbs() == ["describe-cluster", "delete-cluster"]
    with pytest.raises(RuntimeError, match="not deleted after 2 attempt.*inspect stack arn:aws"):
        delete_op(max_delete_attempts=2).execute_complete(make_context(), failed, delete_attempt=2)


# --- the AWS side end to end on the local UltraCluster (real pcluster-compatible CLI, moto server) -----

def run_trigger(trigger) -> dict:
    import asyncio

    async def first_event():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(first_event())


def resume(operator, context, deferred: TaskDeferred):
    """What the triggerer + worker do after a deferral: run the trigger, call the method with its event."""
    event = run_trigger(deferred.trigger)
    return getattr(operator, deferred.method_name)(context, event, **(deferred.kwargs or {}))


def run_to_completion(operator, context):
    try:
        return operator.execute(context)
    except TaskDeferred as deferred:
        while True:
            try:
                return resume(operator, context, deferred)
            except TaskDeferred as again:
                deferred = again


@pytest.fixture
def local_aws(uc_env, monkeypatch):
    from pathlib import Path

    endpoint = uc_env["AWS_ENDPOINT_URL"]
    for key in ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, uc_env[key])
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(
        {"conn_type": "aws", "extra": {"region_name": REGION, "endpoint_url": endpoint}}))
    binary = Path(__file__).resolve().parents[2] / ".venvs" / "localcluster" / "bin" / "pcluster"
    cli_env = {k: v for k, v in uc_env.items() if k.startswith(("AWS_", "LOCAL_U"))}
    monkeypatch.setenv("AIRFLOW_CONN_PCLUSTER_DEFAULT", json.dumps(
        {"conn_type": "pcluster", "extra": {"binary": str(binary), "region": REGION, "env": cli_env}}))
    return uc_env


def aws_side_tasks(params: dict):
    from ultracluster.operators.cluster_config import RenderClusterConfigOperator
    from ultracluster.operators.vpc import CreateVpcStackOperator, DeleteVpcStackOperator

    create_vpc = CreateVpcStackOperator(task_id="create_vpc", stack_name="uc-vpc-localtest",
                                        availability_zone_id=params["availability_zone_id"], region_name=REGION,
                                        waiter_delay=1)

    def render(network):
        return RenderClusterConfigOperator(
            task_id="render_config", network=network, cluster_name=None, region_name=REGION,
            key_name=params["key_name"], image_os=params["image_os"],
            head_node_instance_type=params["head_node_instance_type"], instance_type=params["instance_type"],
            min_nodes=params["min_nodes"], max_nodes=params["max_nodes"], extra_queues=params["extra_queues"],
            shared_storage_mount_dir=params["shared_storage_mount_dir"],
            fsx_storage_capacity_gib=params["fsx_storage_capacity_gib"], artifacts_s3_uri=params["artifacts_s3_uri"],
            extra_tags=params["extra_tags"], ssh_allowed_cidr=params["head_node_ssh_cidr"])

    def delete_vpc(network, cluster_name=None):
        return DeleteVpcStackOperator(task_id="delete_vpc", vpc=network, cluster_name=cluster_name, region_name=REGION,
                                      waiter_delay=1)

    return create_vpc, render, delete_vpc


@pytest.mark.localcluster
def test_cluster_lifecycle_on_the_local_ultracluster(local_aws):
    from ultracluster.run.profiles import load_profile

    params = load_profile("local")
    context = make_context(run_id="manual__localtest")
    context["params"] = params
    create_vpc, render, delete_vpc = aws_side_tasks(params)
    network = run_to_completion(create_vpc, context)
    config = None
    try:
        config = render(network).execute(context)
        created = run_to_completion(create_op(cluster_config=config, region_name=REGION), context)
        assert created["cluster_status"] == "CREATE_COMPLETE"
        assert created["head_node"]["publicIpAddress"].startswith("127.100.")

        # A retry of pcluster_create reattaches: no second create-cluster.
        again = create_op(cluster_config=config, region_name=REGION).execute(make_context(run_id="manual__localtest"))
        assert again["cluster_name"] == created["cluster_name"]

        # delete_cluster has not run: delete_vpc refuses to take the network from under the cluster.
        with pytest.raises(RuntimeError, match="of this run still exists \\(CREATE_COMPLETE\\)"):
            run_to_completion(delete_vpc(network, config["cluster_name"]), context)

        # The run's collected results: delete_cluster adds the bill to them.
        s3 = boto3.client("s3", region_name=REGION, endpoint_url=local_aws["AWS_ENDPOINT_URL"])
        s3.put_object(Bucket="ultracluster-artifacts", Key="results/localtest/results.json",
                      Body=json.dumps({"results": {"metrics": []}}).encode())
        deleted = run_to_completion(delete_op(
            cluster_name=config["cluster_name"], region_name=REGION, fsx_storage_capacity_gib="1200",
            results_uri="s3://ultracluster-artifacts/results/localtest/"), context)
        assert deleted.pop("deleted_at") >= created["created_at"]  # the cluster's wall time, for the report
        usage = deleted.pop("usage")
        assert deleted == {"cluster_name": config["cluster_name"], "deleted": True}
        # From EC2: the head node, launched at create and terminated by the delete (no job ran, so
        # no dynamic node came up), priced at the profile's head node type, FSx over its life.
        assert (usage["basis"], usage["instances"], usage["unended"], usage["compute_node_hours"]) == (
            "ec2_instances", 1, 0, 0.0), usage
        assert 0 < usage["head_node_hours"] < 1 and usage["head_node_usd"] is not None
        assert usage["usd"] == pytest.approx(usage["head_node_usd"] + usage["fsx_usd"], abs=0.011)
        written = json.loads(s3.get_object(Bucket="ultracluster-artifacts", Key="results/localtest/results.json")
                             ["Body"].read())
        assert written["usage"] == usage == json.loads(s3.get_object(
            Bucket="ultracluster-artifacts", Key="results/localtest/usage.json")["Body"].read())
        # A retry (Airflow's deferral race can fail a try whose delete went through) finds the
        # cluster gone and still bills it: the same instances, ended at the delete.
        again = delete_op(cluster_name=config["cluster_name"], region_name=REGION).execute(context)
        assert again["usage"]["usd"] == usage["usd"] and again["deleted_at"] == usage["ended_at"] is not None
    finally:
        result = run_to_completion(delete_vpc(network, config and config["cluster_name"]), context)
    assert result["deleted"] is True


@pytest.mark.localcluster
def test_create_failed_on_the_local_ultracluster_cleans_up(local_aws, capsys):
    from ultracluster.hooks.parallelcluster import ParallelClusterHook
    from ultracluster.parsers.pcluster import ClusterNotFoundError
    from ultracluster.run.profiles import load_profile

    params = dict(load_profile("local"), extra_tags={"local-ultracluster:fail-create": "OnNodeConfiguredExecutionFailure"})
    context = make_context(run_id="manual__localfail")
    context["params"] = params
    create_vpc, render, delete_vpc = aws_side_tasks(params)
    network = run_to_completion(create_vpc, context)
    try:
        config = render(network).execute(context)
        with pytest.raises(AirflowFailException, match="OnNodeConfiguredExecutionFailure.*the cluster was deleted"):
            run_to_completion(create_op(cluster_config=config, region_name=REGION), context)
        # The task log shows what the local pcluster serves: the failed stack events and the tail of the
        # head node's bootstrap log (a real file of the local head node).
        log = capsys.readouterr().out
        assert "(AWS::CloudFormation::WaitCondition) CREATE_FAILED: WaitCondition received failed message: " \
               "'Failed to execute OnNodeConfigured script." in log
        assert "lines of the head node's bootstrap log ip-" in log and ".cfn-init:" in log
        assert "[ERROR] Command runpostinstall (/opt/parallelcluster/scripts/fetch_and_run -postinstall) failed" in log
        # pcluster_create failed only once its own clean-up finished: the network is free.
        with pytest.raises(ClusterNotFoundError):
            ParallelClusterHook().describe_cluster(config["cluster_name"])
    finally:
        run_to_completion(delete_vpc(network), context)
