"""The node health gate's part of the train task: the job's inputs, and draining the nodes it found
unhealthy (docs/operations.md, "Node health gate"); after a good job its report goes into the task log
and XCom through ``parsers.job_end``.

What is healthy, the report's lines and each verdict are ``run.health``'s; this module reads the
report through the Slurm hook and acts on the verdicts.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from ultracluster.hooks.head_node import HeadNodeUnreachableError
from ultracluster.hooks.slurm import SlurmCommandError, SlurmHook
from ultracluster.parsers.job_end import gate_lines, log_lines
from ultracluster.run import health


def gate_job_env(instance_type: str | None) -> dict[str, str]:
    """What the job needs for the gate (the expected counts); nothing without a gate."""
    return health.gate_env(instance_type) if instance_type else {}


def read_gate(hook: SlurmHook, job_dir: str, job_id: str, instance_type: str) -> tuple[list[health.Verdict], list[str]]:
    """Each node's verdict from the job's report, and the report's unreadable lines."""
    report = health.parse_report(hook.health_report(job_dir, job_id))
    return health.judge(report, instance_type), report.unreadable


def log_gate(log: logging.Logger | Any, instance_type: str, verdicts: Sequence[health.Verdict],
             unreadable: Sequence[str] = ()) -> None:
    """One task-log line per node: healthy, or the check that failed and why."""
    log_lines(log, gate_lines(instance_type, verdicts, unreadable))


def drain_unhealthy(hook: SlurmHook, job_dir: str, job_id: str, instance_type: str,
                    log: logging.Logger | Any, message: str) -> dict[str, str]:
    """The gate failed: drain each unhealthy node with its reason; returns ``{node: reason}``.

    Fails the task (no retry) when no node can be blamed, or when the drain cannot be done: a retry
    would submit onto the same nodes, undrained. ``message``: how the job ended, with its log's tail.
    """
    try:
        verdicts, unreadable = read_gate(hook, job_dir, job_id, instance_type)
    except (HeadNodeUnreachableError, SlurmCommandError) as err:
        raise AirflowFailException(f"The node health gate failed in job {job_id}, and its report cannot be "
                                   f"read, so no node was drained: {err}\n{message}") from err
    log_gate(log, instance_type, verdicts, unreadable)
    lost = health.losses(verdicts)
    if not lost:
        raise AirflowFailException(f"The node health gate failed in job {job_id} but no node's report says "
                                   f"why (the gate did not run on the nodes?); nothing drained.\n{message}")
    for reason, nodes in health.by_reason(lost).items():
        try:
            hook.drain(nodes, reason)
        except (HeadNodeUnreachableError, SlurmCommandError) as err:
            raise AirflowFailException(f"Could not drain {', '.join(nodes)} ({reason}): {err}. Drain them by "
                                       f"hand (scontrol update NodeName=... State=DRAIN) before the next run."
                                       ) from err
        log.warning("Drained %s: %s", ", ".join(nodes), reason)
    return lost


def describe(lost: Mapping[str, str]) -> str:
    """The gate's losses in one line, for messages: ``node-1 (UC health check failed: ...); ...``."""
    return "; ".join(f"{node} ({reason})" for node, reason in lost.items())
