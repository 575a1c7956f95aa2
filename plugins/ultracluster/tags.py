"""Ownership tags (docs/contracts.md): what marks a stack or cluster as created by one run.

A stack's owner is read by NetworkStackHook.stack_owner.

Stdlib only: imported at DAG parse time through the operators.
"""
from __future__ import annotations

DAG_ID_TAG = "ultracluster:dag-id"
RUN_ID_TAG = "ultracluster:run-id"
# The cluster's node count at most (its queues' MaxCount): the deployment's node cap adds these up.
NODES_TAG = "ultracluster:nodes"


def ownership_tags(dag_id: str, run_id: str) -> dict[str, str]:
    return {DAG_ID_TAG: dag_id, RUN_ID_TAG: run_id}


def cluster_owner(description: dict) -> str | None:
    """Run id tagged on a cluster, from describe-cluster output."""
    from ultracluster.parsers.pcluster import tags_dict

    return tags_dict(description).get(RUN_ID_TAG)


def cluster_nodes(description: dict) -> int | None:
    """The node count tagged on a cluster (NODES_TAG); None for a cluster without it."""
    from ultracluster.parsers.pcluster import tags_dict

    value = tags_dict(description).get(NODES_TAG)
    return int(value) if value not in (None, "") and str(value).isdigit() else None
