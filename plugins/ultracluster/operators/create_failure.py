"""What pcluster_create puts in the task log when a create fails, before the cluster is deleted.

Besides failures[] (logged by the operator): the last failed CloudFormation events of the cluster
stack (get-cluster-stack-events) and the tail of the head node's bootstrap log
(list-cluster-log-streams, get-cluster-log-events), which users otherwise dig out of the
CloudFormation console and CloudWatch. Every fetch is best effort: a failure to fetch is a warning
and never hides the failure being reported.
"""
from __future__ import annotations

import logging
from typing import Any

from ultracluster.parsers.pcluster import (
    HEAD_NODE_LOG_FILTER,
    bootstrap_log_stream,
    describe_stack_event,
    failed_stack_events,
    log_event_messages,
)

STACK_EVENTS_SHOWN = 5
LOG_TAIL_LINES = 50


def log_create_failure(log: logging.Logger, hook: Any, cluster_name: str, found: list[dict]) -> None:
    """Log the failed stack events and the bootstrap log tail of ``cluster_name`` (a ParallelClusterHook's)."""
    _log_stack_events(log, hook, cluster_name)
    _log_bootstrap_tail(log, hook, cluster_name, found)


def _log_stack_events(log: logging.Logger, hook: Any, cluster_name: str) -> None:
    try:
        failed = failed_stack_events(hook.get_cluster_stack_events(cluster_name), STACK_EVENTS_SHOWN)
    except Exception as err:  # noqa: BLE001 - diagnostics never mask the failure itself
        log.warning("Could not fetch the stack events of %s: %s", cluster_name, err)
        return
    if not failed:
        log.info("The stack of %s lists no failed event", cluster_name)
        return
    log.error("Last failed stack events of %s (newest first):\n%s", cluster_name,
              "\n".join("  " + describe_stack_event(event) for event in failed))


def _log_bootstrap_tail(log: logging.Logger, hook: Any, cluster_name: str, found: list[dict]) -> None:
    try:
        streams = hook.list_cluster_log_streams(cluster_name, filters=[HEAD_NODE_LOG_FILTER])
        stream = bootstrap_log_stream(streams, found)
        if stream is None:
            log.warning("No bootstrap log of the head node of %s among its %d log streams (did the head node "
                        "start?)", cluster_name, len(streams))
            return
        lines = log_event_messages(hook.get_cluster_log_events(cluster_name, stream, limit=LOG_TAIL_LINES,
                                                               start_from_head=False))
    except Exception as err:  # noqa: BLE001 - diagnostics never mask the failure itself
        log.warning("Could not fetch the head node's bootstrap log of %s: %s", cluster_name, err)
        return
    log.error("Last %d lines of the head node's bootstrap log %s:\n%s", len(lines), stream,
              "\n".join("  | " + line for line in lines))
