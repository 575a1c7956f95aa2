"""preflight's capacity checks (docs/operations.md, "Capacity"): the instance type supports the
run's ``capacity_type``, and the reservation the training queue targets (or its resource group's
reservations) can serve the run, judged by ``run.capacity``.

Deterministic answers (an unknown reservation or group, a usage class the type lacks) are problems
naming the param; transient ones propagate, so the task retries.
"""
from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from ultracluster.run import capacity
from ultracluster.run.errors import aws_error_code, is_transient

# DescribeInstanceTypes' SupportedUsageClasses value for each capacity type that needs one.
USAGE_CLASS = {capacity.SPOT: "spot", capacity.CAPACITY_BLOCK: "capacity-block"}
NOT_FOUND = {"InvalidCapacityReservationId.NotFound", "InvalidCapacityReservationId.Malformed",
             "NotFoundException"}
_RESERVATION_ARN = re.compile(r":capacity-reservation/(cr-[0-9a-f]+)$")


def capacity_problems(ec2: Any, plan: dict[str, Any], *, run_hours: float, needed_by: datetime, now: datetime,
                      found: list[dict[str, Any]]) -> list[str]:
    """Problems with the plan's capacity; the reservations described go into ``found`` (for the price).

    :param run_hours: the run's estimated duration; ``needed_by``: when its nodes must be able to start.
    """
    problems = _usage_class(ec2, plan)
    if capacity.reservation_target(plan) is None or capacity.plan_capacity_problems(plan):
        return problems   # no reservation; or a combination the plan's own rules refuse
    param = capacity.ID_PARAM if plan.get(capacity.ID_PARAM) else capacity.GROUP_PARAM
    try:
        reservations = _describe(ec2, plan, param)
    except ClientError as err:
        if is_transient(err):
            raise
        if aws_error_code(err) not in NOT_FOUND:
            return problems + [f"{param}: cannot read {plan[param]}: {aws_error_code(err) or err}"]
        if param == capacity.GROUP_PARAM:
            return problems + [f"{param}: no resource group {plan[param]}"]
        reservations = []
    found.extend(reservations)
    return problems + capacity.reservation_problems(plan, reservations, now=now, needed_by=needed_by,
                                                    run_hours=run_hours)


def _describe(ec2: Any, plan: dict[str, Any], param: str) -> list[dict[str, Any]]:
    if param == capacity.ID_PARAM:
        return ec2.describe_capacity_reservations([plan[param]])
    ids = [m.group(1) for arn in ec2.list_group_resources(plan[param]) if (m := _RESERVATION_ARN.search(arn))]
    return ec2.describe_capacity_reservations(ids) if ids else []


def _usage_class(ec2: Any, plan: dict[str, Any]) -> list[str]:
    """Spot and Capacity Blocks exist for some instance types only (DescribeInstanceTypes says which)."""
    wanted, itype = USAGE_CLASS.get(capacity.capacity_type(plan)), plan.get("instance_type")
    if not wanted or not itype:
        return []
    try:
        [described] = ec2.describe_instance_types([itype])
    except ClientError as err:
        if is_transient(err):
            raise
        if aws_error_code(err).startswith("InvalidInstanceType"):
            return []   # an unknown type: the offering check names it
        return [f"capacity_type {capacity.capacity_type(plan)}: cannot read the usage classes of {itype}: "
                f"{aws_error_code(err) or err}"]
    classes = described.get("SupportedUsageClasses") or []
    if wanted in classes:
        return []
    return [f"capacity_type {capacity.capacity_type(plan)}: {itype} does not support {wanted} in "
            f"{plan.get('region')} (its usage classes: {', '.join(classes) or 'none'})"]
