"""The EC2 instances of a cluster, as ParallelCluster tags them: what delete_cluster bills from.

Thin: one method per API call, named after it.
"""
from __future__ import annotations

from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook

CLUSTER_NAME_TAG = "parallelcluster:cluster-name"


class ClusterInstancesHook(EC2Hook):
    """EC2Hook (client API) reading the instances of one ParallelCluster cluster."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["api_type"] = "client_type"
        super().__init__(*args, **kwargs)

    def describe_instances(self, cluster_name: str) -> list[dict]:
        """Every instance tagged with the cluster, terminated ones included (EC2 lists those for
        about an hour after termination: read them right after the delete)."""
        pages = self.conn.get_paginator("describe_instances").paginate(
            Filters=[{"Name": f"tag:{CLUSTER_NAME_TAG}", "Values": [cluster_name]}])
        return [instance for page in pages for reservation in page["Reservations"]
                for instance in reservation["Instances"]]
