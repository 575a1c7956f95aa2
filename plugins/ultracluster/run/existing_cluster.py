"""Bring your own cluster: a run on a ParallelCluster it did not create (param ``existing_cluster_name``).

Such a run creates nothing, and never deletes, updates or stops that cluster. Airflow skips a setup
task's work whenever the setup skips (and allows only all_success right after a setup), so the two
setups, create_vpc and pcluster_create, do not skip: they adopt the cluster, create nothing and say
so in their log. render_config, delete_cluster and delete_vpc skip, each with its reason in its log
(``step_verdict``). preflight checks that the cluster can take the run (``cluster_problems``); the
run is billed from its own Slurm jobs (``cost.job_usage``), not from the cluster's life.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ultracluster.run.form import TRAINING_QUEUE
from ultracluster.run.states import CREATE_COMPLETE, READY, UPDATE_COMPLETE, fleet_verdict
from ultracluster.run.tags import CREATED_BY, CREATED_BY_TAG, DAG_ID_TAG, RUN_ID_TAG

PARAM, QUEUE_PARAM = "existing_cluster_name", "existing_cluster_queue"
USABLE_STATUSES = (CREATE_COMPLETE, UPDATE_COMPLETE)

# The steps of a run that create or delete something, by what they do; and what each does on an
# existing cluster.
NETWORK, CONFIG, CREATE, DELETE_CLUSTER, DELETE_NETWORK = (
    "network", "config", "create", "delete_cluster", "delete_network")
RUN, ADOPT, SKIP = "run", "adopt", "skip"
_ON_EXISTING = {
    NETWORK: (ADOPT, "the run uses existing cluster {name} and its network: no network created"),
    CONFIG: (SKIP, "existing cluster {name} has its own configuration: none rendered or uploaded"),
    CREATE: (ADOPT, "the run uses existing cluster {name}, which it did not create: nothing created"),
    DELETE_CLUSTER: (SKIP, "existing cluster {name} was not created by this run: the run never deletes, "
                           "updates or stops it"),
    DELETE_NETWORK: (SKIP, "the network of existing cluster {name} was not created by this run: left alone"),
}

# Optional params that shape what a run creates: beside an existing cluster they would be silently
# ignored. (Params with a profile default, such as custom_ami or head_node_instance_type, are not
# the run's own choice and stay unread.)
CREATION_PARAMS = (
    "cluster_name", "existing_vpc_id", "existing_public_subnet_id", "existing_private_subnet_id",
    "existing_security_group_id", "extra_queues", "capacity_reservation_id",
    "capacity_reservation_resource_group_arn",
)


@dataclass(frozen=True)
class StepVerdict:
    """What one step does in this run: ``RUN`` as always, ``ADOPT`` (succeed, creating nothing) or ``SKIP``."""

    action: str
    reason: str = ""


def named(value: Any) -> str | None:
    """A rendered name: null, "" and "None" (a template's rendering of null) are no name."""
    text = "" if value is None else str(value).strip()
    return None if text in ("", "None") else text


def existing_cluster(plan: Mapping[str, Any]) -> str | None:
    """The cluster a run (its plan or params) uses without having created it; None: it creates one."""
    return named(plan.get(PARAM))


def step_verdict(step: str, existing_cluster_name: Any) -> StepVerdict:
    """What ``step`` (``NETWORK``, ``CONFIG``, ``CREATE``, ``DELETE_CLUSTER``, ``DELETE_NETWORK``) does
    in a run whose ``existing_cluster_name`` is this (rendered) value."""
    name = named(existing_cluster_name)
    if name is None:
        return StepVerdict(RUN)
    action, reason = _ON_EXISTING[step]
    return StepVerdict(action, reason.format(name=name))


def training_queue(params: Mapping[str, Any]) -> str:
    """The Slurm partition the run trains in: the existing cluster's queue named by
    ``existing_cluster_queue``, else the training queue the run's own cluster has."""
    return named(params.get(QUEUE_PARAM)) or TRAINING_QUEUE


def conflicts(params: Mapping[str, Any]) -> list[str]:
    """Params set beside ``existing_cluster_name`` that only a created cluster could honour; and
    ``existing_cluster_queue`` without a cluster."""
    if not existing_cluster(params):
        return ([f"{QUEUE_PARAM} names a queue of an existing cluster: it needs {PARAM}"]
                if named(params.get(QUEUE_PARAM)) else [])
    return [f"{key} shapes a cluster the run creates; with {PARAM} the run creates none: leave it empty"
            for key in CREATION_PARAMS if params.get(key) not in (None, "", [], {})]


def billed_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The plan as the cost estimate prices it: on an existing cluster the run pays for its nodes'
    time only, not for the head node or the shared storage, which outlive it."""
    if not existing_cluster(plan):
        return dict(plan)
    return {**plan, "head_node_instance_type": None, "fsx_storage_capacity_gib": None}


def _tags(description: Mapping[str, Any]) -> dict[str, str]:
    return {str(t.get("key")): str(t.get("value")) for t in description.get("tags") or [] if isinstance(t, Mapping)}


def cluster_problems(description: Mapping[str, Any], facts: Mapping[str, Any], plan: Mapping[str, Any]) -> list[str]:
    """Why the existing cluster cannot take the run, one line each naming the param.

    :param description: its describe-cluster output.
    :param facts: its configuration as ``parsers.pcluster.config_facts`` reads it (``queues``:
        queue -> compute resources ``{"name", "instance_types", "max_count"}``; ``mount_dirs``).
    :param plan: the run's plan (``num_nodes``, ``instance_type``, ``shared_storage_mount_dir``).
    """
    name = existing_cluster(plan) or description.get("clusterName")
    status = description.get("clusterStatus")
    if status not in USABLE_STATUSES:
        return [f"{PARAM}: cluster {name} is {status}; a run needs it {' or '.join(USABLE_STATUSES)}"]
    problems = []
    fleet = description.get("computeFleetStatus")
    if fleet_verdict(fleet) != READY:
        problems.append(f"{PARAM}: the compute fleet of cluster {name} is {fleet}, not RUNNING; start it "
                        "yourself: a run never starts or stops a cluster it did not create")
    queue, instance_type = training_queue(plan), plan.get("instance_type")
    queues = facts.get("queues") or {}
    if queue not in queues:
        problems.append(f"{QUEUE_PARAM}: cluster {name} has no queue {queue!r} (its queues: "
                        f"{', '.join(sorted(queues)) or 'none'})")
    else:
        resources = [r for r in queues[queue] if instance_type in (r.get("instance_types") or [])]
        types = sorted({t for r in queues[queue] for t in r.get("instance_types") or []})
        if not resources:
            problems.append(f"instance_type: queue {queue} of cluster {name} has no {instance_type} compute "
                            f"resource (it has: {', '.join(types) or 'none'})")
        else:
            most = sum(int(r.get("max_count") or 0) for r in resources)
            if most < int(plan.get("num_nodes") or 0):
                problems.append(f"num_nodes ({plan.get('num_nodes')}) exceeds what queue {queue} of cluster {name} "
                                f"can hold: {most} {instance_type} node(s) (MaxCount)")
    mount_dir = plan.get("shared_storage_mount_dir")
    if mount_dir and mount_dir not in (facts.get("mount_dirs") or []):
        problems.append(f"shared_storage_mount_dir: cluster {name} has no shared storage at {mount_dir} (it has: "
                        f"{', '.join(facts.get('mount_dirs') or []) or 'none'})")
    return problems


def cluster_warnings(description: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
    """What is worth a look about an existing cluster but fails nothing."""
    name, tags = description.get("clusterName"), _tags(description)
    warnings = []
    if tags.get(CREATED_BY_TAG) == CREATED_BY:
        warnings.append(f"cluster {name} was created by run {tags.get(RUN_ID_TAG)!r} of {tags.get(DAG_ID_TAG)!r}: "
                        "the reaper deletes it once that run has ended, whoever uses it then")
    if not facts.get("accounting"):
        warnings.append(f"cluster {name} has no Slurm accounting (Scheduling.SlurmSettings.Database): the run "
                        "is billed from its jobs' task spans instead of sacct")
    return warnings
