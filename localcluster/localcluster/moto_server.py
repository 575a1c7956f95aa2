"""The local UltraCluster's AWS: moto's server, with CloudFormation stack deletion made to work.

moto's CloudFormation cannot delete a VPC stack that has a NAT gateway, a VPC endpoint, an
internet gateway attachment or subnet route tables (moto 5.2.5): those resources' deletes are
no-ops, so DeleteStack fails with DependencyViolation on the VPC after forgetting the stack, and
the network stays. Real CloudFormation deletes them. This module gives moto the missing deletes,
so the product's delete_vpc needs no moto workaround, and the PutCompositeAlarm action the cluster
stack's head-node alarm needs (moto stores composite alarms but does not route the action). Stdlib
and moto only: the tests load it into an in-process moto too (``install()``). The server also
answers capacity reservations and Capacity Blocks (``moto_capacity``), and knows AWS's managed IAM
policies, as an account does (pcluster's validator reads AdditionalIamPolicies' with iam:GetPolicy).

A delete that still fails (a resource with a real dependency, e.g. a VPC holding a subnet made
outside the stack) ends as on AWS: the stack stays, DELETE_FAILED, with a DELETE_FAILED event per
resource left and its reason; DeleteStack may be called again. moto would forget the stack.

    python -m localcluster.moto_server -H 127.0.0.1 -p 5055
"""
from __future__ import annotations

import sys
from typing import Any


def _backend(resource_map: Any) -> Any:
    from moto.ec2.models import ec2_backends

    return ec2_backends[resource_map._account_id][resource_map._region_name]


def _delete_nat_gateway(ec2: Any, resource: Any) -> None:
    ec2.delete_nat_gateway(resource.id)
    ec2.nat_gateways.pop(resource.id, None)  # moto only marks it "deleted"


def _delete_vpc_endpoint(ec2: Any, resource: Any) -> None:
    ec2.delete_vpc_endpoints([resource.id])


def _detach_internet_gateway(ec2: Any, resource: Any) -> None:
    gateway = ec2.internet_gateways.get(resource.gateway_id)
    if gateway is not None and gateway.vpc is not None:
        ec2.detach_internet_gateway(resource.gateway_id, gateway.vpc.id)


def _delete_internet_gateway(ec2: Any, resource: Any) -> None:
    if resource.id in ec2.internet_gateways:
        ec2.delete_internet_gateway(resource.id)  # DependencyViolation while attached: next pass


def _disassociate_route_table(ec2: Any, resource: Any) -> None:
    table = ec2.route_tables.get(resource.route_table_id)
    for association_id, subnet_id in list((table._associations if table else {}).items()):
        if subnet_id == resource.subnet_id:
            ec2.disassociate_route_table(association_id)


def _delete_route_table(ec2: Any, resource: Any) -> None:
    if resource.id not in ec2.route_tables:
        return
    # CloudFormation deletes in dependency order: a gateway endpoint naming the table goes first.
    if any(resource.id in (e.route_table_ids or []) and e.state != "deleted" for e in ec2.vpc_end_points.values()):
        raise RuntimeError(f"route table {resource.id} is still used by a VPC endpoint")
    ec2.delete_route_table(resource.id)  # DependencyViolation while associated: next pass


def _delete_route(ec2: Any, resource: Any) -> None:
    table = resource.route_table
    if table.id in ec2.route_tables and resource.destination_cidr_block in (
            r.destination_cidr_block for r in table.routes.values()):
        ec2.delete_route(table.id, resource.destination_cidr_block)


def _release_address(ec2: Any, resource: Any) -> None:
    if any(a.allocation_id == resource.allocation_id for a in ec2.addresses if resource.allocation_id):
        ec2.release_address(allocation_id=resource.allocation_id)


_DELETES = {
    "AWS::EC2::NatGateway": _delete_nat_gateway,
    "AWS::EC2::VPCEndpoint": _delete_vpc_endpoint,
    "AWS::EC2::VPCGatewayAttachment": _detach_internet_gateway,
    "AWS::EC2::InternetGateway": _delete_internet_gateway,
    "AWS::EC2::SubnetRouteTableAssociation": _disassociate_route_table,
    "AWS::EC2::RouteTable": _delete_route_table,
    "AWS::EC2::Route": _delete_route,
    "AWS::EC2::EIP": _release_address,
}


def install() -> None:
    """Give moto's stack deletion the EC2 deletes it lacks (idempotent)."""
    from moto.cloudformation.parsing import ResourceMap

    original = ResourceMap._delete_resource
    if getattr(original, "_localcluster", False):
        return

    def _delete_resource(self: Any, parsed_resource: Any, resource_json: dict[str, Any]) -> None:
        errors = self.__dict__.setdefault("_localcluster_errors", {})
        logical_id = getattr(parsed_resource, "logical_resource_id", None)
        delete = _DELETES.get(resource_json.get("Type", ""))
        try:
            if delete is None:
                original(self, parsed_resource, resource_json)
            else:
                # Raising leaves the resource for moto's next pass (its loop retries in dependency order).
                delete(_backend(self), parsed_resource)
        except Exception as err:
            errors[logical_id] = str(err) or type(err).__name__
            raise
        errors.pop(logical_id, None)

    _delete_resource._localcluster = True  # type: ignore[attr-defined]
    ResourceMap._delete_resource = _delete_resource
    _install_delete_failed()


class _DeleteFailed(Exception):
    pass


def _install_delete_failed() -> None:
    from moto.cloudformation.models import CloudFormationBackend, Event, Stack

    def stack_delete(self: Any) -> None:
        self._add_stack_event("DELETE_IN_PROGRESS", resource_status_reason="User Initiated")
        try:
            self.resource_map.delete()
        except Exception as err:
            resources = self.resource_map
            errors = resources.__dict__.get("_localcluster_errors", {})
            left = [key for key, value in resources._parsed_resources.items()
                    if key in resources._resource_json_map and not isinstance(value, str)]
            for logical_id in left:
                self.events.append(Event(
                    stack_id=self.stack_id, stack_name=self.name, logical_resource_id=logical_id,
                    physical_resource_id=getattr(resources._parsed_resources[logical_id], "physical_resource_id", ""),
                    resource_type=resources._resource_json_map[logical_id].get("Type", ""),
                    resource_status="DELETE_FAILED",
                    resource_status_reason=errors.get(logical_id) or str(err), resource_properties=None))
            self._add_stack_event("DELETE_FAILED", resource_status_reason=(
                f"The following resource(s) failed to delete: [{', '.join(sorted(left))}]. "))
            self.status = "DELETE_FAILED"
            raise _DeleteFailed() from err
        self._add_stack_event("DELETE_COMPLETE")
        self.status = "DELETE_COMPLETE"

    original_delete_stack = CloudFormationBackend.delete_stack

    def delete_stack(self: Any, name_or_stack_id: str) -> None:
        stack = self.stacks.get(name_or_stack_id) or next(
            (s for s in self.stacks.values() if s.name == name_or_stack_id), None)
        if stack is None:
            return original_delete_stack(self, name_or_stack_id)
        try:
            original_delete_stack(self, stack.stack_id)
        except _DeleteFailed:
            self.stacks[stack.stack_id] = stack  # AWS keeps a DELETE_FAILED stack; DeleteStack still answers 200
            self.deleted_stacks.pop(stack.stack_id, None)

    Stack.delete = stack_delete
    CloudFormationBackend.delete_stack = delete_stack
    install_put_composite_alarm()


def install_put_composite_alarm() -> None:
    """moto stores composite alarms (PutMetricAlarm's AlarmRule; DescribeAlarms lists them) but has no
    PutCompositeAlarm action: route it to the same handler. IAM still judges it as PutCompositeAlarm."""
    from moto.cloudwatch.responses import CloudWatchResponse

    if not hasattr(CloudWatchResponse, "put_composite_alarm"):
        CloudWatchResponse.put_composite_alarm = CloudWatchResponse.put_metric_alarm


def main(argv: list[str] | None = None) -> None:
    import os

    from moto.server import main as moto_main

    from localcluster import moto_capacity

    os.environ.setdefault("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")  # read when an account's IAM starts
    install()
    moto_capacity.install()
    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
