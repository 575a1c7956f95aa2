"""The deployment's node cap, as pcluster_create applies it before creating (docs/operations.md).

A cluster counts what it may hold at once:
- a cluster of this pipeline that is live counts its tagged MaxCount (``ultracluster:nodes``): it may
  scale to that at any moment, so the cap reserves it;
- a cluster in DELETE_FAILED, or one without the tag (created by hand or by another tool), counts
  the compute instances EC2 lists alive for it: those are what still bills and holds quota, and a
  stuck delete whose fleet is gone must not hold the cap forever.
"""
from __future__ import annotations

from typing import Any, Callable

from ultracluster.parsers.pcluster import ClusterNotFoundError
from ultracluster.run.states import DELETE_COMPLETE, DELETE_FAILED
from ultracluster.run.tags import cluster_nodes

# EC2 states that still hold the vCPU quota.
ALIVE_STATES = frozenset({"pending", "running", "stopping", "shutting-down"})
NODE_TYPE_TAG = "parallelcluster:node-type"


def live_compute_instances(instances: list[dict]) -> int:
    """Compute instances not yet terminated or stopped, from describe-instances."""
    count = 0
    for instance in instances:
        tags = {t.get("Key"): t.get("Value") for t in instance.get("Tags") or []}
        if tags.get(NODE_TYPE_TAG) == "Compute" and (instance.get("State") or {}).get("Name") in ALIVE_STATES:
            count += 1
    return count


def nodes_held(hook: Any, describe_instances: Callable[[str], list[dict]], exclude: str) -> dict[str, tuple[int, str]]:
    """``{cluster name: (nodes, basis)}`` for every cluster in the region but ``exclude``.

    ``hook`` is a ParallelClusterHook; ``describe_instances(cluster_name)`` lists the cluster's EC2
    instances (ClusterInstancesHook.describe_instances).
    """
    held: dict[str, tuple[int, str]] = {}
    for cluster in hook.list_clusters():
        name, status = cluster.get("clusterName"), cluster.get("clusterStatus")
        if name == exclude or status == DELETE_COMPLETE:
            continue
        try:
            tagged = cluster_nodes(hook.describe_cluster(name))
        except ClusterNotFoundError:
            continue
        if tagged is not None and status != DELETE_FAILED:
            held[name] = (tagged, "MaxCount")
        else:
            held[name] = (live_compute_instances(describe_instances(name)),
                          "live instances, " + ("DELETE_FAILED" if status == DELETE_FAILED else "untagged"))
    return held


def describe_held(held: dict[str, tuple[int, str]]) -> str:
    return ", ".join(f"{name}: {nodes} ({basis})" for name, (nodes, basis) in sorted(held.items())) or "none"
