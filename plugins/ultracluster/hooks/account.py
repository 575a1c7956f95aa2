"""The account facts preflight checks before anything is created: key pairs, instance type
offerings by AZ id, and the Trn vCPU quota.

Thin: one method per API call, named after it.
"""
from __future__ import annotations

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

    def get_service_quota(self, service_code: str, quota_code: str) -> float:
        # The connection's session, endpoint and config, for one more service than the hook's own.
        client = self.get_session(region_name=self.region_name).client(
            "service-quotas", endpoint_url=self.conn_config.get_service_endpoint_url(service_name="service-quotas"),
            config=self._get_config(), verify=self.verify)
        return float(client.get_service_quota(ServiceCode=service_code, QuotaCode=quota_code)["Quota"]["Value"])
