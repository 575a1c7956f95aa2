"""The account facts preflight checks before anything is created: key pairs, instance type
offerings by AZ id and usage classes, the Trn vCPU quota, and capacity reservations (a resource
group's too).

Thin: one method per API call, named after it.
"""
from __future__ import annotations

from typing import Any

from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook

# Service Quotas: EC2 "Running On-Demand Trn instances" (vCPUs).
TRN_VCPU_QUOTA_CODE = "L-2C3B7624"


class AccountHook(EC2Hook):
    """EC2Hook (client API) plus the Service Quotas read preflight needs."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["api_type"] = "client_type"
        super().__init__(*args, **kwargs)

    def describe_key_pairs(self, key_name: str) -> list[dict]:
        """The key pair named ``key_name``; raises ClientError InvalidKeyPair.NotFound when absent."""
        return self.conn.describe_key_pairs(KeyNames=[key_name])["KeyPairs"]

    def describe_instance_type_offerings(self, zone_id: str, instance_types: list[str]) -> list[str]:
        """Which of ``instance_types`` the AZ id offers."""
        pages = self.conn.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone-id",
            Filters=[{"Name": "location", "Values": [zone_id]}, {"Name": "instance-type", "Values": instance_types}])
        return [o["InstanceType"] for page in pages for o in page["InstanceTypeOfferings"]]

    def describe_instance_types(self, instance_types: list[str]) -> list[dict]:
        """EC2's description of each type (``SupportedUsageClasses``: on-demand, spot, capacity-block)."""
        return self.conn.describe_instance_types(InstanceTypes=instance_types)["InstanceTypes"]

    def describe_capacity_reservations(self, reservation_ids: list[str]) -> list[dict]:
        """The reservations by id; raises ClientError InvalidCapacityReservationId.NotFound for an unknown one."""
        pages = self.conn.get_paginator("describe_capacity_reservations").paginate(
            CapacityReservationIds=reservation_ids)
        return [r for page in pages for r in page["CapacityReservations"]]

    def list_group_resources(self, group_arn: str) -> list[str]:
        """The ARNs of a resource group's members (a capacity reservation group's reservations)."""
        pages = self._service_client("resource-groups").get_paginator("list_group_resources").paginate(Group=group_arn)
        return [r["Identifier"]["ResourceArn"] for page in pages for r in page.get("Resources", [])]

    def get_service_quota(self, service_code: str, quota_code: str) -> float:
        client = self._service_client("service-quotas")
        return float(client.get_service_quota(ServiceCode=service_code, QuotaCode=quota_code)["Quota"]["Value"])

    def _service_client(self, service: str) -> Any:
        """The connection's session, endpoint and config, for one more service than the hook's own."""
        return self.get_session(region_name=self.region_name).client(
            service, endpoint_url=self.conn_config.get_service_endpoint_url(service_name=service),
            config=self._get_config(), verify=self.verify)
