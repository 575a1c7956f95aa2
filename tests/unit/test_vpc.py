"""create_vpc / delete_vpc against in-process moto: include/cluster/vpc.yaml as shipped."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred

from tests.fixtures.pcluster.fake_pcluster import FakePcluster
from tests.fixtures_localcluster import install_moto_stack_deletes
from ultracluster.run.events import event
from ultracluster.links import CloudFormationStackLink
from ultracluster.operators.vpc import CreateVpcStackOperator, DeleteVpcStackOperator
from ultracluster.run.tags import RUN_ID_TAG
from ultracluster.run.returns import cluster_deleted

REGION = "us-east-1"
RUN_ID = "manual__2026-11-30T08:00:00+00:00"
GOOD_PARAMS = {"num_nodes": 2, "min_nodes": 0, "max_nodes": 2, "max_steps": 20, "steps_this_run": 20,
               "scaling_mode": "strong", "grad_accum_usteps": 2}


class RecordingTaskInstance:
    """Just enough of a TaskInstance for operator extra links (xcom_push)."""

    def __init__(self):
        self.xcom: dict[str, object] = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value


def make_context(run_id: str = RUN_ID, params: dict | None = None) -> dict:
    return {"run_id": run_id, "params": dict(GOOD_PARAMS if params is None else params),
            "dag": SimpleNamespace(dag_id="trn1_bert_pretrain"), "ti": RecordingTaskInstance()}


@pytest.fixture
def aws(monkeypatch):
    from moto import mock_aws

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": {"region_name": REGION}}))
    install_moto_stack_deletes()  # the stand-in's AWS: moto with the stack deletes it lacks
    with mock_aws():
        import boto3

        yield SimpleNamespace(cfn=boto3.client("cloudformation", region_name=REGION),
                              ec2=boto3.client("ec2", region_name=REGION))


def create_op(**overrides) -> CreateVpcStackOperator:
    kwargs = dict(task_id="create_vpc", stack_name="uc-vpc-test", availability_zone_id="use1-az6",
                  region_name=REGION, tags={"team": "ml"})
    kwargs.update(overrides)
    return CreateVpcStackOperator(**kwargs)


def live_stacks(cfn) -> list[dict]:
    return [s for s in cfn.describe_stacks()["Stacks"] if s["StackStatus"] != "DELETE_COMPLETE"]


def test_create_builds_the_network_in_the_requested_az(aws):
    context = make_context()
    network = create_op().execute(context)

    assert network["owned"] is True and network["stack_name"] == "uc-vpc-test"
    assert network["availability_zone"] == "us-east-1a"  # moto: use1-az6 is us-east-1a
    subnets = aws.ec2.describe_subnets(SubnetIds=[network["public_subnet_id"], network["private_subnet_id"]])["Subnets"]
    assert {s["VpcId"] for s in subnets} == {network["vpc_id"]}
    assert {s["AvailabilityZoneId"] for s in subnets} == {"use1-az6"}
    [stack] = live_stacks(aws.cfn)
    tags = {t["Key"]: t["Value"] for t in stack["Tags"]}
    assert tags[RUN_ID_TAG] == RUN_ID and tags["team"] == "ml"
    # The pieces the issue asks for, as CloudFormation made them.
    types = {r["ResourceType"] for r in aws.cfn.list_stack_resources(StackName="uc-vpc-test")["StackResourceSummaries"]}
    assert {"AWS::EC2::InternetGateway", "AWS::EC2::NatGateway", "AWS::EC2::EIP", "AWS::EC2::RouteTable",
            "AWS::EC2::VPCEndpoint", "AWS::EC2::SecurityGroupIngress"} <= types
    group = aws.ec2.describe_security_groups(GroupIds=[network["security_group_id"]])["SecurityGroups"][0]
    assert any(pair["GroupId"] == group["GroupId"] for rule in group["IpPermissions"]
               for pair in rule["UserIdGroupPairs"] if rule["IpProtocol"] == "-1")
    assert context["ti"].xcom["ultracluster_cloudformation_stack"]["stack_name"] == "uc-vpc-test"


def test_retry_reattaches_instead_of_creating_twice(aws):
    first = create_op().execute(make_context())
    second = create_op().execute(make_context())
    assert second == first
    assert len(live_stacks(aws.cfn)) == 1
    assert len(aws.ec2.describe_vpcs(Filters=[{"Name": "cidr", "Values": ["10.0.0.0/16"]}])["Vpcs"]) == 1


def test_stack_of_another_run_is_not_adopted(aws):
    create_op().execute(make_context(run_id="manual__other"))
    with pytest.raises(RuntimeError, match="belongs to run 'manual__other'"):
        create_op().execute(make_context())


def test_unknown_az_id_fails_before_anything_is_created(aws):
    with pytest.raises(ValueError, match="use1-az99"):
        create_op(availability_zone_id="use1-az99").execute(make_context())
    assert live_stacks(aws.cfn) == []


def test_existing_network_is_reused_and_never_deleted(aws):
    vpc_id = aws.ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    public = aws.ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.9.0.0/24", AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
    private = aws.ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.9.1.0/24", AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
    existing = {"vpc_id": vpc_id, "public_subnet_id": public, "private_subnet_id": private, "security_group_id": None}

    network = create_op(existing_network=existing).execute(make_context())
    assert network["owned"] is False and network["vpc_id"] == vpc_id and network["availability_zone"] == "us-east-1b"
    assert live_stacks(aws.cfn) == []

    result = DeleteVpcStackOperator(task_id="delete_vpc", vpc=network, stack_name="uc-vpc-test",
                                    region_name=REGION).execute(make_context())
    assert result["deleted"] is False
    assert aws.ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]["VpcId"] == vpc_id


def test_existing_subnets_must_share_one_az(aws):
    vpc_id = aws.ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    public = aws.ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.9.0.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    private = aws.ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.9.1.0/24", AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
    with pytest.raises(ValueError, match="one availability zone"):
        create_op(existing_network={"public_subnet_id": public, "private_subnet_id": private}).execute(make_context())


def test_delete_removes_the_whole_network(aws):
    network = create_op().execute(make_context())
    assert aws.ec2.describe_addresses()["Addresses"]

    result = DeleteVpcStackOperator(task_id="delete_vpc", vpc=network, region_name=REGION).execute(make_context())

    assert result == {"deleted": True, "stack_name": "uc-vpc-test"}
    assert resources_gone(aws, network)


def test_delete_of_a_gone_stack_succeeds(aws):
    result = DeleteVpcStackOperator(task_id="delete_vpc", stack_name="uc-vpc-never-made",
                                    region_name=REGION).execute(make_context())
    assert result["deleted"] is True


def set_moto_stack_status(name: str, status: str) -> None:
    """moto creates and deletes synchronously; AWS's slower states are set directly in its state."""
    from moto.cloudformation.models import cloudformation_backends

    backend = cloudformation_backends["123456789012"][REGION]
    [stack] = [s for s in backend.stacks.values() if s.name == name and s.status != "DELETE_COMPLETE"]
    stack.status = status


def resources_gone(aws, network) -> bool:
    return (network["vpc_id"] not in {v["VpcId"] for v in aws.ec2.describe_vpcs()["Vpcs"]}
            and aws.ec2.describe_addresses()["Addresses"] == [] and live_stacks(aws.cfn) == [])


def test_a_slow_delete_waits_in_the_triggerer_and_a_delete_failed_is_retried_after_a_pause(aws):
    from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

    from ultracluster.triggers.cloud_formation import CloudFormationStackTrigger

    network = create_op().execute(make_context())
    set_moto_stack_status("uc-vpc-test", "DELETE_IN_PROGRESS")  # AWS takes minutes
    op = DeleteVpcStackOperator(task_id="delete_vpc", vpc=network, region_name=REGION, delete_retry_delay=7)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, CloudFormationStackTrigger)
    assert (trigger.stack_name, trigger.waiter_name) == ("uc-vpc-test", "stack_delete_complete")
    assert (deferred.value.method_name, deferred.value.kwargs) == (
        "delete_complete", {"stack_name": "uc-vpc-test", "attempt": 1})

    # The wait ended in DELETE_FAILED (e.g. a subnet still holding a terminated node's interface).
    set_moto_stack_status("uc-vpc-test", "DELETE_FAILED")
    with pytest.raises(TaskDeferred) as paused:
        op.delete_complete(make_context(), event("stack_failed", "Stack deletion failed"),
                           **deferred.value.kwargs)
    assert isinstance(paused.value.trigger, TimeDeltaTrigger)
    assert paused.value.trigger.moment is not None
    assert (paused.value.method_name, paused.value.kwargs) == (
        "delete_again", {"stack_name": "uc-vpc-test", "attempt": 2})

    result = op.delete_again(make_context(), None, **paused.value.kwargs)
    assert result == {"deleted": True, "stack_name": "uc-vpc-test"}
    assert resources_gone(aws, network)


def test_a_delete_that_keeps_failing_reports_the_failed_resources(aws):
    network = create_op().execute(make_context())
    set_moto_stack_status("uc-vpc-test", "DELETE_FAILED")
    op = DeleteVpcStackOperator(task_id="delete_vpc", vpc=network, region_name=REGION, max_delete_attempts=2)
    with pytest.raises(RuntimeError, match=r"uc-vpc-test not deleted after 2 attempts: Stack deletion failed"):
        op.delete_complete(make_context(), event("stack_failed", "Stack deletion failed"),
                           stack_name="uc-vpc-test", attempt=2)
    assert [s["StackName"] for s in live_stacks(aws.cfn)] == ["uc-vpc-test"]  # kept, and said so


def test_stack_still_creating_defers_to_the_trigger(aws, tmp_path):
    """moto leaves a stack with a bad reference in CREATE_IN_PROGRESS: a retry must wait, not create."""
    from ultracluster.triggers.cloud_formation import CloudFormationStackTrigger

    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "Parameters:\n  AvailabilityZone: {Type: String}\n  AvailabilityZoneId: {Type: String}\n"
        "Resources:\n  Subnet:\n    Type: AWS::EC2::Subnet\n"
        "    Properties: {VpcId: {Ref: NoSuchVpc}, CidrBlock: 10.0.0.0/24}\n"
    )
    # moto fails the unresolvable Ref inside CreateStack (KeyError) and leaves the stack half made.
    with pytest.raises(KeyError, match="NoSuchVpc"):
        create_op(template_path=str(broken)).execute(make_context())
    stuck = [s for s in live_stacks(aws.cfn) if s["StackName"] == "uc-vpc-test"]
    assert [s["StackStatus"] for s in stuck] == ["CREATE_IN_PROGRESS"]

    context = make_context()
    with pytest.raises(TaskDeferred) as deferred:
        create_op(template_path=str(broken)).execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, CloudFormationStackTrigger)
    assert (trigger.stack_name, trigger.waiter_name) == ("uc-vpc-test", "stack_create_complete")
    assert (trigger.owner_run_id, trigger.delete_on_kill) == (RUN_ID, True)
    assert deferred.value.method_name == "execute_complete"
    # The stack's link was pushed before the deferral: it shows while the task waits.
    values = context["ti"].xcom[CloudFormationStackLink.key]
    assert CloudFormationStackLink().format_link(**values) == (
        "https://console.aws.amazon.com/cloudformation/home?region=us-east-1#/stacks/stackinfo?stackId=uc-vpc-test")


def test_a_stack_being_deleted_by_an_earlier_try_is_linked_before_the_wait(aws):
    create_op().execute(make_context())
    set_moto_stack_status("uc-vpc-test", "DELETE_IN_PROGRESS")
    context = make_context()
    with pytest.raises(TaskDeferred) as deferred:
        create_op().execute(context)
    assert deferred.value.trigger.waiter_name == "stack_delete_complete"
    assert context["ti"].xcom[CloudFormationStackLink.key] == {"region_name": REGION, "stack_name": "uc-vpc-test"}


def test_failed_create_event_cleans_up_and_fails(aws):
    network = create_op().execute(make_context())
    with pytest.raises(RuntimeError, match="Creating stack uc-vpc-test failed: boom. Clean-up deleted the stack"):
        create_op().execute_complete(make_context(), event("api_error", "boom"))
    assert resources_gone(aws, network)


@pytest.mark.parametrize("status", ["ROLLBACK_COMPLETE", "CREATE_FAILED"])
def test_a_failed_earlier_stack_is_deleted_then_fails(aws, status):
    network = create_op().execute(make_context())
    set_moto_stack_status("uc-vpc-test", status)
    with pytest.raises(RuntimeError, match=rf"failed earlier \({status}\)\. Clean-up deleted the stack"):
        create_op().execute(make_context())
    assert resources_gone(aws, network)


def test_a_delete_failed_stack_is_deleted_then_created_again(aws):
    old = create_op().execute(make_context())
    set_moto_stack_status("uc-vpc-test", "DELETE_FAILED")
    new = create_op().execute(make_context())
    assert new["owned"] is True and new["vpc_id"] != old["vpc_id"]
    assert old["vpc_id"] not in {v["VpcId"] for v in aws.ec2.describe_vpcs()["Vpcs"]}
    assert [s["StackStatus"] for s in live_stacks(aws.cfn)] == ["CREATE_COMPLETE"]


# --- delete_vpc checks the run's cluster is gone first ---------------------------------------------

@pytest.fixture
def pcluster(tmp_path, monkeypatch) -> FakePcluster:
    fake = FakePcluster(tmp_path / "pcluster")
    monkeypatch.setenv("AIRFLOW_CONN_PCLUSTER_DEFAULT", fake.connection_json())
    return fake


def delete_vpc_op(network, **overrides) -> DeleteVpcStackOperator:
    kwargs = dict(task_id="delete_vpc", vpc=network, cluster_name="uc-test", region_name=REGION,
                  waiter_delay=0, waiter_max_attempts=5)
    kwargs.update(overrides)
    return DeleteVpcStackOperator(**kwargs)


@pytest.mark.parametrize("recorded, status", [("describe_cluster_create_complete.json", "CREATE_COMPLETE"),
                                              ("describe_cluster_delete_failed.json", "DELETE_FAILED")])
def test_delete_vpc_fails_and_keeps_the_network_while_the_cluster_exists(aws, pcluster, recorded, status):
    """delete_cluster failed: this task decides the run state, so it must fail too."""
    network = create_op().execute(make_context())
    pcluster.respond("describe-cluster", recorded)
    with pytest.raises(RuntimeError, match=rf"Cluster uc-test of this run still exists \({status}\)"):
        delete_vpc_op(network).execute(make_context())
    assert [s["StackName"] for s in live_stacks(aws.cfn)] == ["uc-vpc-test"]
    assert "delete-cluster" not in pcluster.verbs()


def test_delete_vpc_checks_the_cluster_even_for_a_network_it_does_not_own(aws, pcluster):
    existing = {"owned": False, "stack_name": None, "vpc_id": "vpc-given"}
    pcluster.respond("describe-cluster", "describe_cluster_delete_failed.json")
    with pytest.raises(RuntimeError, match="still exists"):
        delete_vpc_op(existing).execute(make_context())
    pcluster.respond("describe-cluster", ("error_describe_cluster_not_found.json", 1))
    assert delete_vpc_op(existing).execute(make_context())["reason"] == "not owned"


def test_delete_vpc_waits_for_a_cluster_still_deleting(aws, pcluster):
    from ultracluster.triggers.pcluster import ClusterStatusTrigger

    network = create_op().execute(make_context())
    pcluster.respond("describe-cluster", "describe_cluster_delete_in_progress.json",
                     "describe_cluster_delete_in_progress.json", ("error_describe_cluster_not_found.json", 1))
    op = delete_vpc_op(network)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, ClusterStatusTrigger)
    assert (trigger.cluster_name, trigger.waiter_name, deferred.value.method_name) == (
        "uc-test", "ClusterDeleteComplete", "cluster_gone_complete")
    assert [s["StackName"] for s in live_stacks(aws.cfn)] == ["uc-vpc-test"]  # untouched while waiting

    event = asyncio.run(first_event(trigger))
    assert event["status"] == "success"
    assert op.cluster_gone_complete(make_context(), event) == {"deleted": True, "stack_name": "uc-vpc-test"}
    assert resources_gone(aws, network)


def test_delete_vpc_fails_when_the_cluster_delete_wait_fails(aws, pcluster):
    network = create_op().execute(make_context())
    pcluster.respond("describe-cluster", "describe_cluster_delete_in_progress.json", "describe_cluster_delete_failed.json")
    op = delete_vpc_op(network)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context())
    event = asyncio.run(first_event(deferred.value.trigger))
    with pytest.raises(RuntimeError, match=r"did not finish deleting \(DELETE_FAILED\).*network is kept"):
        op.cluster_gone_complete(make_context(), event)
    assert [s["StackName"] for s in live_stacks(aws.cfn)] == ["uc-vpc-test"]


def test_delete_vpc_ignores_a_cluster_of_another_run_and_a_gone_one(aws, pcluster):
    network = create_op().execute(make_context(run_id="manual__other"))
    pcluster.respond("describe-cluster", "describe_cluster_create_complete.json")  # tagged with RUN_ID
    assert delete_vpc_op(network).execute(make_context(run_id="manual__other"))["deleted"] is True

    network = create_op().execute(make_context())
    pcluster.respond("describe-cluster", ("error_describe_cluster_not_found.json", 1))
    assert delete_vpc_op(network).execute(make_context())["deleted"] is True
    assert resources_gone(aws, network)


async def first_event(trigger) -> dict:
    async for event in trigger.run():
        return event.payload


def test_delete_vpc_takes_delete_clusters_word_that_the_cluster_is_gone(aws, pcluster):
    network = create_op().execute(make_context())
    pcluster.respond("describe-cluster", "describe_cluster_create_complete.json")  # would keep the network
    deleted = cluster_deleted("uc-test", "2026-12-07T00:00:00+00:00", None)
    assert delete_vpc_op(network, cluster_deleted=deleted).execute(make_context())["deleted"] is True
    assert pcluster.verbs() == [] and resources_gone(aws, network)


@pytest.mark.parametrize("word", [None, "", {"cluster_name": "uc-test", "deleted": False},
                                  {"cluster_name": "uc-other", "deleted": True}])
def test_delete_vpc_describes_the_cluster_without_that_word(aws, pcluster, word):
    network = create_op().execute(make_context())
    pcluster.respond("describe-cluster", "describe_cluster_create_complete.json")
    with pytest.raises(RuntimeError, match="still exists"):
        delete_vpc_op(network, cluster_deleted=word).execute(make_context())
    assert pcluster.verbs() == ["describe-cluster"]
