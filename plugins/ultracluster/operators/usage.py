"""What a deleted cluster cost, from EC2: delete_cluster's accounting (docs/operations.md, Cost).

A teardown must finish its job whatever the accounting does: a failure to read EC2 or to write S3
is a warning in the log and leaves ``usage`` None (or results.json without it), never a failed delete.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.hooks.cluster_instances import ClusterInstancesHook
from ultracluster.parsers.ec2 import instance_life
from ultracluster.run.cost import NO_PRICES, PriceError, instance_usage, load_prices
from ultracluster.run.s3 import split_s3_uri

USAGE_FILE = "usage.json"
RESULTS_FILE = "results.json"


def _fsx_gib(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "", "None") else None
    except (TypeError, ValueError):
        return None


def record_usage(op: Any, deleted_at: str) -> dict[str, Any] | None:
    """Bill the cluster of ``op`` (a DeleteClusterOperator) from its instances; write it beside the
    run's results. Returns the usage (``cost.instance_usage`` plus ``cluster_name``, ``measured_at``)."""
    try:
        instances = ClusterInstancesHook(aws_conn_id=op.aws_conn_id, region_name=op.region_name or None
                                         ).describe_instances(op.cluster_name)
    except (BotoCoreError, ClientError) as err:
        op.log.warning("Actual cost unknown: describe-instances of cluster %s failed: %s", op.cluster_name, err)
        return None
    if not instances:
        op.log.warning("No cost recorded: EC2 lists no instance tagged parallelcluster:cluster-name=%s (none "
                       "was launched, or they ended over an hour ago and EC2 no longer lists them)", op.cluster_name)
        return None
    try:
        prices = load_prices()
    except PriceError as err:
        op.log.warning("Instance-hours only, no cost: %s", err)
        prices = NO_PRICES
    now = datetime.now(timezone.utc)
    usage = instance_usage([instance_life(i, now) for i in instances], prices, _fsx_gib(op.fsx_storage_capacity_gib))
    usage.update(cluster_name=op.cluster_name, measured_at=deleted_at)
    money = {k: "unknown" if usage[k] is None else f"{usage[k]:.2f}"
             for k in ("usd", "compute_usd", "head_node_usd", "fsx_usd")}
    op.log.info(
        "Cluster %s used %.3f instance-hours (compute nodes %.3f h, head node %.3f h) over %d instances: "
        "$%s (compute $%s, head node $%s, FSx $%s)%s", op.cluster_name, usage["instance_hours"],
        usage["compute_node_hours"], usage["head_node_hours"], usage["instances"], money["usd"],
        money["compute_usd"], money["head_node_usd"], money["fsx_usd"],
        f"; no price for {', '.join(usage['unpriced_types'])}" if usage["unpriced_types"] else "")
    if usage["unended"]:
        op.log.warning("%d instance(s) of %s not terminated yet: counted up to now", usage["unended"], op.cluster_name)
    if op.results_uri and op.results_uri != "None":
        write_beside_results(op, usage)
    return usage


def write_beside_results(op: Any, usage: dict[str, Any]) -> None:
    """usage.json in the run's results folder, and results.json's ``usage`` key."""
    bucket, prefix = split_s3_uri(op.results_uri)
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    s3 = ArtifactsS3Hook(aws_conn_id=op.aws_conn_id, sse=op.s3_encryption)
    try:
        s3.load_string(json.dumps(usage, indent=2), key=prefix + USAGE_FILE, bucket_name=bucket, replace=True)
        if s3.check_for_key(prefix + RESULTS_FILE, bucket_name=bucket):
            results = json.loads(s3.read_key(prefix + RESULTS_FILE, bucket_name=bucket))
            results["usage"] = usage
            s3.load_string(json.dumps(results, indent=2), key=prefix + RESULTS_FILE, bucket_name=bucket, replace=True)
        op.log.info("Usage written to s3://%s/%s%s and into %s", bucket, prefix, USAGE_FILE, RESULTS_FILE)
    except (BotoCoreError, ClientError, ValueError) as err:
        op.log.warning("Usage not written beside the results in %s: %s", op.results_uri, err)
