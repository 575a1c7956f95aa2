"""The run's plan: the params with its sweep point applied, and the rules a plan must keep.

preflight fixes the plan once (its XCom); every later task reads the plan, never the params
(``plan_of``, the DAG's ``plan(ti)`` macro). The rules here are those JSON Schema cannot express:
they compare fields.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ultracluster.run import existing_cluster as byo
from ultracluster.run.capacity import plan_capacity_problems
from ultracluster.run.errors import ConfigValidationError, problem_list
from ultracluster.run.form import MAX_QUEUES, TRAINING_QUEUE
from ultracluster.run.names import CLUSTER_NAME_PATTERN
from ultracluster.run.s3 import split_s3_uri
from ultracluster.run.shared_cluster import point_cluster
from ultracluster.run.sweep import sweep_point


def node_count(value: Any) -> int:
    """A rendered node count (templates render strings) as an int >= 1, or a clear error."""
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"num_nodes must be an integer, got {value!r}") from None
    if count < 1:
        raise ValueError(f"num_nodes must be >= 1, got {count}")
    return count


def resume_attempts(value: Any) -> int:
    """The ``auto_resume_attempts`` value (rendered templates arrive as text)."""
    try:
        attempts = int(str(value).strip())
    except ValueError:
        raise ValueError(f"auto_resume_attempts must be an integer >= 0, got {value!r}") from None
    if attempts < 0:
        raise ValueError(f"auto_resume_attempts must be an integer >= 0, got {value!r}")
    return attempts


def _ints(params: dict[str, Any], *keys: str) -> list[int | None]:
    return [params.get(k) if isinstance(params.get(k), int) else None for k in keys]


def plan_problems(params: dict[str, Any], trains: bool = True) -> list[str]:
    """Every cross-field rule the plan breaks, one line each naming the params; ``trains=False``
    (a shared cluster's holder) leaves out the training rules: they are the points' own."""
    problems: list[str] = _training_problems(params) if trains else []
    for key in ("dataset_s3_uri", "artifacts_s3_uri", "compile_cache_s3_uri"):
        if params.get(key):
            try:
                split_s3_uri(params[key])
            except ValueError as err:
                problems.append(f"{key}: {err}")
    problems += byo.conflicts(params)
    if not byo.existing_cluster(params):  # an existing cluster's own shape is preflight's to check
        problems += _creation_problems(params)
    return problems


def _training_problems(params: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    num_nodes, max_steps, steps, accumulation = _ints(params, "num_nodes", "max_steps", "steps_this_run",
                                                      "grad_accum_usteps")
    if None not in (max_steps, steps) and steps > max_steps:
        problems.append(f"steps_this_run ({steps}) exceeds max_steps ({max_steps})")
    # The run script divides accumulation by the node count (integer division): keep it exact.
    if params.get("scaling_mode") == "strong" and accumulation is not None and num_nodes and accumulation % num_nodes:
        problems.append(f"strong scaling divides grad_accum_usteps ({accumulation}) by num_nodes ({num_nodes}); "
                        "it must divide evenly or the global batch silently changes")
    return problems


def _creation_problems(params: dict[str, Any]) -> list[str]:
    """The rules of the cluster a run creates."""
    problems: list[str] = []
    num_nodes, max_nodes = _ints(params, "num_nodes", "max_nodes")
    min_nodes = params.get("min_nodes", 0) if isinstance(params.get("min_nodes", 0), int) else None
    if None not in (num_nodes, max_nodes) and num_nodes > max_nodes:
        problems.append(f"num_nodes ({num_nodes}) exceeds max_nodes ({max_nodes}), the queue's MaxCount")
    if None not in (min_nodes, max_nodes) and min_nodes > max_nodes:
        problems.append(f"min_nodes ({min_nodes}) exceeds max_nodes ({max_nodes})")
    public, private = params.get("existing_public_subnet_id"), params.get("existing_private_subnet_id")
    if bool(public) != bool(private):
        problems.append("existing_public_subnet_id and existing_private_subnet_id go together")
    if (params.get("existing_vpc_id") or params.get("existing_security_group_id")) and not (public and private):
        problems.append("reusing an existing VPC needs existing_public_subnet_id and existing_private_subnet_id")
    requested = params.get("cluster_name")
    if requested and not CLUSTER_NAME_PATTERN.match(requested):
        problems.append(f"cluster_name {requested!r} is not a valid ParallelCluster name")
    extra_queues = params.get("extra_queues") or []
    names = [TRAINING_QUEUE] + [q.get("name") for q in extra_queues if isinstance(q, dict)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"queue names must be unique ({TRAINING_QUEUE} is the training queue): {duplicates}")
    if len(names) > MAX_QUEUES:
        problems.append(f"at most {MAX_QUEUES} queues, got {len(names)}")
    for queue in extra_queues:
        if isinstance(queue, dict) and queue.get("min_nodes", 0) > queue.get("max_nodes", 0):
            problems.append(f"queue {queue.get('name')}: min_nodes exceeds max_nodes")
    return problems + plan_capacity_problems(params)


def validate_plan(params: dict[str, Any]) -> None:
    """``plan_problems`` as one error listing every problem."""
    problems = plan_problems(params)
    if problems:
        raise ConfigValidationError(problem_list("Invalid run configuration", problems))


def run_plan(params: dict[str, Any], logical_date: datetime | None, period: timedelta) -> dict[str, Any]:
    """The params this run trains with: a sweep point sets num_nodes, sizes the cluster to it
    (max_nodes = the point, or min_nodes when that is larger) and sets the sweep's scaling_mode.
    Each point has a cluster of its own, so a larger MaxCount would never be used, yet would count
    against the node cap (which adds up MaxCounts). A point of a shared-cluster sweep trains on the
    sweep's cluster instead (``run.shared_cluster``): it names it as ``existing_cluster_name``."""
    plan = dict(params)
    point = sweep_point(params.get("sweep"), logical_date, period)
    if point and point_cluster(params.get("sweep")) and not byo.existing_cluster(plan):
        plan[byo.PARAM] = point_cluster(params.get("sweep"))
    if point:
        plan["num_nodes"] = point["num_nodes"]
        min_nodes = plan.get("min_nodes") if isinstance(plan.get("min_nodes"), int) else 0
        plan["max_nodes"] = max(point["num_nodes"], min_nodes)
        if point["scaling_mode"]:
            plan["scaling_mode"] = point["scaling_mode"]
    plan["sweep_point"] = point
    # The partition every Slurm step uses: an existing cluster's queue, else the run's own.
    plan[byo.PARAM] = byo.existing_cluster(plan)
    plan["training_queue"] = byo.training_queue(plan)
    return plan


def plan_of(ti: Any) -> dict[str, Any]:
    """The run's plan as the preflight task returned it (the DAG's ``plan(ti)`` template macro)."""
    result = ti.xcom_pull(task_ids="preflight")
    if not result:
        raise RuntimeError("no plan: the preflight task has not run in this DAG run")
    return result["plan"]


def cluster_of(ti: Any) -> str:
    """The cluster the run trains on (the DAG's ``run_cluster(ti)`` macro): the existing cluster it
    was given, else the one render_config named for it."""
    return byo.existing_cluster(plan_of(ti)) or ti.xcom_pull(task_ids="render_config")["cluster_name"]
