"""The cluster's network: one CloudFormation stack (include/cluster/vpc.yaml) plus EC2 lookups.

Thin: one method per API call the VPC operators make, named after it.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.providers.amazon.aws.hooks.cloud_formation import CloudFormationHook
from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook
from botocore.exceptions import ClientError

from ultracluster.run.tags import RUN_ID_TAG


class NetworkStackHook(CloudFormationHook):
    """CloudFormationHook (get_stack_status, create_stack, delete_stack) with the network's reads."""

    @cached_property
    def ec2(self) -> Any:
        return EC2Hook(api_type="client_type", aws_conn_id=self.aws_conn_id, region_name=self.region_name,
                       verify=self.verify, config=self.config).conn

    def describe_stack(self, stack_name: str) -> dict:
        return self.get_conn().describe_stacks(StackName=stack_name)["Stacks"][0]

    def describe_stacks(self) -> list[dict]:
        """Every stack in the region that is not deleted, with its tags (the reaper's scan)."""
        paginator = self.get_conn().get_paginator("describe_stacks")
        return [stack for page in paginator.paginate() for stack in page["Stacks"]]

    def stack_owner(self, stack_name: str) -> str | None:
        """Run id tagged on the stack (docs/contracts.md)."""
        return {t["Key"]: t["Value"] for t in self.describe_stack(stack_name).get("Tags") or []}.get(RUN_ID_TAG)

    def failed_resources(self, stack_name: str) -> list[str]:
        """'Logical (Type) STATUS: reason' of the stack's failed resource events, newest first."""
        try:
            paginator = self.get_conn().get_paginator("describe_stack_events")
            events = [e for page in paginator.paginate(StackName=stack_name) for e in page["StackEvents"]]
        except ClientError:
            return []
        return [
            f"{e.get('LogicalResourceId')} ({e.get('ResourceType')}) {e.get('ResourceStatus')}: "
            f"{e.get('ResourceStatusReason')}"
            for e in events
            if str(e.get("ResourceStatus", "")).endswith("FAILED") and e.get("LogicalResourceId") != stack_name
        ]

    def describe_availability_zone(self, zone_id: str) -> str:
        """AZ id (the same in every account) -> this account's AZ name."""
        try:
            zones = self.ec2.describe_availability_zones(ZoneIds=[zone_id])["AvailabilityZones"]
        except ClientError as err:
            raise ValueError(f"Availability zone id {zone_id!r} is not valid here: {err}") from err
        if not zones:
            raise ValueError(f"Availability zone id {zone_id!r} not found in this region")
        return zones[0]["ZoneName"]

    def describe_subnets(self, subnet_ids: list[str]) -> list[dict]:
        try:
            return self.ec2.describe_subnets(SubnetIds=subnet_ids)["Subnets"]
        except ClientError as err:
            raise ValueError(f"Existing subnets not found: {err}") from err
