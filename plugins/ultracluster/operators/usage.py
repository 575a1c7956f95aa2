"""What a run cost: delete_cluster's accounting from EC2 (the cluster's instance lives), or, on an
existing cluster (``existing_cluster_name``), collect_results' from the run's own Slurm jobs
(docs/operations.md, Cost).

The accounting never fails the task it runs in: a failure to read EC2, Slurm or S3 is a warning in
the log and leaves ``usage`` None (or results.json without it).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ultracluster.hooks.artifacts import ArtifactsS3Hook
from ultracluster.hooks.cluster_instances import ClusterInstancesHook
from ultracluster.hooks.head_node import HeadNodeUnreachableError
from ultracluster.hooks.slurm import SlurmCommandError, SlurmHook
from ultracluster.parsers.ec2 import instance_life
from ultracluster.parsers.slurm import SlurmParseError
from ultracluster.run.clock import utc_now
from ultracluster.run.cost import (
    NO_PRICES,
    PriceError,
    instance_usage,
    job_usage,
    load_prices,
    task_span_jobs,
)
from ultracluster.run.existing_cluster import named
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
    now = datetime.now(timezone.utc)
    usage = instance_usage([instance_life(i, now) for i in instances], _prices(op), _fsx_gib(op.fsx_storage_capacity_gib))
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
        write_beside_results(op, usage, op.results_uri)
    return usage


def _prices(op: Any) -> dict[str, Any]:
    try:
        return load_prices()
    except PriceError as err:
        op.log.warning("Instance-hours only, no cost: %s", err)
        return NO_PRICES


def record_job_usage(op: Any, slurm: SlurmHook, billing: Mapping[str, Any], run_start: datetime | None,
                     results_uri: str) -> dict[str, Any] | None:
    """Bill a run on an existing cluster from its own Slurm jobs (``cost.job_usage``): sacct's elapsed
    time x nodes of every job of the run's job names, or, on a cluster without accounting, the jobs'
    task spans; write it beside the run's results (``op``: a CollectResultsOperator).

    :param billing: ``{"existing_cluster_name", "instance_type", "num_nodes", "jobs": [SlurmJobOperator's
        XComs]}``.
    :param run_start: the DAG run's start: sacct looks from the day before (the cluster's clock may be
        in another zone).
    """
    results = [j for j in billing.get("jobs") or [] if isinstance(j, Mapping)]
    names = sorted({str(j["job_name"]) for j in results if j.get("job_name")})
    since = (run_start or datetime.now(timezone.utc)) - timedelta(days=1)
    try:
        jobs = slurm.sacct_usage(names, since.strftime("%Y-%m-%d")) if names else None
    except (SlurmCommandError, SlurmParseError, HeadNodeUnreachableError, ValueError) as err:
        op.log.warning("Actual cost unknown: sacct on cluster %s failed: %s", billing.get("existing_cluster_name"), err)
        return None
    source = "sacct" if jobs is not None else "task_spans"
    if jobs is None:
        op.log.warning("Cluster %s has no Slurm accounting: the run is billed from its jobs' task spans",
                       billing.get("existing_cluster_name"))
        jobs = task_span_jobs(results, int(billing.get("num_nodes") or 0))
    usage = job_usage(jobs, billing.get("instance_type"), _prices(op), source)
    usage.update(cluster_name=named(billing.get("existing_cluster_name")), measured_at=utc_now())
    op.log.info("The run's %d Slurm job(s) on existing cluster %s used %.3f node-hours of %s (%s): $%s; the cluster's "
                "own life is not the run's bill", len(jobs), usage["cluster_name"], usage["compute_node_hours"],
                billing.get("instance_type"), source, "unknown" if usage["usd"] is None else f"{usage['usd']:.2f}")
    write_beside_results(op, usage, results_uri)
    return usage


def write_beside_results(op: Any, usage: dict[str, Any], results_uri: str) -> None:
    """usage.json in the run's results folder, and results.json's ``usage`` key."""
    bucket, prefix = split_s3_uri(results_uri)
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
        op.log.warning("Usage not written beside the results in %s: %s", results_uri, err)
