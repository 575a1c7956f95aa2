"""ClusterStatusTrigger (recorded pcluster outputs) and CloudFormationStackTrigger (moto server, aiobotocore)."""
from __future__ import annotations

import asyncio
import importlib
import json

import pytest

from tests.fixtures.pcluster.fake_pcluster import FakePcluster
from tests.fixtures_localcluster import free_port, install_moto_stack_deletes
from tests.unit.triggerer import in_triggerer
from ultracluster.triggers.cloud_formation import CloudFormationStackTrigger
from ultracluster.triggers.pcluster import ClusterStatusTrigger

CONN_ID = "pcluster_unit"
RUN_ID = "manual__2026-11-30T08:00:00+00:00"  # the run id tagged in the fixtures


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakePcluster:
    fake = FakePcluster(tmp_path / "pcluster")
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", fake.connection_json())
    return fake


def round_trip(trigger):
    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)  # must be plain JSON
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    return rebuilt


async def collect(trigger) -> list[dict]:
    return [event.payload async for event in trigger.run()]


def status_trigger(waiter: str, **overrides) -> ClusterStatusTrigger:
    kwargs = dict(cluster_name="uc-test", waiter_name=waiter, pcluster_conn_id=CONN_ID,
                  poll_interval=0, max_attempts=5)
    kwargs.update(overrides)
    return ClusterStatusTrigger(**kwargs)


def test_cluster_status_trigger_serialize_round_trip():
    trigger = status_trigger("ClusterCreateComplete", region_name="us-east-1", owner_run_id=RUN_ID,
                             delete_on_kill=True)
    rebuilt = round_trip(trigger)
    assert rebuilt.owner_run_id == RUN_ID and rebuilt.delete_on_kill is True


def test_create_wait_succeeds_without_leaking_presigned_url(fake):
    fake.respond("describe-cluster", "describe_cluster_create_in_progress.json",
                 "describe_cluster_create_in_progress.json", "describe_cluster_create_complete.json")
    events = asyncio.run(collect(round_trip(status_trigger("ClusterCreateComplete"))))
    assert len(events) == 1
    event = events[0]
    assert event["status"] == "success" and event["cluster_status"] == "CREATE_COMPLETE"
    assert event["description"]["headNode"]["publicIpAddress"] == "198.51.100.44"
    assert "SECRETSIGNATURE" not in json.dumps(event)
    assert fake.verbs() == ["describe-cluster"] * 3


def test_create_wait_reports_failures(fake):
    fake.respond("describe-cluster", "describe_cluster_create_in_progress.json",
                 "describe_cluster_create_failed.json")
    [event] = asyncio.run(collect(status_trigger("ClusterCreateComplete")))
    assert (event["status"], event["reason"], event["cluster_status"]) == ("failed", "cluster_failed", "CREATE_FAILED")
    assert event["failures"][0]["failureCode"] == "OnNodeConfiguredExecutionFailure"


def test_create_wait_fails_when_cluster_vanishes(fake):
    fake.respond("describe-cluster", ("error_describe_cluster_not_found.json", 1))
    [event] = asyncio.run(collect(status_trigger("ClusterCreateComplete")))
    assert (event["status"], event["reason"]) == ("failed", "cluster_gone") and "does not exist" in event["message"]


def test_delete_wait_counts_gone_as_success(fake):
    fake.respond("describe-cluster", "describe_cluster_delete_in_progress.json",
                 ("error_describe_cluster_not_found.json", 1))
    [event] = asyncio.run(collect(status_trigger("ClusterDeleteComplete")))
    assert event["status"] == "success" and event["cluster_status"] == "DELETE_COMPLETE"


def test_delete_wait_reports_delete_failed(fake):
    fake.respond("describe-cluster", "describe_cluster_delete_failed.json")
    [event] = asyncio.run(collect(status_trigger("ClusterDeleteComplete")))
    assert (event["status"], event["reason"], event["cluster_status"]) == ("failed", "cluster_failed", "DELETE_FAILED")


def test_transient_cli_errors_are_retried_then_reported(fake):
    fake.respond("describe-cluster", ("error_config_file_not_found.json", 1))
    [event] = asyncio.run(collect(status_trigger("ClusterCreateComplete", max_attempts=20)))
    assert (event["status"], event["reason"]) == ("error", "api_error")
    assert fake.verbs().count("describe-cluster") == 5  # MAX_CONSECUTIVE_ERRORS


def test_a_transient_error_does_not_end_the_wait(fake):
    fake.respond("describe-cluster", ("error_config_file_not_found.json", 1),
                 "describe_cluster_create_complete.json")
    [event] = asyncio.run(collect(status_trigger("ClusterCreateComplete")))
    assert event["status"] == "success"


def test_failed_describes_back_off_and_a_success_resets_the_interval(fake, monkeypatch):
    import ultracluster.triggers.pcluster as pcluster_trigger_module

    error = ("error_config_file_not_found.json", 1)
    fake.respond("describe-cluster", error, error, error, "describe_cluster_create_in_progress.json",
                 "describe_cluster_create_complete.json")
    sleeps = []

    async def sleep(seconds):
        sleeps.append(seconds)

    monkeypatch.setattr(pcluster_trigger_module.asyncio, "sleep", sleep)
    [event] = asyncio.run(collect(status_trigger("ClusterCreateComplete", poll_interval=10)))
    assert event["status"] == "success"
    # Doubling with jitter (half random) from the interval: [10, 20], [20, 40], [40, 80]; then one look
    # per 10 s again, the describe's own time (a pcluster process) taken off the pause.
    assert len(sleeps) == 4 and 10 <= sleeps[0] <= 20 <= sleeps[1] <= 40 <= sleeps[2] <= 80, sleeps
    assert 5 <= sleeps[3] < 10, sleeps


def test_wait_times_out_after_max_attempts(fake):
    fake.respond("describe-cluster", "describe_cluster_create_in_progress.json")
    [event] = asyncio.run(collect(status_trigger("ClusterCreateComplete", max_attempts=3)))
    assert (event["status"], event["reason"]) == ("error", "timeout")
    assert fake.verbs() == ["describe-cluster"] * 3


def test_on_kill_deletes_only_this_runs_cluster(fake):
    fake.respond("describe-cluster", "describe_cluster_create_in_progress.json")
    fake.respond("delete-cluster", "delete_cluster.json")
    asyncio.run(status_trigger("ClusterCreateComplete", owner_run_id=RUN_ID, delete_on_kill=True).on_kill())
    assert fake.verbs() == ["describe-cluster", "delete-cluster"]


def test_on_kill_leaves_another_runs_cluster(fake):
    fake.respond("describe-cluster", "describe_cluster_create_in_progress.json")
    asyncio.run(status_trigger("ClusterCreateComplete", owner_run_id="manual__other", delete_on_kill=True).on_kill())
    assert "delete-cluster" not in fake.verbs()


@pytest.fixture
def task_state(monkeypatch):
    """The task's state as the triggerer's execution API would report it to the on_kill guard."""
    from types import SimpleNamespace

    from airflow.sdk.execution_time import task_runner

    state = {"value": "deferred"}
    monkeypatch.setattr(task_runner.RuntimeTaskInstance, "get_task_states", staticmethod(
        lambda **kw: {kw["run_ids"][0]: {kw["task_ids"][0]: state["value"]}}))
    state["ti"] = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id=RUN_ID, task_id="pcluster_create", map_index=-1)
    return state


def test_on_kill_while_still_deferred_deletes_nothing(fake, task_state):
    """A triggerer hand-over cancels the trigger and runs on_kill; the task is still deferred."""
    fake.respond("describe-cluster", "describe_cluster_create_in_progress.json")
    fake.respond("delete-cluster", "delete_cluster.json")
    trigger = status_trigger("ClusterCreateComplete", owner_run_id=RUN_ID, delete_on_kill=True)
    trigger.task_instance = task_state["ti"]
    asyncio.run(trigger.on_kill())
    assert fake.calls() == []

    task_state["value"] = "failed"  # the user marked it failed: a real kill
    asyncio.run(trigger.on_kill())
    assert fake.verbs() == ["describe-cluster", "delete-cluster"]


def test_on_kill_of_a_delete_wait_does_nothing(fake):
    asyncio.run(status_trigger("ClusterDeleteComplete").on_kill())
    assert fake.calls() == []


# --- CloudFormation -----------------------------------------------------------------------------

@pytest.fixture
def aws(monkeypatch):
    """moto's server in this process: the trigger's aiobotocore client talks HTTP to it."""
    from moto.server import ThreadedMotoServer

    install_moto_stack_deletes()
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_UNIT", json.dumps({"conn_type": "aws", "extra": {"region_name": "us-east-1"}}))
    try:
        import boto3

        yield boto3.client("cloudformation", region_name="us-east-1", endpoint_url=endpoint)
    finally:
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10)
        server.stop()


SMALL_TEMPLATE = json.dumps({
    "Resources": {"Vpc": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.1.0.0/16"}}},
    "Outputs": {"VpcId": {"Value": {"Ref": "Vpc"}}},
})


def stack_trigger(waiter: str, **overrides) -> CloudFormationStackTrigger:
    kwargs = dict(stack_name="uc-vpc-test", waiter_name=waiter, aws_conn_id="aws_unit", region_name="us-east-1",
                  waiter_delay=0, waiter_max_attempts=3)
    kwargs.update(overrides)
    return CloudFormationStackTrigger(**kwargs)


def stack_status(cfn, name: str) -> str:
    stack_id = [s["StackId"] for s in cfn.list_stacks()["StackSummaries"] if s["StackName"] == name][0]
    return cfn.describe_stacks(StackName=stack_id)["Stacks"][0]["StackStatus"]


def test_stack_trigger_serialize_round_trip():
    rebuilt = round_trip(stack_trigger("stack_create_complete", owner_run_id=RUN_ID, delete_on_kill=True,
                                       botocore_config={"retries": {"max_attempts": 3}}))
    assert (rebuilt.owner_run_id, rebuilt.delete_on_kill, rebuilt.botocore_config) == (
        RUN_ID, True, {"retries": {"max_attempts": 3}})


def test_stack_trigger_refuses_an_unknown_waiter():
    with pytest.raises(ValueError, match="waiter_name must be one of"):
        stack_trigger("stack_exists")


def test_stack_on_kill_deletes_only_this_runs_stack(aws):
    aws.create_stack(StackName="uc-vpc-test", TemplateBody=SMALL_TEMPLATE,
                     Tags=[{"Key": "ultracluster:run-id", "Value": "manual__other"}])
    asyncio.run(stack_trigger("stack_create_complete", owner_run_id=RUN_ID, delete_on_kill=True).on_kill())
    assert stack_status(aws, "uc-vpc-test") == "CREATE_COMPLETE"

    aws.create_stack(StackName="uc-vpc-mine", TemplateBody=SMALL_TEMPLATE,
                     Tags=[{"Key": "ultracluster:run-id", "Value": RUN_ID}])
    asyncio.run(stack_trigger("stack_create_complete", stack_name="uc-vpc-mine", owner_run_id=RUN_ID,
                              delete_on_kill=True).on_kill())
    assert stack_status(aws, "uc-vpc-mine") == "DELETE_COMPLETE"


def test_stack_on_kill_while_still_deferred_deletes_nothing(aws, task_state):
    aws.create_stack(StackName="uc-vpc-mine", TemplateBody=SMALL_TEMPLATE,
                     Tags=[{"Key": "ultracluster:run-id", "Value": RUN_ID}])
    trigger = stack_trigger("stack_create_complete", stack_name="uc-vpc-mine", owner_run_id=RUN_ID,
                            delete_on_kill=True)
    trigger.task_instance = task_state["ti"]
    asyncio.run(trigger.on_kill())
    assert stack_status(aws, "uc-vpc-mine") == "CREATE_COMPLETE"

    task_state["value"] = "success"  # the user marked it success: a real kill
    asyncio.run(trigger.on_kill())
    assert stack_status(aws, "uc-vpc-mine") == "DELETE_COMPLETE"


def test_stack_create_wait_succeeds(aws):
    aws.create_stack(StackName="uc-vpc-test", TemplateBody=SMALL_TEMPLATE)
    [event] = asyncio.run(collect(round_trip(stack_trigger("stack_create_complete"))))
    assert event == {"status": "success", "reason": "complete", "stack_name": "uc-vpc-test",
                     "message": "Stack uc-vpc-test: done"}


def test_stack_delete_wait_counts_missing_stack_as_success(aws):
    [event] = asyncio.run(collect(stack_trigger("stack_delete_complete")))
    assert event["status"] == "success"


def test_stack_create_wait_on_missing_stack_is_a_terminal_failure(aws):
    [event] = asyncio.run(collect(stack_trigger("stack_create_complete", waiter_max_attempts=10)))
    assert (event["status"], event["reason"], event["stack_name"]) == ("failed", "stack_failed", "uc-vpc-test")
    assert "Stack creation failed: uc-vpc-test" in event["message"]


@pytest.mark.parametrize("waiter, status, attempts, ended, message", [
    ("stack_delete_complete", "DELETE_FAILED", 10, ("failed", "stack_failed"), "Stack deletion failed: uc-vpc-test"),
    ("stack_create_complete", "CREATE_IN_PROGRESS", 2, ("error", "timeout"), "max attempts reached"),
])
def test_stack_wait_ends_in_a_failed_or_error_event(aws, waiter, status, attempts, ended, message):
    from moto.cloudformation.models import cloudformation_backends

    aws.create_stack(StackName="uc-vpc-test", TemplateBody=SMALL_TEMPLATE)
    [stack] = cloudformation_backends["123456789012"]["us-east-1"].stacks.values()
    stack.status = status
    [event] = asyncio.run(collect(stack_trigger(waiter, waiter_max_attempts=attempts)))
    assert (event["status"], event["reason"]) == ended and message in event["message"]


# --- waits that end their task in the triggerer (run.returns, triggers.task_end) -----------------

async def last_event(trigger):
    return [fired async for fired in trigger.run()][-1]


def test_a_create_wait_ends_pcluster_create_with_the_worker_paths_value(fake, pushed):
    from airflow.triggers.base import TaskSuccessEvent

    from ultracluster.operators.pcluster import CreateClusterOperator

    fake.respond("describe-cluster", "describe_cluster_create_in_progress.json", "describe_cluster_create_complete.json")
    asked = dict(owner_run_id=RUN_ID, delete_on_kill=True, end_task=True,
                 config_s3_uri="s3://ultracluster-artifacts/runs/x/cluster-config.yaml")
    ended = asyncio.run(last_event(in_triggerer(round_trip(status_trigger("ClusterCreateComplete", **asked)))))
    assert isinstance(ended, TaskSuccessEvent)
    fake.respond("describe-cluster", "describe_cluster_create_complete.json")
    # dag.test() runs the trigger without a task instance: the same wait resumes the task there.
    [plain] = asyncio.run(collect(status_trigger("ClusterCreateComplete", **asked)))
    op = CreateClusterOperator(task_id="pcluster_create", pcluster_conn_id=CONN_ID, cluster_config={
        "cluster_name": "uc-test", "config_s3_uri": "s3://ultracluster-artifacts/runs/x/cluster-config.yaml"})
    assert pushed == {"return_value": op.execute_complete({"run_id": RUN_ID}, plain)}
    assert pushed["return_value"]["cluster_status"] == "CREATE_COMPLETE"
    assert "SECRETSIGNATURE" not in json.dumps(pushed)


def test_a_failed_create_resumes_pcluster_create_to_clean_up(fake, pushed):
    fake.respond("describe-cluster", "describe_cluster_create_failed.json")
    ended = asyncio.run(last_event(in_triggerer(status_trigger("ClusterCreateComplete", end_task=True))))
    assert type(ended).__name__ == "TriggerEvent" and ended.payload["reason"] == "cluster_failed" and pushed == {}


def test_a_delete_wait_ends_delete_cluster_only_once_it_billed_the_cluster():
    with pytest.raises(ValueError, match="once it billed"):
        status_trigger("ClusterDeleteComplete", end_task=True)


def test_a_delete_wait_bills_and_ends_delete_cluster_with_the_worker_paths_value(fake, aws, pushed, monkeypatch):
    """The bill (hooks.usage) over aiobotocore in the trigger, over the sync hooks in the worker: the same."""
    import boto3
    from airflow.triggers.base import TaskSuccessEvent

    import ultracluster.operators.pcluster_delete as delete_module
    import ultracluster.triggers.pcluster as trigger_module
    from ultracluster.hooks.cluster_instances import CLUSTER_NAME_TAG
    from ultracluster.operators.pcluster_delete import DeleteClusterOperator

    endpoint = aws.meta.endpoint_url
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")
    [instance] = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="c5.xlarge",
                                   TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                       {"Key": CLUSTER_NAME_TAG, "Value": "uc-test"}]}])["Instances"]
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])  # a bill that no longer grows
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="ultracluster-artifacts")
    s3.put_object(Bucket="ultracluster-artifacts", Key="runs/r1/results.json", Body=b'{"results": {}}')
    for module in (delete_module, trigger_module):
        monkeypatch.setattr(module, "utc_now", lambda: "2026-12-03T10:00:00+00:00")
    op = DeleteClusterOperator(task_id="delete_cluster", cluster_name="uc-test", pcluster_conn_id=CONN_ID,
                               aws_conn_id="aws_unit", region_name="us-east-1", results_uri="s3://ultracluster-artifacts/runs/r1/")
    trigger = in_triggerer(round_trip(status_trigger("ClusterDeleteComplete", end_task=True, bill=op._bill())))
    fake.respond("describe-cluster", "describe_cluster_delete_in_progress.json", ("error_describe_cluster_not_found.json", 1))
    ended = asyncio.run(last_event(trigger))
    assert isinstance(ended, TaskSuccessEvent)
    usage = pushed["return_value"]["usage"]
    assert (usage["instances"], usage["unended"], usage["measured_at"]) == (1, 0, "2026-12-03T10:00:00+00:00")
    written = json.loads(s3.get_object(Bucket="ultracluster-artifacts", Key="runs/r1/results.json")["Body"].read())
    assert written["usage"] == usage
    # The worker path, resumed with the plain event of the same wait, returns the same value.
    fake.respond("describe-cluster", ("error_describe_cluster_not_found.json", 1))
    [plain] = asyncio.run(collect(status_trigger("ClusterDeleteComplete", end_task=True, bill=op._bill())))
    assert pushed["return_value"] == op.execute_complete({"run_id": RUN_ID}, plain)


def test_stack_waits_end_create_vpc_and_delete_vpc_with_the_worker_paths_values(aws, pushed):
    from airflow.triggers.base import TaskSuccessEvent

    from ultracluster.operators.vpc import CreateVpcStackOperator

    aws.create_stack(StackName="uc-vpc-test", TemplateBody=SMALL_TEMPLATE)
    ended = asyncio.run(last_event(in_triggerer(round_trip(stack_trigger("stack_create_complete", end_task=True)))))
    assert isinstance(ended, TaskSuccessEvent)
    op = CreateVpcStackOperator(task_id="create_vpc", stack_name="uc-vpc-test", availability_zone_id="use1-az6",
                                region_name="us-east-1", aws_conn_id="aws_unit")
    assert pushed == {"return_value": op._outputs()}
    assert pushed["return_value"]["vpc_id"].startswith("vpc-")

    aws.delete_stack(StackName="uc-vpc-test")
    ended = asyncio.run(last_event(in_triggerer(stack_trigger("stack_delete_complete", end_task=True))))
    assert isinstance(ended, TaskSuccessEvent) and pushed == {"return_value": {"deleted": True, "stack_name": "uc-vpc-test"}}


def test_a_denied_describe_ends_the_wait_at_once_as_a_deterministic_denial(fake):
    """AWS answers a denied describe-cluster the same until the role's policy changes: no polling on."""
    from ultracluster.run.events import deterministic

    fake.respond("describe-cluster", ("error_list_clusters_access_denied.json", 1))
    [event] = asyncio.run(collect(status_trigger("ClusterCreateComplete", max_attempts=20)))
    assert (event["status"], event["reason"]) == ("error", "access_denied")
    assert "cloudformation:DescribeStacks" in event["message"] and deterministic(event)
    assert fake.verbs().count("describe-cluster") == 1
