"""The one shape of every trigger event: ``{"status", "reason", "message", ...}``.

``status`` says how the wait ended: ``success`` (what was awaited happened), ``failed`` (it ended
badly on the remote side: a failed stack, cluster, fleet or job) or ``error`` (the wait itself could
not go on). ``reason`` is a code from ``REASONS``, which fixes the status; ``message`` is for people.
Each trigger adds its own fields (``job_id``, ``head_node``, ...). Operators decide what to do from
the reason (``deterministic``), never from the message.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SUCCESS, FAILED, ERROR = "success", "failed", "error"
STATUSES = (SUCCESS, FAILED, ERROR)

# reason -> (status, what it means)
REASONS: dict[str, tuple[str, str]] = {
    "complete": (SUCCESS, "the awaited state was reached: stack, cluster or image created or deleted, fleet "
                          "ready, job completed"),
    "stack_failed": (FAILED, "the stack reached a failed state"),
    "cluster_failed": (FAILED, "the cluster reached a failed state (CREATE_FAILED, DELETE_FAILED, ...)"),
    "cluster_gone": (FAILED, "the cluster is being deleted or does not exist"),
    "image_failed": (FAILED, "the node image's build failed (its set-up script, or Image Builder), or its "
                             "deletion did (no retry: the same image id stays failed)"),
    "image_gone": (FAILED, "the node image is being deleted or does not exist"),
    "fleet_protected": (FAILED, "ParallelCluster protected the fleet after repeated bootstrap failures"),
    "fleet_stopped": (FAILED, "the compute fleet is stopped or stopping"),
    "node_lost": (FAILED, "a node was lost (bootstrap, power-up, health gate) more often than node_replacements allows "
                          "(no retry)"),
    "not_enough_nodes": (FAILED, "too few usable nodes even once busy ones free up"),
    "nodes_stuck": (FAILED, "nodes stayed down or not responding past the limit"),
    "partition_not_found": (FAILED, "Slurm has no such partition"),
    "job_failed": (FAILED, "the Slurm job ended in a failure state"),
    "budget_exceeded": (FAILED, "the budget guard cancelled the job: its projected cost passed max_cost_usd"),
    "timeout": (ERROR, "the wait gave up after its limit"),
    "api_error": (ERROR, "the AWS or pcluster API kept failing"),
    "access_denied": (ERROR, "AWS denied a call the wait makes: denied again until the role's policy changes "
                             "(no retry)"),
    "unreachable": (ERROR, "the head node stayed unreachable past the outage limit"),
    "host_key_mismatch": (ERROR, "the head node presented another host key than the pinned one"),
    "job_renamed": (ERROR, "the job id now names another job (a rebuilt cluster reuses ids)"),
    "trigger_error": (ERROR, "the trigger hit an unexpected error"),
}
# No retry helps: the same inputs meet the same end (a retry would only spend more).
DETERMINISTIC = frozenset({"access_denied", "budget_exceeded", "host_key_mismatch", "image_failed", "node_lost",
                           "partition_not_found"})


class EventError(ValueError):
    """A payload that is not an event of this shape."""


def event_problems(payload: Mapping[str, Any]) -> list[str]:
    """What makes ``payload`` not an event: empty for a good one."""
    problems = []
    status, reason, message = payload.get("status"), payload.get("reason"), payload.get("message")
    if status not in STATUSES:
        problems.append(f"status {status!r} is not one of {STATUSES}")
    if reason not in REASONS:
        problems.append(f"reason {reason!r} is not a known code")
    elif REASONS[reason][0] != status:
        problems.append(f"reason {reason!r} goes with status {REASONS[reason][0]!r}, not {status!r}")
    if not isinstance(message, str):
        problems.append(f"message must be a string, got {type(message).__name__}")
    return problems


def event(reason: str, message: str = "", **fields: Any) -> dict[str, Any]:
    """An event payload; its status follows from ``reason``."""
    if reason not in REASONS:
        raise EventError(f"unknown event reason {reason!r}")
    payload = {**fields, "status": REASONS[reason][0], "reason": reason, "message": message}
    problems = event_problems(payload)
    if problems:
        raise EventError("; ".join(problems))
    return payload


def deterministic(payload: Mapping[str, Any]) -> bool:
    """The event's end is the inputs' own: fail without retries."""
    return payload.get("reason") in DETERMINISTIC
