"""Capacity: what EC2 capacity the training queue launches into, and whether a reservation can serve
the run (docs/operations.md, "Capacity").

``capacity_type`` (ONDEMAND, SPOT, CAPACITY_BLOCK) is the training queue's ``CapacityType``; a capacity
reservation (``capacity_reservation_id``: an On-Demand Capacity Reservation or a Capacity Block) or a
resource group of reservations (``capacity_reservation_resource_group_arn``) is its compute resource's
``CapacityReservationTarget``. The plan's rules follow ParallelCluster 3.16.1's own validators
(``ComputeResourceSizeValidator``, ``CapacityTypeValidator``, ``CapacityReservationValidator``,
``CapacityReservationSizeValidator``); the reservation's judgement reads EC2's
``DescribeCapacityReservations`` shape (dates as datetimes or ISO strings).
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ultracluster.run.clock import iso, parse_time
from ultracluster.run.form import CAPACITY_TYPES

ONDEMAND, SPOT, CAPACITY_BLOCK = CAPACITY_TYPES
CAPACITY_BLOCK_TYPE = "capacity-block"   # DescribeCapacityReservations' ReservationType of a block
LINUX_UNIX = "Linux/UNIX"                # the platform ParallelCluster requires for Ubuntu nodes
# States of a reservation that has not started yet: usable once it starts (EC2's CapacityReservationState).
STARTING_STATES = frozenset({"scheduled", "pending", "payment-pending", "assessing", "delayed"})
# EC2 starts terminating a Capacity Block's instances 30 minutes before the block ends.
CAPACITY_BLOCK_END_MARGIN = timedelta(minutes=30)
# EC2 does not report what a Capacity Block cost once bought: a tag with its upfront fee (USD) tells it.
UPFRONT_FEE_TAG = "ultracluster:upfront-fee-usd"
ID_PARAM, GROUP_PARAM = "capacity_reservation_id", "capacity_reservation_resource_group_arn"


def capacity_type(plan: dict[str, Any]) -> str:
    return str(plan.get("capacity_type") or ONDEMAND)


def reservation_target(plan: dict[str, Any]) -> dict[str, str] | None:
    """The compute resource's CapacityReservationTarget, as ParallelCluster spells it (None: none)."""
    if plan.get(ID_PARAM):
        return {"CapacityReservationId": str(plan[ID_PARAM])}
    if plan.get(GROUP_PARAM):
        return {"CapacityReservationResourceGroupArn": str(plan[GROUP_PARAM])}
    return None


def placement_group(efa: bool, capacity: str, target: dict | None) -> bool:
    """A managed placement group for EFA types, except with reserved capacity: a Capacity Block needs
    none (ParallelCluster warns on one), and a reservation made in a placement group of its own
    conflicts with another (an ERROR of ParallelCluster's PlacementGroupCapacityReservationValidator)."""
    return efa and capacity != CAPACITY_BLOCK and target is None


def plan_capacity_problems(plan: dict[str, Any]) -> list[str]:
    """The capacity params' cross-field rules (no AWS): one line each, naming the params."""
    kind, target = capacity_type(plan), reservation_target(plan)
    problems = []
    if kind not in CAPACITY_TYPES:
        problems.append(f"capacity_type {kind!r} is not one of {', '.join(CAPACITY_TYPES)}")
    if plan.get(ID_PARAM) and plan.get(GROUP_PARAM):
        problems.append(f"{ID_PARAM} and {GROUP_PARAM}: set one or the other (ParallelCluster takes one target)")
    if kind == SPOT and target:
        problems.append(f"capacity_type SPOT: a capacity reservation serves On-Demand or Capacity Block instances, "
                        f"not Spot; clear {ID_PARAM}/{GROUP_PARAM} or use ONDEMAND or CAPACITY_BLOCK")
    if kind == CAPACITY_BLOCK:
        if not plan.get(ID_PARAM):
            problems.append(f"capacity_type CAPACITY_BLOCK needs {ID_PARAM}, the Capacity Block's reservation "
                            "(ParallelCluster takes no resource group for a block)")
        low, high = plan.get("min_nodes"), plan.get("max_nodes")
        if isinstance(low, int) and isinstance(high, int) and (low != high or low == 0):
            problems.append(f"capacity_type CAPACITY_BLOCK needs static nodes, min_nodes = max_nodes > 0 "
                            f"(ParallelCluster: MinCount = MaxCount on a Capacity Block); got min_nodes {low}, "
                            f"max_nodes {high}")
    return problems


def _when(value: Any) -> str:
    moment = parse_time(value)
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "an unknown time"


def available(reservation: dict[str, Any]) -> int:
    """Instances the run can launch into it: those not in use once active, all of them before it starts."""
    key = "AvailableInstanceCount" if reservation.get("State") == "active" else "TotalInstanceCount"
    return int(reservation.get(key) or 0)


def reservation_reasons(reservation: dict[str, Any], plan: dict[str, Any], *, now: datetime,
                        needed_by: datetime, run_hours: float) -> list[str]:
    """Why ``reservation`` cannot serve the run (empty: it can, for as many instances as ``available``).

    :param needed_by: when the run's nodes must be able to start (a reservation that starts later fails).
    :param run_hours: the run's estimated duration (``run.cost.estimate``'s hours): from when the
        reservation can first be used, the run must end before the reservation does.
    """
    reasons = []
    state, start, end = reservation.get("State"), parse_time(reservation.get("StartDate")), \
        parse_time(reservation.get("EndDate"))
    use_from = now
    if state in STARTING_STATES:
        if start is None or start > needed_by:
            reasons.append(f"is {state} and starts at {_when(start)}, after the run needs it (by {_when(needed_by)})")
        use_from = max(now, start or now)
    elif state != "active":
        reasons.append(f"is {state}")
    if reservation.get("InstanceType") != plan.get("instance_type"):
        reasons.append(f"reserves {reservation.get('InstanceType')}, not instance_type {plan.get('instance_type')}")
    zone = reservation.get("AvailabilityZoneId")
    if zone != plan.get("availability_zone_id"):
        reasons.append(f"is in availability zone id {zone} ({reservation.get('AvailabilityZone')}), not "
                       f"availability_zone_id {plan.get('availability_zone_id')}")
    if reservation.get("InstancePlatform") != LINUX_UNIX:
        reasons.append(f"is for platform {reservation.get('InstancePlatform')}; the Ubuntu nodes need {LINUX_UNIX}")
    block = reservation.get("ReservationType") == CAPACITY_BLOCK_TYPE
    if capacity_type(plan) == CAPACITY_BLOCK and not block:
        reasons.append("is not a Capacity Block (capacity_type CAPACITY_BLOCK needs one; an On-Demand Capacity "
                       "Reservation runs with capacity_type ONDEMAND)")
    elif block and capacity_type(plan) != CAPACITY_BLOCK:
        reasons.append("is a Capacity Block: set capacity_type CAPACITY_BLOCK")
    if end is not None:
        usable_until = end - CAPACITY_BLOCK_END_MARGIN if block else end
        run_end = use_from + timedelta(hours=run_hours)
        window = (usable_until - start).total_seconds() / 3600 if block and start else None
        stop = " (EC2 stops a block's instances 30 minutes before its end)" if block else ""
        if window is not None and window < run_hours:
            reasons.append(f"holds instances for {window:.1f} h ({_when(start)} to {_when(end)}{stop}), less than "
                           f"the run's estimated {run_hours:.1f} h")
        elif usable_until < run_end:
            reasons.append(f"ends at {_when(end)}{stop}, before the run's estimated end at {_when(run_end)} "
                           f"({run_hours:.1f} h)")
    return reasons


def reservation_problems(plan: dict[str, Any], reservations: list[dict[str, Any]], *, now: datetime,
                         needed_by: datetime, run_hours: float) -> list[str]:
    """The plan's reservation (or its group's reservations, as EC2 describes them) against the run:
    each must fit it, and together they must hold ``max_nodes`` instances."""
    param = ID_PARAM if plan.get(ID_PARAM) else GROUP_PARAM
    name = plan.get(param)
    if not reservations:
        what = "no such capacity reservation" if param == ID_PARAM else "the group holds no capacity reservation"
        return [f"{param}: {name}: {what} in {plan.get('region')}"]
    judged = [(r, reservation_reasons(r, plan, now=now, needed_by=needed_by, run_hours=run_hours))
              for r in reservations]
    wanted = plan.get("max_nodes") if isinstance(plan.get("max_nodes"), int) else 0
    if param == ID_PARAM:
        [(reservation, reasons)] = judged[:1]
        problems = [f"{param}: {name} {reason}" for reason in reasons]
        if not reasons and available(reservation) < wanted:
            problems.append(f"{param}: {name} has {available(reservation)} of its "
                            f"{reservation.get('TotalInstanceCount')} instances available; max_nodes is {wanted}")
        return problems
    usable = sum(available(r) for r, reasons in judged if not reasons)
    if usable >= wanted:
        return []
    unfit = "; ".join(f"{r.get('CapacityReservationId')} {', '.join(reasons)}" for r, reasons in judged if reasons)
    return [f"{param}: {name}: its reservations that fit the run have {usable} instances available; max_nodes is "
            f"{wanted} (the rest would launch On-Demand, without a reservation)" + (f"; {unfit}" if unfit else "")]


def node_price(plan: dict[str, Any], reservations: list[dict[str, Any]] | None,
               on_demand_usd_per_hour: float) -> dict[str, Any]:
    """What a compute node-hour costs this run: ``{"basis", "usd_per_hour", "known", "note"}``.

    On-Demand and an On-Demand Capacity Reservation bill the On-Demand rate (a reservation does so
    while it is active, used or not). A Capacity Block's upfront fee is known only from its
    ``UPFRONT_FEE_TAG``: spread over its instances and hours. Spot's price is known only at launch.
    An unknown price is estimated at the On-Demand rate, and ``note`` says so.
    """
    kind = capacity_type(plan)
    if kind == SPOT:
        return {"basis": "spot", "usd_per_hour": on_demand_usd_per_hour, "known": False,
                "note": "Spot's price is known only at launch: estimated at the On-Demand rate, an upper bound"}
    if kind == CAPACITY_BLOCK:
        block = (reservations or [{}])[0]
        rate = _block_rate(block)
        if rate is not None:
            return {"basis": "capacity-block", "usd_per_hour": rate, "known": True,
                    "note": f"the Capacity Block's upfront fee (tag {UPFRONT_FEE_TAG}) over its instances and hours"}
        return {"basis": "capacity-block", "usd_per_hour": on_demand_usd_per_hour, "known": False,
                "note": f"the Capacity Block's price is not known (EC2 does not report a bought block's upfront fee; "
                        f"tag the reservation {UPFRONT_FEE_TAG}=<fee>): estimated at the On-Demand rate"}
    if reservation_target(plan):
        return {"basis": "capacity-reservation", "usd_per_hour": on_demand_usd_per_hour, "known": True,
                "note": "an On-Demand Capacity Reservation bills the On-Demand rate while it is active, used or not"}
    return {"basis": "on-demand", "usd_per_hour": on_demand_usd_per_hour, "known": True, "note": None}


def _block_rate(block: dict[str, Any]) -> float | None:
    fee = next((t.get("Value") for t in block.get("Tags") or [] if t.get("Key") == UPFRONT_FEE_TAG), None)
    start, end = parse_time(block.get("StartDate")), parse_time(block.get("EndDate"))
    count = int(block.get("TotalInstanceCount") or 0)
    try:
        fee = float(fee) if fee is not None else None
    except ValueError:
        return None
    if fee is None or fee < 0 or start is None or end is None or end <= start or not count:
        return None
    return round(fee / (count * (end - start).total_seconds() / 3600), 4)


def summary(reservation: dict[str, Any]) -> dict[str, Any]:
    """A reservation as preflight's XCom keeps it (JSON: dates as ISO strings)."""
    keys = ("CapacityReservationId", "ReservationType", "State", "InstanceType", "AvailabilityZoneId",
            "TotalInstanceCount", "AvailableInstanceCount")
    return {**{k: reservation.get(k) for k in keys}, "StartDate": iso(parse_time(reservation.get("StartDate"))),
            "EndDate": iso(parse_time(reservation.get("EndDate")))}
