"""create_vpc / delete_vpc: the cluster's network as a CloudFormation stack (include/cluster/vpc.yaml).

Heavy imports (boto3/botocore through the amazon provider's hooks) happen inside methods: the DAG
file imports this module at parse time.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from ultracluster.links import CloudFormationStackLink
from ultracluster.tags import DAG_ID_TAG, RUN_ID_TAG, ownership_tags, stack_owner

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["DAG_ID_TAG", "RUN_ID_TAG", "CreateVpcStackOperator", "DeleteVpcStackOperator"]

# Stack outputs (vpc.yaml) -> XCom keys.
_OUTPUT_KEYS = {
    "VpcId": "vpc_id",
    "PublicSubnetId": "public_subnet_id",
    "PrivateSubnetId": "private_subnet_id",
    "SecurityGroupId": "security_group_id",
    "AvailabilityZone": "availability_zone",
}
_STACK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,127}$")
_IN_PROGRESS = ("CREATE_IN_PROGRESS", "UPDATE_IN_PROGRESS", "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS")
_GONE = (None, "DELETE_COMPLETE")


def default_vpc_template() -> str:
    from ultracluster.profiles import include_dir

    return str(include_dir() / "cluster" / "vpc.yaml")


def _stack_tags(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": str(k), "Value": str(v)} for k, v in tags.items()]


class _StackDeleteRounds:
    """
    Deferred delete-and-repair rounds of a stack, shared by create_vpc's clean-up and delete_vpc.

    A round starts the deletion (clearing what blocks it), waits in the triggerer, and on failure
    removes the stack's dependencies through EC2 before the next round. Nothing here waits in the
    worker: a NAT gateway still releasing its Elastic IP is picked up by the next round.
    Subclasses say what a deleted or undeletable stack means (``_stack_deleted``/``_stack_left``).
    """

    aws_conn_id: str | None
    region_name: str | None
    deferrable: bool
    waiter_delay: float
    waiter_max_attempts: int
    max_repair_rounds: int

    def _cfn_hook(self):
        from airflow.providers.amazon.aws.hooks.cloud_formation import CloudFormationHook

        return CloudFormationHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name or None)

    def _ec2_client(self):
        from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook

        return EC2Hook(api_type="client_type", aws_conn_id=self.aws_conn_id, region_name=self.region_name or None).conn

    def _delete_round(self, context: Context, stack_name: str, repair_round: int, **outcome: Any) -> Any:
        hook = self._cfn_hook()
        ec2 = self._ec2_client()
        if start_stack_delete(hook, ec2, stack_name, self.log):
            leftovers = finish_stack_delete(hook, ec2, stack_name, self.log)
            if not leftovers:
                return self._stack_deleted(context, stack_name, **outcome)
            if repair_round >= self.max_repair_rounds:
                return self._stack_left(context, stack_name, leftovers, repair_round, **outcome)
            # E.g. a NAT gateway still deleting holds its subnet and Elastic IP: look again later.
            from datetime import timedelta

            from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

            self.log.warning("Stack %s is gone but left %s; next round in %s s", stack_name, leftovers, self.waiter_delay)
            self._require_deferrable()
            self.defer(
                trigger=TimeDeltaTrigger(timedelta(seconds=self.waiter_delay)),
                method_name="delete_round_complete",
                kwargs={"stack_name": stack_name, "repair_round": repair_round + 1, **outcome},
            )
        from ultracluster.triggers.pcluster import CloudFormationStackTrigger

        self._require_deferrable()
        self.defer(
            trigger=CloudFormationStackTrigger(
                stack_name=stack_name,
                waiter_name="stack_delete_complete",
                aws_conn_id=self.aws_conn_id,
                region_name=hook.region_name,
                waiter_delay=self.waiter_delay,
                waiter_max_attempts=self.waiter_max_attempts,
            ),
            method_name="delete_round_complete",
            kwargs={"stack_name": stack_name, "repair_round": repair_round, **outcome},
        )

    def delete_round_complete(
        self, context: Context, event: Any, stack_name: str = "", repair_round: int = 0, **outcome: Any
    ) -> Any:
        """Resume after a round's wait (a stack event, or the pause of a TimeDeltaTrigger)."""
        payload = event if isinstance(event, dict) else {}
        stack_name = stack_name or payload.get("stack_name")
        if payload.get("status", "success") != "success":
            self.log.warning("Deleting stack %s: %s", stack_name, payload.get("message"))
            hook = self._cfn_hook()
            if repair_round >= self.max_repair_rounds:
                leftovers = leftover_resources(hook.get_conn(), self._ec2_client(), stack_name) or [
                    f"the stack ({hook.get_stack_status(stack_name)})"
                ]
                return self._stack_left(context, stack_name, leftovers, repair_round, **outcome)
            remove_stack_network(hook.get_conn(), self._ec2_client(), stack_name, self.log, include_vpc=False)
            repair_round += 1
        return self._delete_round(context, stack_name, repair_round, **outcome)

    def _require_deferrable(self) -> None:
        if not self.deferrable:
            raise RuntimeError(f"{type(self).__name__} waits with a trigger; run it with deferrable=True")

    def _stack_deleted(self, context: Context, stack_name: str, **outcome: Any) -> Any:
        raise NotImplementedError

    def _stack_left(self, context: Context, stack_name: str, leftovers: list[str], repair_round: int,
                    **outcome: Any) -> Any:
        raise NotImplementedError


class CreateVpcStackOperator(_StackDeleteRounds, BaseOperator):
    """
    Create (or reattach to) this run's VPC stack, or adopt an existing network.

    Returns ``{"owned", "stack_name", "region", "vpc_id", "public_subnet_id", "private_subnet_id",
    "security_group_id", "availability_zone"}``. ``owned`` False means the network was given by
    the user: delete_vpc then leaves it alone.

    :param existing_network: ``{"public_subnet_id", "private_subnet_id", ["security_group_id"]}``
        to reuse instead of creating; None creates the stack.
    :param pipeline_checks: run ``validate_pipeline_params`` on the DAG params first, so a bad conf
        fails before anything is created.
    """

    template_fields: Sequence[str] = (
        "stack_name", "availability_zone_id", "existing_network", "tags", "region_name",
    )
    operator_extra_links = (CloudFormationStackLink(),)
    ui_color = "#f4d8a5"

    def __init__(
        self,
        *,
        stack_name: str,
        availability_zone_id: str,
        existing_network: dict | None = None,
        tags: dict[str, str] | None = None,
        template_path: str | None = None,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        deferrable: bool = True,
        waiter_delay: float = 15,
        waiter_max_attempts: int = 240,
        max_repair_rounds: int = 2,
        pipeline_checks: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stack_name = stack_name
        self.availability_zone_id = availability_zone_id
        self.existing_network = existing_network
        self.tags = tags or {}
        self.template_path = template_path
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.deferrable = deferrable
        self.waiter_delay = waiter_delay
        self.waiter_max_attempts = waiter_max_attempts
        self.max_repair_rounds = max_repair_rounds
        self.pipeline_checks = pipeline_checks

    # --- execute ---
    def execute(self, context: Context) -> dict:
        if self.pipeline_checks:
            from ultracluster.operators.config import validate_pipeline_params

            validate_pipeline_params(dict(context["params"]))
        network = {k: v for k, v in (self.existing_network or {}).items() if v}
        if network:
            return self._adopt_existing(network)
        if not _STACK_NAME.match(self.stack_name):
            raise ValueError(f"Invalid CloudFormation stack name {self.stack_name!r}")

        hook = self._cfn_hook()
        run_id = context["run_id"]
        status = hook.get_stack_status(self.stack_name)
        if status is not None:
            self._check_owner(hook, run_id)
            self.log.info("Stack %s of this run exists (%s): reattaching", self.stack_name, status)
        if status in ("ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "CREATE_FAILED", "ROLLBACK_IN_PROGRESS"):
            # An earlier try failed and did not finish its clean-up: finish it, then fail.
            self._fail_and_clean_up(hook, f"it failed earlier ({status})", context)
        if status in ("DELETE_IN_PROGRESS", "DELETE_FAILED"):
            # A killed earlier try deleted it (trigger on_kill): finish that delete, then create anew.
            self.log.info("Stack %s of this run is %s: deleting it, then creating it again", self.stack_name, status)
            return self._delete_round(context, self.stack_name, 0, failure=None)
        if status is None:
            self._create(hook, context)
            status = hook.get_stack_status(self.stack_name)
        CloudFormationStackLink.persist(
            context=context, region_name=hook.region_name, stack_name=self.stack_name
        )
        if status in _IN_PROGRESS:
            from ultracluster.triggers.pcluster import CloudFormationStackTrigger

            self._require_deferrable()
            self.defer(
                trigger=CloudFormationStackTrigger(
                    stack_name=self.stack_name,
                    waiter_name="stack_create_complete",
                    aws_conn_id=self.aws_conn_id,
                    region_name=hook.region_name,
                    waiter_delay=self.waiter_delay,
                    waiter_max_attempts=self.waiter_max_attempts,
                    owner_run_id=run_id,
                    delete_on_kill=True,
                ),
                method_name="execute_complete",
            )
        if status not in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
            self._fail_and_clean_up(hook, f"stack reached {status}", context)
        return self._outputs(hook)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict:
        hook = self._cfn_hook()
        if event.get("status") != "success":
            self._fail_and_clean_up(hook, event.get("message") or str(event), context)
        return self._outputs(hook)

    def _stack_deleted(self, context: Context, stack_name: str, failure: str | None = None) -> dict:
        if failure is None:  # the leftover of a killed try is gone: create the stack now
            return self.execute(context)
        raise RuntimeError(f"Creating stack {stack_name} failed: {failure}. Clean-up deleted the stack.")

    def _stack_left(self, context: Context, stack_name: str, leftovers: list[str], repair_round: int,
                    failure: str | None = None) -> dict:
        what = f"Creating stack {stack_name} failed: {failure}." if failure else f"Stack {stack_name} of an earlier try."
        raise RuntimeError(f"{what} Clean-up left after {repair_round} repair rounds: {', '.join(leftovers)}")

    # --- helpers ---
    def _create(self, hook, context: Context) -> None:
        template = Path(self.template_path or default_vpc_template()).read_text()
        availability_zone = self._resolve_availability_zone()
        tags = {**self.tags, **ownership_tags(context["dag"].dag_id, context["run_id"])}
        self.log.info("Creating stack %s in %s (%s)", self.stack_name, availability_zone, self.availability_zone_id)
        hook.create_stack(
            self.stack_name,
            {
                "TemplateBody": template,
                "Parameters": [
                    {"ParameterKey": "AvailabilityZone", "ParameterValue": availability_zone},
                    {"ParameterKey": "AvailabilityZoneId", "ParameterValue": self.availability_zone_id},
                ],
                "Tags": _stack_tags(tags),
                # A failed create keeps its resources for diagnosis; this task deletes them itself.
                "OnFailure": "DO_NOTHING",
            },
        )

    def _resolve_availability_zone(self) -> str:
        """AZ id (same in every account) -> this account's AZ name; a clear error when unknown."""
        from botocore.exceptions import ClientError

        try:
            zones = self._ec2_client().describe_availability_zones(ZoneIds=[self.availability_zone_id])[
                "AvailabilityZones"
            ]
        except ClientError as err:
            raise ValueError(
                f"Availability zone id {self.availability_zone_id!r} is not valid here: {err}"
            ) from err
        if not zones:
            raise ValueError(f"Availability zone id {self.availability_zone_id!r} not found in this region")
        return zones[0]["ZoneName"]

    def _check_owner(self, hook, run_id: str) -> None:
        owner = stack_owner(hook.get_conn(), self.stack_name)
        if owner != run_id:
            raise RuntimeError(
                f"Stack {self.stack_name} exists but belongs to run {owner!r}, not {run_id!r}; "
                "refusing to adopt it"
            )

    def _outputs(self, hook) -> dict:
        stack = hook.get_conn().describe_stacks(StackName=self.stack_name)["Stacks"][0]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs") or []}
        result = {"owned": True, "stack_name": self.stack_name, "region": hook.region_name}
        result.update({key: outputs.get(name) for name, key in _OUTPUT_KEYS.items()})
        self.log.info("Network: %s", result)
        return result

    def _fail_and_clean_up(self, hook, reason: str, context: Context) -> None:
        """A teardown does not run when its setup failed: delete what this task created, then fail."""
        try:
            events = hook.get_conn().describe_stack_events(StackName=self.stack_name)["StackEvents"]
            for event in events:
                if event.get("ResourceStatus", "").endswith("FAILED"):
                    self.log.error(
                        "%s %s: %s", event.get("LogicalResourceId"), event.get("ResourceStatus"),
                        event.get("ResourceStatusReason"),
                    )
        except Exception as err:  # diagnostics only; never mask the real failure
            self.log.warning("Could not read stack events: %s", err)
        # Raises from _stack_deleted/_stack_left once the delete-and-repair rounds end.
        self._delete_round(context, self.stack_name, 0, failure=reason)
        raise AssertionError("unreachable")

    def _adopt_existing(self, network: dict) -> dict:
        """Reuse the user's subnets: check they exist and share one VPC and AZ, create nothing."""
        from botocore.exceptions import ClientError

        for key in ("public_subnet_id", "private_subnet_id"):
            if not network.get(key):
                raise ValueError(f"existing network needs {key} (got {sorted(network)})")
        ec2 = self._ec2_client()
        try:
            subnets = ec2.describe_subnets(SubnetIds=[network["public_subnet_id"], network["private_subnet_id"]])[
                "Subnets"
            ]
        except ClientError as err:
            raise ValueError(f"Existing subnets not found: {err}") from err
        vpcs = {s["VpcId"] for s in subnets}
        zones = {s["AvailabilityZone"] for s in subnets}
        if len(vpcs) != 1 or (network.get("vpc_id") and network["vpc_id"] not in vpcs):
            raise ValueError(f"Existing subnets must be in one VPC{' ' + network['vpc_id'] if network.get('vpc_id') else ''}; got {sorted(vpcs)}")
        if len(zones) != 1:
            raise ValueError(f"Existing subnets must be in one availability zone (placement group); got {sorted(zones)}")
        result = {
            "owned": False,
            "stack_name": None,
            "region": self._cfn_hook().region_name,
            "vpc_id": vpcs.pop(),
            "public_subnet_id": network["public_subnet_id"],
            "private_subnet_id": network["private_subnet_id"],
            "security_group_id": network.get("security_group_id"),
            "availability_zone": zones.pop(),
        }
        self.log.info("Reusing existing network (not owned by this run; delete_vpc leaves it): %s", result)
        return result


# --- deletion with dependency repair ---------------------------------------------------------
# CloudFormation tags every EC2 resource it creates with the stack name: that finds a stack's
# resources even when the stack has forgotten them (moto marks a stack DELETE_COMPLETE after a
# refused delete and leaves the VPC, IGW, NAT gateway and route tables behind).
STACK_NAME_TAG = "aws:cloudformation:stack-name"


def _stack_resources(cfn, stack_name: str) -> list[dict]:
    from botocore.exceptions import ClientError

    try:
        paginator = cfn.get_paginator("list_stack_resources")
        return [r for page in paginator.paginate(StackName=stack_name) for r in page["StackResourceSummaries"]]
    except ClientError:
        return []


def _stack_vpc_ids(cfn, ec2, stack_name: str) -> list[str]:
    ids = {r["PhysicalResourceId"] for r in _stack_resources(cfn, stack_name)
           if r["ResourceType"] == "AWS::EC2::VPC" and r.get("PhysicalResourceId")}
    tagged = ec2.describe_vpcs(Filters=[{"Name": f"tag:{STACK_NAME_TAG}", "Values": [stack_name]}])["Vpcs"]
    return sorted(ids | {v["VpcId"] for v in tagged})


def remove_stack_network(cfn, ec2, stack_name: str, log, *, include_vpc: bool) -> list[str]:
    """
    Remove, through EC2, the resources of this stack's VPC; return what was removed.

    ``include_vpc=False`` (the stack still exists) clears what blocks its deletion: VPC endpoints,
    NAT gateways and their Elastic IPs, route table associations, routes and route tables.
    ``include_vpc=True`` (the stack is gone but left resources) also removes the internet gateway,
    subnets, security groups and the VPC itself. Only resources of a VPC tagged with or listed in
    this stack are touched.
    """
    from botocore.exceptions import ClientError

    removed: list[str] = []

    def attempt(label: str, call, **kwargs) -> None:
        try:
            call(**kwargs)
            removed.append(label)
        except ClientError as err:
            log.warning("Could not remove %s: %s", label, err)

    eip_ids = {r["PhysicalResourceId"] for r in _stack_resources(cfn, stack_name)
               if r["ResourceType"] == "AWS::EC2::EIP" and str(r.get("PhysicalResourceId", "")).startswith("eipalloc-")}
    for vpc_id in _stack_vpc_ids(cfn, ec2, stack_name):
        in_vpc = [{"Name": "vpc-id", "Values": [vpc_id]}]
        for endpoint in ec2.describe_vpc_endpoints(Filters=in_vpc).get("VpcEndpoints", []):
            if endpoint.get("State", "").lower() not in ("deleted", "deleting"):
                attempt(f"VPC endpoint {endpoint['VpcEndpointId']}", ec2.delete_vpc_endpoints,
                        VpcEndpointIds=[endpoint["VpcEndpointId"]])
        nats = [n for n in ec2.describe_nat_gateways(Filters=in_vpc).get("NatGateways", [])
                if n.get("State") not in ("deleted", "deleting")]
        for nat in nats:
            eip_ids |= {a["AllocationId"] for a in nat.get("NatGatewayAddresses", []) if a.get("AllocationId")}
            attempt(f"NAT gateway {nat['NatGatewayId']}", ec2.delete_nat_gateway, NatGatewayId=nat["NatGatewayId"])
        # No wait for the NAT gateways here (minutes, in a worker): an Elastic IP or subnet they still
        # hold fails to go now and is retried by the next deferred round.
        for table in ec2.describe_route_tables(Filters=in_vpc).get("RouteTables", []):
            if any(a.get("Main") for a in table.get("Associations", [])):
                continue  # the main table goes with the VPC
            for association in table.get("Associations", []):
                attempt(f"route table association {association['RouteTableAssociationId']}",
                        ec2.disassociate_route_table, AssociationId=association["RouteTableAssociationId"])
            for route in table.get("Routes", []):
                if route.get("GatewayId") == "local" or "DestinationCidrBlock" not in route:
                    continue
                attempt(f"route {route['DestinationCidrBlock']} of {table['RouteTableId']}", ec2.delete_route,
                        RouteTableId=table["RouteTableId"], DestinationCidrBlock=route["DestinationCidrBlock"])
            attempt(f"route table {table['RouteTableId']}", ec2.delete_route_table, RouteTableId=table["RouteTableId"])
        if include_vpc:
            gateways = ec2.describe_internet_gateways(
                Filters=[{"Name": "attachment.vpc-id", "Values": [vpc_id]}]).get("InternetGateways", [])
            for gateway in gateways:
                attempt(f"internet gateway attachment {gateway['InternetGatewayId']}", ec2.detach_internet_gateway,
                        InternetGatewayId=gateway["InternetGatewayId"], VpcId=vpc_id)
                attempt(f"internet gateway {gateway['InternetGatewayId']}", ec2.delete_internet_gateway,
                        InternetGatewayId=gateway["InternetGatewayId"])
            for subnet in ec2.describe_subnets(Filters=in_vpc).get("Subnets", []):
                attempt(f"subnet {subnet['SubnetId']}", ec2.delete_subnet, SubnetId=subnet["SubnetId"])
            for group in ec2.describe_security_groups(Filters=in_vpc).get("SecurityGroups", []):
                if group.get("GroupName") != "default":
                    attempt(f"security group {group['GroupId']}", ec2.delete_security_group, GroupId=group["GroupId"])
            attempt(f"VPC {vpc_id}", ec2.delete_vpc, VpcId=vpc_id)
    for allocation_id in sorted(eip_ids):
        attempt(f"Elastic IP {allocation_id}", ec2.release_address, AllocationId=allocation_id)
    log.info("Removed for stack %s: %s", stack_name, removed or "nothing")
    return removed


def leftover_resources(cfn, ec2, stack_name: str) -> list[str]:
    """What of a stack still exists: its live resources, or its VPC when the stack is gone."""
    live = [
        f"{r['ResourceType']} {r.get('PhysicalResourceId')} ({r.get('ResourceStatus')})"
        for r in _stack_resources(cfn, stack_name)
        if r.get("ResourceStatus") != "DELETE_COMPLETE" and r.get("PhysicalResourceId")
    ]
    orphans = [f"AWS::EC2::VPC {vpc_id} (left by the stack)" for vpc_id in _stack_vpc_ids(cfn, ec2, stack_name)]
    return sorted(set(live + orphans))


def start_stack_delete(hook, ec2, stack_name: str, log) -> bool:
    """delete_stack, clearing dependencies once if it is refused; True when the stack is gone."""
    from botocore.exceptions import ClientError

    cfn = hook.get_conn()
    for attempt in (1, 2):
        if hook.get_stack_status(stack_name) in _GONE:
            return True
        try:
            hook.delete_stack(stack_name)
        except ClientError as err:
            # moto refuses DeleteStack synchronously with DependencyViolation (route tables).
            if err.response.get("Error", {}).get("Code") != "DependencyViolation" or attempt == 2:
                raise
            log.warning("Deleting stack %s refused: %s; removing its dependencies", stack_name, err)
            remove_stack_network(cfn, ec2, stack_name, log, include_vpc=False)
            continue
        break
    return hook.get_stack_status(stack_name) in _GONE


def finish_stack_delete(hook, ec2, stack_name: str, log) -> list[str]:
    """Once the stack is gone: remove anything it left behind; return what still exists."""
    cfn = hook.get_conn()
    if _stack_vpc_ids(cfn, ec2, stack_name):
        log.warning("Stack %s is gone but left its VPC behind: removing it through EC2", stack_name)
        remove_stack_network(cfn, ec2, stack_name, log, include_vpc=True)
    return leftover_resources(cfn, ec2, stack_name) if hook.get_stack_status(stack_name) not in _GONE else [
        item for item in leftover_resources(cfn, ec2, stack_name) if "left by the stack" in item
    ]


class DeleteVpcStackOperator(_StackDeleteRounds, BaseOperator):
    """
    Teardown of create_vpc: check the run's cluster is gone, then delete the run's VPC stack.

    The cluster check runs even for a network the run did not create: delete_cluster's own failure
    does not decide the run state, this task does. A cluster of this run still being deleted is
    waited for (deferrably); one in any other state fails the task and the network is kept.
    Gone already counts as success. A refused or failed deletion (DELETE_FAILED, moto's
    DependencyViolation) gets its dependencies removed through EC2 and is retried in deferred
    rounds; whatever is left after ``max_repair_rounds`` is reported in the error. A network the
    run did not create (``vpc["owned"]`` False) is left alone.

    :param cluster_name: the run's cluster (delete_cluster's name); empty skips the check.
    """

    template_fields: Sequence[str] = ("vpc", "stack_name", "region_name", "cluster_name")
    operator_extra_links = (CloudFormationStackLink(),)
    ui_color = "#f4d8a5"

    def __init__(
        self,
        *,
        vpc: dict | None = None,
        stack_name: str | None = None,
        cluster_name: str | None = None,
        aws_conn_id: str | None = "aws_default",
        pcluster_conn_id: str = "pcluster_default",
        region_name: str | None = None,
        deferrable: bool = True,
        waiter_delay: float = 15,
        waiter_max_attempts: int = 120,
        max_repair_rounds: int = 2,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.vpc = vpc
        self.stack_name = stack_name
        self.cluster_name = cluster_name
        self.aws_conn_id = aws_conn_id
        self.pcluster_conn_id = pcluster_conn_id
        self.region_name = region_name
        self.deferrable = deferrable
        self.waiter_delay = waiter_delay
        self.waiter_max_attempts = waiter_max_attempts
        self.max_repair_rounds = max_repair_rounds

    def _target(self) -> str | None:
        vpc = self.vpc if isinstance(self.vpc, dict) else {}
        if vpc and not vpc.get("owned", True):
            return None
        return vpc.get("stack_name") or self.stack_name

    def execute(self, context: Context) -> dict:
        self._check_cluster_gone(context)
        return self._delete_network(context)

    def _check_cluster_gone(self, context: Context) -> None:
        """Return when the run's cluster is gone; defer while it is deleting; raise otherwise."""
        from ultracluster.hooks.parallelcluster import ParallelClusterHook
        from ultracluster.parsers.pcluster import ClusterNotFoundError
        from ultracluster.tags import cluster_owner

        if not self.cluster_name:
            return
        hook = ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name or None)
        try:
            description = hook.describe_cluster(self.cluster_name)
        except ClusterNotFoundError:
            self.log.info("Cluster %s is gone", self.cluster_name)
            return
        owner = cluster_owner(description)
        if owner != context["run_id"]:
            self.log.info("Cluster %s belongs to run %r, not this one: not waited for", self.cluster_name, owner)
            return
        status = description.get("clusterStatus")
        if status == "DELETE_IN_PROGRESS":
            from ultracluster.triggers.pcluster import ClusterStatusTrigger

            self.log.info("Cluster %s is still being deleted: waiting before the network goes", self.cluster_name)
            self._require_deferrable()
            self.defer(
                trigger=ClusterStatusTrigger(
                    cluster_name=self.cluster_name,
                    waiter_name="ClusterDeleteComplete",
                    pcluster_conn_id=self.pcluster_conn_id,
                    region_name=self.region_name or None,
                    poll_interval=self.waiter_delay,
                    max_attempts=self.waiter_max_attempts,
                ),
                method_name="cluster_gone_complete",
            )
        raise RuntimeError(
            f"Cluster {self.cluster_name} of this run still exists ({status}): delete_cluster did not delete it. "
            "The network is kept; delete the cluster, then clear delete_cluster and delete_vpc."
        )

    def cluster_gone_complete(self, context: Context, event: dict[str, Any]) -> dict:
        if event.get("status") != "success":
            raise RuntimeError(
                f"Cluster {self.cluster_name} of this run did not finish deleting "
                f"({event.get('cluster_status') or event.get('status')}): {event.get('message')}. The network is kept."
            )
        self.log.info("Cluster %s is gone", self.cluster_name)
        return self._delete_network(context)

    def _delete_network(self, context: Context) -> dict:
        stack_name = self._target()
        if stack_name is None:
            self.log.info("Network %s was not created by this run: left alone", (self.vpc or {}).get("vpc_id"))
            return {"deleted": False, "stack_name": None, "reason": "not owned"}
        return self._delete_round(context, stack_name, 0)

    def execute_complete(self, context: Context, event: dict[str, Any], repair_round: int = 0) -> dict:
        # Resume point of deferrals made before the rounds moved to delete_round_complete.
        return self.delete_round_complete(context, event, stack_name=event.get("stack_name") or self._target(),
                                          repair_round=repair_round)

    def _stack_deleted(self, context: Context, stack_name: str) -> dict:
        self.log.info("Stack %s deleted", stack_name)
        return {"deleted": True, "stack_name": stack_name}

    def _stack_left(self, context: Context, stack_name: str, leftovers: list[str], repair_round: int) -> dict:
        raise RuntimeError(
            f"Stack {stack_name} not deleted after {repair_round} repair rounds; left: {', '.join(leftovers)}"
        )
