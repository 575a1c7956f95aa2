"""A run on an existing cluster (``existing_cluster_name``; docs/operations.md, "Bring your own
cluster"): preflight's checks of the cluster, the steps that skip or adopt it, and what pcluster_create
returns for it. The decisions are ``run.existing_cluster``'s; this module does the I/O around them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.links import ParallelClusterStackLink
from ultracluster.parsers.pcluster import ClusterNotFoundError, config_facts, public_description, region_from_arn
from ultracluster.run import existing_cluster as byo
from ultracluster.run.returns import cluster_created

if TYPE_CHECKING:
    from airflow.sdk import Context


def step_on_existing_cluster(op: Any, step: str) -> byo.StepVerdict:
    """Ask the core what ``op`` (an operator with an ``existing_cluster_name`` field) does as ``step``:
    a skip raises AirflowSkipException (the UI's skipped state) with its reason in the task log; an
    adoption is logged and returned for the operator to act on."""
    verdict = byo.step_verdict(step, getattr(op, "existing_cluster_name", None))
    if verdict.action == byo.SKIP:
        op.log.info("Skipped: %s", verdict.reason)
        raise AirflowSkipException(verdict.reason)
    if verdict.action == byo.ADOPT:
        op.log.info("Nothing to do: %s", verdict.reason)
    return verdict


def existing_cluster_problems(plan: dict[str, Any], pcluster_conn_id: str, log: Any,
                              warnings: list[str]) -> list[str]:
    """preflight: the existing cluster exists, is complete, its fleet runs, and it has the run's queue,
    instance type, node count and shared storage (``run.existing_cluster.cluster_problems``), judged
    from describe-cluster and the cluster's own configuration. ``warnings`` gets what fails nothing."""
    name = byo.existing_cluster(plan)
    hook = ParallelClusterHook(pcluster_conn_id, region_name=plan.get("region") or None)
    try:
        description = hook.describe_cluster(name)
    except ClusterNotFoundError:
        return [f"{byo.PARAM}: cluster {name} does not exist in region {hook.region_name}"]
    if description.get("clusterStatus") not in byo.USABLE_STATUSES:
        return byo.cluster_problems(description, {}, plan)
    try:
        facts = config_facts(hook.get_cluster_configuration(description))
    except ValueError as err:
        return [f"{byo.PARAM}: cluster {name}: {err}"]
    log.info("Existing cluster %s: %s, fleet %s, queues %s, shared storage %s", name, description.get("clusterStatus"),
             description.get("computeFleetStatus"), {q: [(r["name"], r["instance_types"], r["max_count"])
                                                        for r in rs] for q, rs in facts["queues"].items()},
             facts["mount_dirs"])
    warnings += byo.cluster_warnings(description, facts)
    return byo.cluster_problems(description, facts, plan)


def adopt_cluster(context: Context, hook: ParallelClusterHook, name: str) -> dict[str, Any]:
    """pcluster_create on an existing cluster: check it is still usable and return it as the run's
    cluster (pcluster_create's XCom, with ``existing`` True and no ``created_at``: the run did not
    create it, and its bill starts with its own jobs). Nothing is created, changed or waited for."""
    try:
        description = hook.describe_cluster(name)
    except ClusterNotFoundError:
        raise AirflowFailException(f"Existing cluster {name} no longer exists") from None
    public = public_description(description)
    status = public.get("clusterStatus")
    if status not in byo.USABLE_STATUSES:
        raise AirflowFailException(f"Existing cluster {name} is {status}, not {' or '.join(byo.USABLE_STATUSES)}; "
                                   "this run does not change it")
    ParallelClusterStackLink.persist(context=context,
                                     region_name=public.get("region") or region_from_arn(public.get("cloudformationStackArn")),
                                     stack_name=public.get("cloudformationStackArn") or name)
    return {**cluster_created(name, public, None), "created_at": None, "existing": True}
