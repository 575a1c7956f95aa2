"""What a run on an existing cluster (``existing_cluster_name``) cost: collect_results' bill from the
run's own Slurm jobs (docs/operations.md, Cost). A cluster the run created is billed by delete_cluster
from EC2 (hooks.usage).

The accounting never fails the task it runs in: a failure to read Slurm or S3 is a warning in the log
and leaves ``usage`` None (or results.json without it).
"""
from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from ultracluster import remote_commands
from ultracluster.hooks.head_node import HeadNodeUnreachableError
from ultracluster.hooks.slurm import SlurmCommandError, SlurmHook
from ultracluster.hooks.usage import write_beside_results
from ultracluster.parsers.files import FileOutputError, parse_modified_times
from ultracluster.parsers.slurm import SlurmParseError
from ultracluster.run.clock import utc_now
from ultracluster.run.cost import job_marker_seconds, job_usage, prices_for_billing, task_span_jobs
from ultracluster.run.existing_cluster import named


def _marker_seconds(op: Any, slurm: SlurmHook, results: list[Mapping[str, Any]]) -> dict[str, int]:
    """job id -> the seconds it ran, from the markers next to its log (``remote_commands.sbatch``: the
    name file as it starts, the exit file as it ends): a task's span also holds the job's wait in
    Slurm's queue, behind other runs' jobs on a shared cluster."""
    stems = {str(j["job_id"]): j["log_path"].removesuffix(".out") for j in results
             if j.get("job_id") and str(j.get("log_path") or "").endswith(".out")}
    markers = {job_id: (stem + ".name", stem + ".exit") for job_id, stem in stems.items()}
    if not markers:
        return {}
    try:
        result = slurm.head_node_hook.run(remote_commands.modified_times(*[p for pair in markers.values() for p in pair]))
        return job_marker_seconds(parse_modified_times(result.stdout), markers)
    except (HeadNodeUnreachableError, FileOutputError) as err:
        op.log.warning("The jobs' markers could not be read (%s): billed from their task spans", err)
        return {}


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
        op.log.warning("Cluster %s has no Slurm accounting: the run is billed from its jobs' start and exit "
                       "markers, else their task spans", billing.get("existing_cluster_name"))
        ran = _marker_seconds(op, slurm, results)
        source = "job_markers" if ran and len(ran) == len(results) else source
        jobs = task_span_jobs(results, int(billing.get("num_nodes") or 0), ran)
    usage = job_usage(jobs, billing.get("instance_type"), prices_for_billing(op.log.warning, "Node-hours"), source)
    usage.update(cluster_name=named(billing.get("existing_cluster_name")), measured_at=utc_now())
    op.log.info("The run's %d Slurm job(s) on existing cluster %s used %.3f node-hours of %s (%s): $%s; the cluster's "
                "own life is not the run's bill", len(jobs), usage["cluster_name"], usage["compute_node_hours"],
                billing.get("instance_type"), source, "unknown" if usage["usd"] is None else f"{usage['usd']:.2f}")
    write_beside_results(op.log, {"results_uri": results_uri, "aws_conn_id": op.aws_conn_id,
                                  "s3_encryption": op.s3_encryption}, usage)
    return usage
