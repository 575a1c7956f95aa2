"""What the tasks that wait return once their wait succeeded, built from what the wait saw.

A trigger that ends its task itself (Airflow 3's ``TaskSuccessEvent``: no worker resumes the task)
and the operator's worker path call the same function here, so the task's XCom is the same either
way (docs/architecture.md, "Waits that end in the triggerer"). ``ends_task`` is the one rule of when
a trigger may end its task.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ultracluster.run.events import SUCCESS

# The network stack's outputs (include/cluster/vpc.yaml) -> create_vpc's keys.
NETWORK_OUTPUTS = {
    "VpcId": "vpc_id",
    "PublicSubnetId": "public_subnet_id",
    "PrivateSubnetId": "private_subnet_id",
    "SecurityGroupId": "security_group_id",
    "AvailabilityZone": "availability_zone",
}


def ends_task(payload: Mapping[str, Any], asked: bool) -> bool:
    """A trigger ends its task only when the task asked it to (nothing is left to do after the wait)
    and the wait succeeded. Any other end resumes the worker, which decides: a retry, a clean-up
    first, or no retry (``AirflowFailException``; a trigger's ``TaskFailedEvent`` cannot say that)."""
    return bool(asked) and payload.get("status") == SUCCESS


def network_created(stack_name: str, region: str | None, outputs: Mapping[str, Any]) -> dict[str, Any]:
    """create_vpc: the network of the stack it created (``outputs``: OutputKey -> OutputValue)."""
    return {"owned": True, "stack_name": stack_name, "region": region,
            **{key: outputs.get(name) for name, key in NETWORK_OUTPUTS.items()}}


def stack_outputs(stack: Mapping[str, Any]) -> dict[str, Any]:
    """describe-stacks' ``Outputs`` of one stack as OutputKey -> OutputValue."""
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs") or []}


def stack_deleted(stack_name: str) -> dict[str, Any]:
    """delete_vpc: the run's network stack is gone."""
    return {"deleted": True, "stack_name": stack_name}


def cluster_created(cluster_name: str, description: Mapping[str, Any], config_s3_uri: str | None) -> dict[str, Any]:
    """pcluster_create: the cluster as describe-cluster reported it (``description``: secrets removed,
    ``parsers.pcluster.public_description``)."""
    return {
        "cluster_name": cluster_name,
        "cluster_status": description.get("clusterStatus"),
        "compute_fleet_status": description.get("computeFleetStatus"),
        "region": description.get("region"),
        "cloudformation_stack_arn": description.get("cloudformationStackArn"),
        "head_node": description.get("headNode") or {},
        "config_s3_uri": config_s3_uri,
        "created_at": description.get("creationTime"),
    }


def created_description(created: Any, cluster_name: str, try_number: int) -> dict[str, Any] | None:
    """pcluster_create's return (``cluster_created``) as the describe-cluster fields later tasks read
    (what the fleet's cluster gate judges, what its host-key pin names the cluster by, the stack and
    region delete_cluster links), for a task's first try on the cluster this run created. None where the
    task must describe the cluster itself: a retry (the value may be stale), another cluster, one the
    run adopted (``existing``: its value has no creation time), or no value (pcluster_create failed)."""
    if try_number > 1 or not isinstance(created, Mapping) or created.get("existing") \
            or created.get("cluster_name") != cluster_name:
        return None
    return {"clusterName": created.get("cluster_name"), "clusterStatus": created.get("cluster_status"),
            "region": created.get("region"),
            "computeFleetStatus": created.get("compute_fleet_status"), "headNode": created.get("head_node") or {},
            "cloudformationStackArn": created.get("cloudformation_stack_arn"),
            "creationTime": created.get("created_at")}


def cluster_deleted(cluster_name: str, deleted_at: str | None, usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """delete_cluster: the cluster is gone; ``usage``, its bill from EC2 (``hooks.usage``; None: unknown)."""
    return {"cluster_name": cluster_name, "deleted": True, "deleted_at": deleted_at,
            "usage": dict(usage) if usage is not None else None}


def saw_deleted(deleted: Any, cluster_name: str) -> bool:
    """Did delete_cluster's return (``cluster_deleted``) see ``cluster_name`` gone?"""
    return isinstance(deleted, Mapping) and bool(deleted.get("deleted")) and deleted.get("cluster_name") == cluster_name


def fleet_ready(head_node: Mapping[str, Any], ready_at: str) -> dict[str, Any]:
    """wait_for_fleet: the head node every later task reaches (address, pinned key, partition);
    ``ready_at``, when the wait saw the fleet ready, starts the run's idle fleet time."""
    return {**head_node, "ready_at": ready_at}


def job_results_path(payload: Mapping[str, Any], output_dir: str) -> str:
    """Where the job's results.json is: as its log said (``UC_RESULTS``), else the contract's place."""
    return payload.get("results_path") or f"{output_dir}/results.json"


def job_succeeded(payload: Mapping[str, Any], *, job_name: str | None, output_dir: str, log_path: str,
                  started_at: str | None, ended_at: str, auto_resume: Mapping[str, Any],
                  extras: Mapping[str, Any]) -> dict[str, Any]:
    """parallel_compile and train: a COMPLETED job. ``payload``: the Slurm wait's event; ``job_name``:
    its Slurm name (an existing cluster's bill finds the run's jobs by it in sacct);
    ``started_at``: the task's start (the scaling report's idle fleet time); ``ended_at``: when its
    end was seen; ``auto_resume``: ``run.jobs.resume_summary``; ``extras``: what the job left and the
    task reports (``node_health``, ``launch``, ``compile_cache``; ``parsers.job_end``)."""
    return {
        "job_id": str(payload.get("job_id")), "job_name": job_name, "state": payload.get("state"),
        "exit_code": payload.get("exit_code"), "output_dir": output_dir, "log_path": log_path,
        "results_path": job_results_path(payload, output_dir),
        "started_at": started_at, "ended_at": ended_at, "auto_resume": dict(auto_resume), **extras,
    }
