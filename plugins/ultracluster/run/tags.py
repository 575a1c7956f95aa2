"""Ownership tags (docs/contracts.md): what marks a stack or cluster as created by one run.

A stack's owner is read by NetworkStackHook.stack_owner, a cluster's from describe-cluster here.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlencode

DAG_ID_TAG = "ultracluster:dag-id"
RUN_ID_TAG = "ultracluster:run-id"
# The reaper (ultracluster.reaper) touches only what carries this marker.
CREATED_BY_TAG, CREATED_BY = "ultracluster:created-by", "ultracluster"
# ISO-8601 UTC: the run's start plus its resource_ttl_hours. Past it, a resource whose run cannot be
# found is an orphan; a live run's resources are never reaped, expired or not.
EXPIRES_AT_TAG = "ultracluster:expires-at"
EXPIRY_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# The cluster's node count at most (its queues' MaxCount): the deployment's node cap adds these up.
NODES_TAG = "ultracluster:nodes"


def ownership_tags(dag_id: str, run_id: str, *, started_at: datetime | None, ttl_hours: float) -> dict[str, str]:
    """The tags every resource of a run carries; ``started_at`` None (a run not started yet): now."""
    return {DAG_ID_TAG: dag_id, RUN_ID_TAG: run_id, CREATED_BY_TAG: CREATED_BY,
            EXPIRES_AT_TAG: expires_at(started_at, ttl_hours)}


def expires_at(started_at: datetime | None, ttl_hours: float) -> str:
    ttl = float(ttl_hours)
    if ttl <= 0:
        raise ValueError(f"resource_ttl_hours must be positive, got {ttl_hours!r}")
    start = started_at or datetime.now(timezone.utc)
    if start.tzinfo is None:
        start = start.replace(tzinfo=timezone.utc)
    return (start.astimezone(timezone.utc) + timedelta(hours=ttl)).strftime(EXPIRY_FORMAT)


def parse_expiry(value: str | None) -> datetime | None:
    """EXPIRES_AT_TAG's value as an aware datetime; None when absent or malformed."""
    try:
        return datetime.strptime(str(value), EXPIRY_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def s3_tagging(tags: dict[str, str]) -> str:
    """Tags as an S3 upload's ``Tagging`` (URL-encoded; S3 allows 10 an object)."""
    return urlencode(tags)


def run_tags(context: Any, ttl_hours: float) -> dict[str, str]:
    """ownership_tags of the task's run (its DAG run's start)."""
    return ownership_tags(context["dag"].dag_id, context["run_id"],
                          started_at=getattr(context.get("dag_run"), "start_date", None), ttl_hours=ttl_hours)


def tags_dict(description: dict) -> dict[str, str]:
    """describe-cluster tags ``[{key, value}]`` as a dict."""
    return {t["key"]: t.get("value", "") for t in description.get("tags") or [] if "key" in t}


def cluster_owner(description: dict) -> str | None:
    """Run id tagged on a cluster, from describe-cluster output."""
    return tags_dict(description).get(RUN_ID_TAG)


def cluster_nodes(description: dict) -> int | None:
    """The node count tagged on a cluster (NODES_TAG); None for a cluster without it."""
    value = tags_dict(description).get(NODES_TAG)
    return int(value) if value not in (None, "") and str(value).isdigit() else None


# AWS tag limits (EC2, CloudFormation): 50 tags a resource, keys up to 128 and values up to 256
# characters of letters, digits, spaces and _ . : / = + - @; "aws:" is AWS's, "parallelcluster:" is
# ParallelCluster's own.
MAX_TAGS = 50
MAX_KEY_LENGTH, MAX_VALUE_LENGTH = 128, 256
RESERVED_PREFIXES = ("aws:", "parallelcluster:")
_TAG_CHARACTERS = re.compile(r"[\w\s.:/=+\-@]*")


def tag_problems(extra_tags: Any, own_tags: int = 5) -> list[str]:
    """What is wrong with the user's ``extra_tags`` (a dict) beside ``own_tags`` tags of ours (the
    four ownership tags and NODES_TAG); one line each, naming the param."""
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
