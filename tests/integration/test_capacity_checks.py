"""preflight's capacity checks against the moto server: reservations made as a user makes them (an
On-Demand Capacity Reservation with CreateCapacityReservation, a Capacity Block bought from an offering;
localcluster/moto_capacity.py), each way one cannot serve the run, a resource group's reservations
(moto routes no ListGroupResources: a botocore Stubber answers that one call), the reservation's price
in the cost estimate, and the head node's SSH refused or explicitly allowed."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import boto3
import pytest
from airflow.sdk.exceptions import AirflowFailException

from tests.integration.test_dataset import aws_conn, empty_bucket, moto_endpoint  # noqa: F401 - fixtures
from tests.integration.test_preflight import s3  # noqa: F401 - fixture: the local profile's account
from ultracluster.hooks.account import AccountHook
from ultracluster.operators.preflight import PreflightOperator
from ultracluster.run.capacity import UPFRONT_FEE_TAG
from ultracluster.run.profiles import load_profile

ZONE, OTHER_ZONE = "us-east-1a", "us-east-1d"   # moto: use1-az6 (the local profile's AZ id), use1-az4
LEAD_S = 3600


@pytest.fixture
def ec2(moto_endpoint):
    return boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def local(**changes) -> dict:
    return {**load_profile("local"), "region": "us-east-1", "sweep": None, "max_cost_usd": None, **changes}


def long_run(**changes) -> dict:
    """About 2.8 h by the estimate (120000 steps at the reference throughput, plus the set-up)."""
    return local(max_steps=120000, steps_this_run=120000, **changes)


def preflight(params: dict, deployment_cidr: str | None = load_profile("local")["head_node_ssh_cidr"]) -> dict:
    op = PreflightOperator(task_id="preflight", schedule_period=timedelta(days=7), artifacts_s3_uri=
                           "s3://ultracluster-artifacts/runs", aws_conn_id="uc_test_aws", reservation_lead_s=LEAD_S,
                           default_ssh_allowed_cidr=deployment_cidr, require_permissions_boundary=False,
                           install_neuron_at_boot=True)
    return op.execute({"params": params, "run_id": "manual__capacity", "logical_date": None,
                       "dag": SimpleNamespace(dag_id="trn1_bert_pretrain")})


def refused(params: dict, **deployment) -> str:
    with pytest.raises(AirflowFailException) as failed:
        preflight(params, **deployment)
    return str(failed.value)


def odcr(ec2, count: int = 2, zone: str = ZONE, itype: str = "trn1.32xlarge", **extra) -> str:
    made = ec2.create_capacity_reservation(InstanceType=itype, InstancePlatform="Linux/UNIX", AvailabilityZone=zone,
                                           InstanceCount=count, **extra)
    return made["CapacityReservation"]["CapacityReservationId"]


def capacity_block(ec2, hours: int = 24, count: int = 2, start: datetime | None = None, fee_tag: bool = False) -> str:
    request = {"StartDateRange": start} if start else {}
    [offer] = ec2.describe_capacity_block_offerings(InstanceType="trn1.32xlarge", InstanceCount=count,
                                                    CapacityDurationHours=hours, **request)["CapacityBlockOfferings"]
    tags = [{"ResourceType": "capacity-reservation", "Tags": [{"Key": UPFRONT_FEE_TAG, "Value": offer["UpfrontFee"]}]}]
    bought = ec2.purchase_capacity_block(CapacityBlockOfferingId=offer["CapacityBlockOfferingId"],
                                         InstancePlatform="Linux/UNIX", **({"TagSpecifications": tags} if fee_tag else {}))
    return bought["CapacityReservation"]["CapacityReservationId"]


def block_plan(reservation_id: str, **changes) -> dict:
    return long_run(**{"capacity_type": "CAPACITY_BLOCK", "capacity_reservation_id": reservation_id, "min_nodes": 2,
                       "max_nodes": 2, **changes})


# --- an On-Demand Capacity Reservation ------------------------------------------------------------------

def test_a_fitting_reservation_passes_and_is_in_the_xcom(s3, ec2):
    reservation = odcr(ec2)
    result = preflight(long_run(capacity_reservation_id=reservation))
    [kept] = result["reservations"]
    assert (kept["CapacityReservationId"], kept["State"], kept["AvailabilityZoneId"]) == (reservation, "active", "use1-az6")
    assert result["estimate"]["node_price"]["basis"] == "capacity-reservation"
    assert result["estimate"]["usd_per_node_hour"] == 21.5   # an ODCR bills the On-Demand rate


@pytest.mark.parametrize("make, expected", [
    (lambda ec2: odcr(ec2, itype="trn1.2xlarge"), "reserves trn1.2xlarge, not instance_type trn1.32xlarge"),
    (lambda ec2: odcr(ec2, zone=OTHER_ZONE), "is in availability zone id use1-az4 (us-east-1d), not "
                                             "availability_zone_id use1-az6"),
    (lambda ec2: odcr(ec2, count=1), "has 1 of its 1 instances available; max_nodes is 2"),
    (lambda ec2: odcr(ec2, EndDateType="limited", EndDate=datetime.now(timezone.utc) + timedelta(hours=1)),
     "before the run's estimated end"),
    (lambda ec2: odcr(ec2, StartDate=datetime.now(timezone.utc) + timedelta(hours=3)),
     "is scheduled and starts at"),
    (lambda ec2: "cr-0000000000000000a", "no such capacity reservation in us-east-1"),
])
def test_each_way_a_reservation_cannot_serve_fails_preflight_naming_it(s3, ec2, make, expected):
    reservation = make(ec2)
    message = refused(long_run(capacity_reservation_id=reservation))
    assert f"- capacity_reservation_id: {reservation}" in message and expected in message, message
    assert "nothing was created" in message


# --- a Capacity Block ------------------------------------------------------------------------------

def test_a_capacity_block_with_its_fee_tagged_prices_the_run(s3, ec2):
    result = preflight(block_plan(capacity_block(ec2, fee_tag=True)))
    price = result["estimate"]["node_price"]
    # The stand-in offering's fee is 10 USD an instance-hour (moto_capacity.STAND_IN_USD_PER_INSTANCE_HOUR).
    assert (price["basis"], price["known"], price["usd_per_hour"]) == ("capacity-block", True, 10.0)
    assert result["estimate"]["node_usd"] == pytest.approx(2 * result["estimate"]["hours"] * 10.0, abs=0.01)
    assert not any("cost estimate" in w for w in result["warnings"])


def test_a_capacity_blocks_unknown_price_is_said(s3, ec2, capsys):
    result = preflight(block_plan(capacity_block(ec2)))
    assert result["estimate"]["node_price"]["known"] is False
    assert result["estimate"]["usd_per_node_hour"] == 21.5
    [warning] = [w for w in result["warnings"] if w.startswith("cost estimate: ")]
    assert "Capacity Block's price is not known" in warning and warning in capsys.readouterr().out


@pytest.mark.parametrize("block, expected", [
    (lambda ec2: capacity_block(ec2, hours=1), "holds instances for 0.5 h"),
    (lambda ec2: capacity_block(ec2, start=datetime.now(timezone.utc) + timedelta(hours=2)),
     "is scheduled and starts at"),
])
def test_a_capacity_blocks_window_must_hold_the_run(s3, ec2, block, expected):
    reservation = block(ec2)
    message = refused(block_plan(reservation))
    assert f"capacity_reservation_id: {reservation} {expected}" in message, message


def test_a_capacity_block_that_starts_within_the_lead_passes(s3, ec2):
    reservation = capacity_block(ec2, start=datetime.now(timezone.utc) + timedelta(minutes=30))
    [kept] = preflight(block_plan(reservation))["reservations"]
    assert kept["State"] == "scheduled"


def test_capacity_type_and_reservation_must_agree(s3, ec2):
    message = refused(block_plan(odcr(ec2)))
    assert "is not a Capacity Block" in message
    message = refused(long_run(capacity_reservation_id=capacity_block(ec2)))
    assert "is a Capacity Block: set capacity_type CAPACITY_BLOCK" in message
    assert "needs static nodes" in refused(block_plan(capacity_block(ec2), min_nodes=0))


def test_the_instance_type_must_support_the_capacity_type(s3, ec2):
    """moto's instance type data (EC2's): trn1n.32xlarge has no capacity-block usage class."""
    message = refused(local(instance_type="trn1n.32xlarge", capacity_type="CAPACITY_BLOCK",
                            capacity_reservation_id=odcr(ec2, itype="trn1n.32xlarge"), min_nodes=2))
    assert "capacity_type CAPACITY_BLOCK: trn1n.32xlarge does not support capacity-block in us-east-1" in message
    assert preflight(local(capacity_type="SPOT"))["estimate"]["node_price"]["basis"] == "spot"


# --- a resource group of reservations ------------------------------------------------------------

@pytest.fixture
def group(ec2, monkeypatch):
    """A capacity reservation group of two ODCRs; its ListGroupResources answered by a Stubber (moto has none)."""
    from botocore.stub import Stubber

    arn = "arn:aws:resource-groups:us-east-1:123456789012:group/trn1-reservations"
    members = [odcr(ec2, count=1), odcr(ec2, count=1)]
    client = boto3.client("resource-groups", region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    stubber = Stubber(client)
    resources = [{"Identifier": {"ResourceArn": f"arn:aws:ec2:us-east-1:123456789012:capacity-reservation/{m}",
                                 "ResourceType": "AWS::EC2::CapacityReservation"}} for m in members]
    stubber.add_response("list_group_resources", {"Resources": resources}, {"Group": arn})
    stubber.activate()
    real_client = AccountHook._service_client
    monkeypatch.setattr(AccountHook, "_service_client", lambda self, service: client if service == "resource-groups"
                        else real_client(self, service))
    yield arn
    stubber.assert_no_pending_responses()


def test_a_groups_reservations_together_cover_max_nodes(s3, group):
    result = preflight(long_run(capacity_reservation_resource_group_arn=group))
    assert len(result["reservations"]) == 2


def test_a_group_short_of_max_nodes_fails(s3, group):
    message = refused(long_run(capacity_reservation_resource_group_arn=group, num_nodes=2, max_nodes=3))
    assert (f"capacity_reservation_resource_group_arn: {group}: its reservations that fit the run have 2 instances "
            "available; max_nodes is 3") in message


# --- the head node's SSH ---------------------------------------------------------------------------

# (the run's ssh_allowed_cidr, the deployment's head_node_ssh_cidr): the production profile has none.
WORLD_OPEN = [(None, None), ("0.0.0.0/0", "127.0.0.0/8"), ("0.0.0.0/0", None)]


@pytest.mark.parametrize("cidr, deployment", WORLD_OPEN)
def test_a_world_open_ssh_is_refused_and_says_why(s3, cidr, deployment):
    message = refused(local(ssh_allowed_cidr=cidr), deployment_cidr=deployment)
    assert "- ssh_allowed_cidr: " in message and "allow_world_ssh" in message and "SSM Session Manager" in message


@pytest.mark.parametrize("cidr, deployment", WORLD_OPEN)
def test_allow_world_ssh_lets_it_through_with_a_warning(s3, cidr, deployment):
    result = preflight(local(ssh_allowed_cidr=cidr, allow_world_ssh=True), deployment_cidr=deployment)
    assert result["plan"]["ssh_allowed_cidr"] == cidr
    assert any("open to the whole internet (0.0.0.0/0), as allow_world_ssh allows" in w for w in result["warnings"])


@pytest.mark.parametrize("cidr, deployment, planned", [
    (None, "127.0.0.0/8", "127.0.0.0/8"), ("203.0.113.7/32", "127.0.0.0/8", "203.0.113.7/32"),
    ("pl-0123456789abcdef0", None, "pl-0123456789abcdef0"),
])
def test_the_plan_carries_the_cidr_render_config_renders(s3, cidr, deployment, planned):
    result = preflight(local(ssh_allowed_cidr=cidr), deployment_cidr=deployment)
    assert result["plan"]["ssh_allowed_cidr"] == planned and not any("ssh" in w for w in result["warnings"])


def test_a_usage_class_that_cannot_be_read_is_a_problem_not_a_pass(s3, monkeypatch):
    """Access denied (a policy without ec2:DescribeInstanceTypes) must not let the check pass unseen."""
    from botocore.exceptions import ClientError

    def denied(self, types):
        raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}, "DescribeInstanceTypes")

    monkeypatch.setattr(AccountHook, "describe_instance_types", denied)
    assert ("capacity_type SPOT: cannot read the usage classes of trn1.32xlarge: UnauthorizedOperation"
            in refused(local(capacity_type="SPOT")))
