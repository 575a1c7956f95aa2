"""A sweep on one cluster: every point of a scaling sweep trains on one cluster, held by ``trn1_sweep_cluster``.

A sweep asks for it with ``"cluster": "shared"`` in its ``sweep`` param (``ultracluster sweep --cluster
shared`` sets it). The holder DAG creates one cluster, named after the sweep (``cluster_name``) and
sized to its largest point (``holder_plan``), holds it until the sweep index lists every point on it
and all have ended, then deletes it. Each point is an ordinary run on a cluster it did not create: its
plan names the shared cluster as ``existing_cluster_name`` (``point_cluster``), so it creates and
deletes nothing, its fleet wait waits while other points hold the nodes, and it is billed from its
own Slurm jobs' node-hours. What the points did not use (head node, FSx, idle nodes) is the sweep's
shared overhead (``overhead``), a line of its own in the report.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

HOLDER_DAG_ID = "trn1_sweep_cluster"
OWN, SHARED = "own", "shared"
# Where the holder's bill of the shared cluster goes: <artifacts>/sweeps/<dag_id>/<sweep_id>/<this>/usage.json.
USAGE_FOLDER = "shared-cluster"
# A point waits this long at most for nodes other points hold (the fleet wait's held_nodes_timeout).
HELD_NODES_TIMEOUT_S = 72 * 3600


class SharedClusterError(ValueError):
    """A sweep conf that cannot have a shared cluster (deterministic)."""


def is_shared(sweep: Mapping[str, Any] | None) -> bool:
    """Does this sweep (the ``sweep`` param) train every point on one cluster?"""
    return bool(sweep) and sweep.get("cluster") == SHARED


def cluster_name(sweep_id: str) -> str:
    """The shared cluster of sweep ``sweep_id``: known to every point from the sweep conf alone (a
    backfill gives every run the same conf). Sweep ids (``run.sweep.SWEEP_ID_PATTERN``: at most 40
    of [a-z0-9-]) keep it a valid ParallelCluster name of at most 49 characters."""
    return f"uc-sweep-{sweep_id}"


def point_cluster(sweep: Mapping[str, Any] | None) -> str | None:
    """The cluster a point of this sweep trains on when it is shared; None: the point makes its own."""
    return cluster_name(str(sweep["id"])) if is_shared(sweep) else None


def largest_point(sweep: Mapping[str, Any]) -> int:
    """The most nodes any point of the sweep trains on: the shared cluster's size."""
    points = [int(n) for n in sweep.get("num_nodes") or []]
    if not points:
        raise SharedClusterError(f"sweep {sweep.get('id')}: a shared cluster needs the sweep's points (num_nodes)")
    return max(points)


def holder_plan(params: Mapping[str, Any]) -> dict[str, Any]:
    """The holder's plan: the pipeline's params for a cluster of the sweep's largest point, named after
    the sweep; it trains nothing (no sweep point, nothing indexed)."""
    sweep = params.get("sweep")
    if not sweep or not sweep.get("id"):
        raise SharedClusterError("trn1_sweep_cluster needs a sweep: {\"id\", \"num_nodes\": [...]}")
    if params.get("existing_cluster_name"):
        raise SharedClusterError("existing_cluster_name: the holder creates the sweep's cluster; leave it empty")
    largest = largest_point(sweep)
    min_nodes = params.get("min_nodes") if isinstance(params.get("min_nodes"), int) else 0
    return {**params, "num_nodes": largest, "max_nodes": max(largest, min_nodes),
            "cluster_name": cluster_name(str(sweep["id"])), "sweep_point": None, "existing_cluster_name": None,
            "sweep": {**sweep, "cluster": SHARED}}


def points_conf(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The conf every point of a shared-cluster sweep is started with, and its holder too: the sweep
    marked shared, so each point's plan names the shared cluster (``point_cluster``)."""
    return {**conf, "sweep": {**conf["sweep"], "cluster": SHARED}}


def node_hours_of(usage: Mapping[str, Any] | None) -> float:
    """Compute node-hours in a bill (``run.cost``'s usage shapes)."""
    return float((usage or {}).get("compute_node_hours") or 0.0)


def usage_key(sweep_prefix: str) -> str:
    """The key of the holder's bill under the sweep's prefix (``run.sweep.sweep_location``)."""
    return f"{sweep_prefix}/{USAGE_FOLDER}/usage.json"


def overhead(cluster_usage: Mapping[str, Any] | None, point_usages: Iterable[Mapping[str, Any] | None]
             ) -> dict[str, Any] | None:
    """The sweep's shared overhead: the shared cluster's bill (the holder's, from EC2) less what its
    points were billed for their jobs' node-hours (``point_usages``: each ``{"usd",
    "compute_node_hours"}``). None until the holder has billed the cluster.

    ``{"usd", "head_node_usd", "fsx_usd", "idle_node_hours", "idle_nodes_usd", "cluster_usd",
    "points_usd"}``: the head node and FSx are all overhead; of the compute nodes' time, what no
    point's job used is idle.
    """
    if not cluster_usage or cluster_usage.get("usd") is None:
        return None
    points = [u or {} for u in point_usages]
    points_usd = sum(float(u.get("usd") or 0.0) for u in points)
    head = float(cluster_usage.get("head_node_usd") or 0.0)
    fsx = float(cluster_usage.get("fsx_usd") or 0.0)
    compute = float(cluster_usage.get("compute_usd") or max(0.0, float(cluster_usage["usd"]) - head - fsx))
    idle_usd = max(0.0, compute - points_usd)
    idle_hours = max(0.0, node_hours_of(cluster_usage) - sum(node_hours_of(u) for u in points))
    return {"usd": round(head + fsx + idle_usd, 6), "head_node_usd": head, "fsx_usd": fsx,
            "idle_nodes_usd": round(idle_usd, 6), "idle_node_hours": round(idle_hours, 6),
            "cluster_usd": float(cluster_usage["usd"]), "points_usd": round(points_usd, 6)}
