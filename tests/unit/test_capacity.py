"""run.capacity and run.ssh_access: the capacity params' rules, a reservation judged against the run
(state and start, type, AZ, platform, count, end, a Capacity Block's window), its price in the cost
estimate, and who may reach the head node's SSH."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from ultracluster.run import capacity
from ultracluster.run.cost import estimate, load_prices
from ultracluster.run.profiles import load_profile
from ultracluster.run.ssh_access import allowed_ips, flag, ssh_problems, ssh_warnings

NOW = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
CR, GROUP = "cr-0123456789abcdef0", "arn:aws:resource-groups:us-east-1:123456789012:group/trn1-odcrs"


def plan(**changes) -> dict:
    return {**load_profile("local"), "region": "us-east-1", "availability_zone_id": "use1-az6", "max_nodes": 4,
            "min_nodes": 0, "num_nodes": 4, **changes}


def reservation(**changes) -> dict:
    """As DescribeCapacityReservations returns one (boto3: dates as datetimes)."""
    return {"CapacityReservationId": CR, "InstanceType": "trn1.32xlarge", "InstancePlatform": "Linux/UNIX",
            "AvailabilityZone": "us-east-1b", "AvailabilityZoneId": "use1-az6", "State": "active",
            "TotalInstanceCount": 4, "AvailableInstanceCount": 4, "StartDate": NOW - HOUR, "EndDate": None,
            "ReservationType": "default", "Tags": [], **changes}


def block(**changes) -> dict:
    return reservation(**{"ReservationType": "capacity-block", "StartDate": NOW - HOUR, "EndDate": NOW + 24 * HOUR,
                          **changes})


def reasons(item: dict, run_hours: float = 2.0, **plan_changes) -> list[str]:
    return capacity.reservation_reasons(item, plan(**plan_changes), now=NOW, needed_by=NOW + HOUR, run_hours=run_hours)


# --- the params' rules ----------------------------------------------------------------------------

def test_the_profiles_default_to_on_demand_without_a_reservation():
    for name in ("production", "local"):
        profile = load_profile(name)
        assert capacity.capacity_type(profile) == "ONDEMAND" and capacity.reservation_target(profile) is None
        assert capacity.plan_capacity_problems(profile) == []


@pytest.mark.parametrize("changes, target", [
    ({"capacity_reservation_id": CR}, {"CapacityReservationId": CR}),
    ({"capacity_reservation_resource_group_arn": GROUP}, {"CapacityReservationResourceGroupArn": GROUP}),
    ({}, None),
])
def test_the_target_is_spelled_as_parallelcluster_takes_it(changes, target):
    assert capacity.reservation_target(plan(**changes)) == target


@pytest.mark.parametrize("changes, message", [
    ({"capacity_reservation_id": CR, "capacity_reservation_resource_group_arn": GROUP}, "set one or the other"),
    ({"capacity_type": "SPOT", "capacity_reservation_id": CR}, "not Spot"),
    ({"capacity_type": "CAPACITY_BLOCK", "min_nodes": 4}, "needs capacity_reservation_id"),
    ({"capacity_type": "CAPACITY_BLOCK", "capacity_reservation_resource_group_arn": GROUP, "min_nodes": 4},
     "takes no resource group"),
    ({"capacity_type": "CAPACITY_BLOCK", "capacity_reservation_id": CR}, r"min_nodes = max_nodes > 0 .*got min_nodes 0"),
    ({"capacity_type": "CAPACITY_BLOCK", "capacity_reservation_id": CR, "min_nodes": 0, "max_nodes": 0},
     "min_nodes = max_nodes > 0"),
    ({"capacity_type": "RESERVED"}, "not one of ONDEMAND, SPOT, CAPACITY_BLOCK"),
])
def test_each_rule_names_its_params(changes, message):
    import re

    problems = capacity.plan_capacity_problems(plan(**changes))
    assert len(problems) == 1 and re.search(message, problems[0]), problems


def test_a_capacity_block_with_static_nodes_passes():
    assert capacity.plan_capacity_problems(plan(capacity_type="CAPACITY_BLOCK", capacity_reservation_id=CR,
                                                min_nodes=4, max_nodes=4)) == []


@pytest.mark.parametrize("kind, target, expected", [
    ("ONDEMAND", None, True), ("SPOT", None, True), ("CAPACITY_BLOCK", {"CapacityReservationId": CR}, False),
    ("ONDEMAND", {"CapacityReservationId": CR}, False),
])
def test_a_placement_group_only_without_reserved_capacity(kind, target, expected):
    assert capacity.placement_group(True, kind, target) is expected
    assert capacity.placement_group(False, kind, target) is False


# --- a reservation against the run ------------------------------------------------------------------

def test_a_fitting_reservation_has_no_reasons():
    assert reasons(reservation()) == []
    assert reasons(block(), capacity_type="CAPACITY_BLOCK") == []


@pytest.mark.parametrize("item, expected", [
    (reservation(State="expired"), "is expired"),
    (reservation(State="cancelled"), "is cancelled"),
    (reservation(State="scheduled", StartDate=NOW + 2 * HOUR), "is scheduled and starts at 2026-12-01 10:00 UTC, "
                                                               "after the run needs it (by 2026-12-01 09:00 UTC)"),
    (reservation(InstanceType="trn1n.32xlarge"), "reserves trn1n.32xlarge, not instance_type trn1.32xlarge"),
    (reservation(AvailabilityZoneId="use1-az4", AvailabilityZone="us-east-1a"),
     "is in availability zone id use1-az4 (us-east-1a), not availability_zone_id use1-az6"),
    (reservation(InstancePlatform="Windows"), "is for platform Windows; the Ubuntu nodes need Linux/UNIX"),
    (reservation(EndDate=NOW + HOUR), "ends at 2026-12-01 09:00 UTC, before the run's estimated end at "
                                      "2026-12-01 10:00 UTC (2.0 h)"),
    (block(), "is a Capacity Block: set capacity_type CAPACITY_BLOCK"),
])
def test_each_reason_a_reservation_cannot_serve(item, expected):
    assert reasons(item) == [expected]


def test_a_reservation_starting_before_it_is_needed_serves_from_its_start():
    later = reservation(State="scheduled", StartDate=NOW + HOUR / 2, EndDate=NOW + 2 * HOUR)
    assert reasons(later, run_hours=1.5) == []     # from 08:30 for 1.5 h: ends 10:00, as it does
    assert reasons(later, run_hours=1.6)[0].startswith("ends at 2026-12-01 10:00 UTC")


def test_a_capacity_block_must_hold_the_run_and_stops_half_an_hour_early():
    kind = {"capacity_type": "CAPACITY_BLOCK"}
    short = block(StartDate=NOW + HOUR / 2, EndDate=NOW + 2 * HOUR, State="scheduled")
    assert reasons(short, run_hours=1.5, **kind) == [
        "holds instances for 1.0 h (2026-12-01 08:30 UTC to 2026-12-01 10:00 UTC (EC2 stops a block's instances "
        "30 minutes before its end)), less than the run's estimated 1.5 h"]
    assert reasons(short, run_hours=1.0, **kind) == []
    ending = block(StartDate=NOW - 20 * HOUR, EndDate=NOW + 2 * HOUR)    # a long window, mostly spent
    assert reasons(ending, run_hours=1.6, **kind)[0].startswith("ends at 2026-12-01 10:00 UTC (EC2 stops")
    assert reasons(reservation(), **kind) == ["is not a Capacity Block (capacity_type CAPACITY_BLOCK needs one; an "
                                              "On-Demand Capacity Reservation runs with capacity_type ONDEMAND)"]


def test_the_count_must_cover_max_nodes():
    judge = dict(now=NOW, needed_by=NOW + HOUR, run_hours=2.0)
    item = reservation(TotalInstanceCount=8, AvailableInstanceCount=3)
    problems = capacity.reservation_problems(plan(capacity_reservation_id=CR), [item], **judge)
    assert problems == [f"capacity_reservation_id: {CR} has 3 of its 8 instances available; max_nodes is 4"]
    # Before it starts, all its instances count.
    later = reservation(State="scheduled", StartDate=NOW + HOUR / 2, TotalInstanceCount=4, AvailableInstanceCount=0)
    assert capacity.reservation_problems(plan(capacity_reservation_id=CR), [later], **judge) == []
    assert capacity.reservation_problems(plan(capacity_reservation_id=CR), [], **judge) == [
        f"capacity_reservation_id: {CR}: no such capacity reservation in us-east-1"]


def test_a_groups_fitting_reservations_add_up():
    judge = dict(now=NOW, needed_by=NOW + HOUR, run_hours=2.0)
    group = plan(capacity_reservation_resource_group_arn=GROUP)
    two = [reservation(CapacityReservationId="cr-a", TotalInstanceCount=2, AvailableInstanceCount=2),
           reservation(CapacityReservationId="cr-b", TotalInstanceCount=2, AvailableInstanceCount=2)]
    assert capacity.reservation_problems(group, two, **judge) == []
    two[1]["InstanceType"] = "trn1.2xlarge"
    [problem] = capacity.reservation_problems(group, two, **judge)
    assert problem == (f"capacity_reservation_resource_group_arn: {GROUP}: its reservations that fit the run have 2 "
                       "instances available; max_nodes is 4 (the rest would launch On-Demand, without a reservation); "
                       "cr-b reserves trn1.2xlarge, not instance_type trn1.32xlarge")
    assert "holds no capacity reservation" in capacity.reservation_problems(group, [], **judge)[0]


def test_a_summary_is_json():
    import json

    summary = capacity.summary(block())
    assert json.loads(json.dumps(summary))["EndDate"] == "2026-12-02T08:00:00+00:00"


# --- the price ---------------------------------------------------------------------------------------

def test_on_demand_and_a_reservation_bill_the_on_demand_rate():
    assert capacity.node_price(plan(), None, 21.5) == {"basis": "on-demand", "usd_per_hour": 21.5, "known": True,
                                                       "note": None}
    price = capacity.node_price(plan(capacity_reservation_id=CR), [reservation()], 21.5)
    assert (price["basis"], price["usd_per_hour"], price["known"]) == ("capacity-reservation", 21.5, True)


def test_a_capacity_blocks_fee_tag_sets_its_rate_and_its_absence_is_said():
    kind = dict(capacity_type="CAPACITY_BLOCK", capacity_reservation_id=CR, min_nodes=4)
    tagged = block(StartDate=NOW, Tags=[{"Key": capacity.UPFRONT_FEE_TAG, "Value": "960"}])   # 4 instances x 24 h
    assert capacity.node_price(plan(**kind), [tagged], 21.5)["usd_per_hour"] == 10.0
    unknown = capacity.node_price(plan(**kind), [block()], 21.5)
    assert (unknown["usd_per_hour"], unknown["known"]) == (21.5, False)
    assert "price is not known" in unknown["note"] and capacity.UPFRONT_FEE_TAG in unknown["note"]
    bad = block(Tags=[{"Key": capacity.UPFRONT_FEE_TAG, "Value": "a lot"}])
    assert capacity.node_price(plan(**kind), [bad], 21.5)["known"] is False
    spot = capacity.node_price(plan(capacity_type="SPOT"), None, 21.5)
    assert spot["known"] is False and "upper bound" in spot["note"]


def test_the_reservations_price_reaches_the_cost_estimate():
    prices = load_prices()
    run = plan(num_nodes=4, capacity_type="CAPACITY_BLOCK", capacity_reservation_id=CR, min_nodes=4)
    on_demand = estimate(run, prices, world_size=8)
    price = capacity.node_price(run, [block(StartDate=NOW, Tags=[{"Key": capacity.UPFRONT_FEE_TAG, "Value": "960"}])],
                                on_demand["usd_per_node_hour"])
    reserved = estimate(run, prices, world_size=8, node_price=price)
    assert on_demand["node_price"]["basis"] == "on-demand" and reserved["node_price"] == price
    assert reserved["usd_per_node_hour"] == 10.0
    assert reserved["node_usd"] == pytest.approx(4 * reserved["hours"] * 10.0, abs=0.01)
    assert reserved["usd"] < on_demand["usd"] and reserved["hours"] == on_demand["hours"]
    assert reserved["head_node_usd"] == on_demand["head_node_usd"]


# --- SSH ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cidr, allow, rendered", [
    ("203.0.113.7/32", False, "203.0.113.7/32"), ("pl-0123abcd", False, "pl-0123abcd"),
    ("0.0.0.0/0", True, "0.0.0.0/0"), (None, True, "0.0.0.0/0"), ("", True, "0.0.0.0/0"),
    ("127.0.0.0/8", False, "127.0.0.0/8"),
])
def test_what_renders_as_allowed_ips(cidr, allow, rendered):
    assert allowed_ips(cidr, allow) == rendered


@pytest.mark.parametrize("cidr, message", [
    ("0.0.0.0/0", "opens the head node's SSH (port 22) to the whole internet"),
    ("10.1.2.3/0", "to the whole internet"),
    ("::/0", "to the whole internet"),
    (None, "not set, and ParallelCluster then opens"),
    ("", "not set"),
    ("2001:db8::/32", "is IPv6"),
    ("10.0.0.0/33", "neither a CIDR nor a prefix list"),
])
def test_a_world_open_or_unusable_cidr_is_refused_and_says_why(cidr, message):
    [problem] = ssh_problems(cidr, False)
    assert problem.startswith("ssh_allowed_cidr: ") and message in problem
    if "internet" in message or "not set" in message:
        assert "allow_world_ssh" in problem and "SSM Session Manager" in problem
    with pytest.raises(ValueError, match="ssh_allowed_cidr"):
        allowed_ips(cidr, False)


def test_the_override_lets_the_world_in_with_a_warning():
    assert ssh_problems("0.0.0.0/0", True) == [] and ssh_problems(None, True) == []
    assert ssh_problems("::/0", True)[0].endswith("is IPv6; ParallelCluster's AllowedIps takes an IPv4 CIDR or "
                                                  "a prefix list")
    [warning] = ssh_warnings("0.0.0.0/0", True)
    assert "open to the whole internet (0.0.0.0/0), as allow_world_ssh allows" in warning
    assert ssh_warnings("203.0.113.7/32", True) == [] and ssh_warnings("0.0.0.0/0", False) == []


@pytest.mark.parametrize("value, expected", [(True, True), ("True", True), ("true", True), (False, False),
                                             ("False", False), (None, False), ("", False)])
def test_a_rendered_flag(value, expected):
    assert flag(value) is expected
