"""Ownership tags (docs/contracts.md): what marks a stack or cluster as created by one run.

A stack's owner is read by NetworkStackHook.stack_owner.

Stdlib only: imported at DAG parse time through the operators.
"""
from __future__ import annotations

import re
from typing import Any

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


# AWS tag limits (EC2, CloudFormation): 50 tags a resource, keys up to 128 and values up to 256
# characters of letters, digits, spaces and _ . : / = + - @; "aws:" is AWS's, "parallelcluster:" is
# ParallelCluster's own.
MAX_TAGS = 50
MAX_KEY_LENGTH, MAX_VALUE_LENGTH = 128, 256
RESERVED_PREFIXES = ("aws:", "parallelcluster:")
_TAG_CHARACTERS = re.compile(r"[\w\s.:/=+\-@]*")


def tag_problems(extra_tags: Any, own_tags: int = 3) -> list[str]:
    """What is wrong with the user's ``extra_tags`` (a dict) beside ``own_tags`` tags of ours (the
    ownership tags and NODES_TAG); one line each, naming the param."""
    if extra_tags in (None, ""):
        return []
    if not isinstance(extra_tags, dict):
        return [f"extra_tags must be an object of key: value strings, got {type(extra_tags).__name__}"]
    problems = []
    if len(extra_tags) + own_tags > MAX_TAGS:
        problems.append(f"extra_tags: {len(extra_tags)} tags plus the pipeline's {own_tags} exceed AWS's "
                        f"{MAX_TAGS} per resource")
    for key, value in extra_tags.items():
        key, value = str(key), "" if value is None else str(value)
        if key.lower().startswith(RESERVED_PREFIXES):
            problems.append(f"extra_tags: key {key!r} uses a reserved prefix ({', '.join(RESERVED_PREFIXES)})")
        if not 1 <= len(key) <= MAX_KEY_LENGTH:
            problems.append(f"extra_tags: key {key[:40]!r}... is {len(key)} characters (1 to {MAX_KEY_LENGTH})")
        if len(value) > MAX_VALUE_LENGTH:
            problems.append(f"extra_tags: the value of {key!r} is {len(value)} characters (at most {MAX_VALUE_LENGTH})")
        for text in (key, value):
            if not _TAG_CHARACTERS.fullmatch(text):
                problems.append(f"extra_tags: {text[:40]!r} has characters AWS tags do not allow "
                                "(letters, digits, spaces and _ . : / = + - @)")
    return problems
