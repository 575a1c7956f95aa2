"""Find the pipeline's orphans (classify.judge), delete them, and verify each deletion.

Order: clusters, then network stacks (a cluster holds its network's interfaces), then S3 scratch
of runs whose cluster is gone. A stack or cluster that fails to delete is reported with its failed
resources and deleted again, ``max_delete_attempts`` times; if it stays, the pass reports it as
left, and callers fail.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import WaiterError

from ultracluster.parsers.pcluster import (
    ClusterNotFoundError,
    describe_stack_event,
    failed_stack_events,
    failures,
)
from ultracluster.reaper.classify import CLUSTER, SCRATCH, STACK, RunState, Verdict, judge
from ultracluster.run.s3 import split_s3_uri
from ultracluster.run.tags import tags_dict
from ultracluster.waiters import FAILURE, SUCCESS, evaluate, load_waiter

SCRATCH_NAME = "on_node_configured.sh"  # the only per-run object that is scratch (docs/operations.md)
_CLUSTER_STACK_TAG = "parallelcluster:cluster-name"  # ParallelCluster's own stacks: reaped as clusters


@dataclass
class ReapResult:
    verdicts: list[Verdict] = field(default_factory=list)  # every marked resource seen, reaped or kept
    deleted: list[Verdict] = field(default_factory=list)
    left: dict[str, list[str]] = field(default_factory=dict)  # "kind name" -> why it is still there

    @property
    def orphans(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.reap]

    def summary(self) -> dict[str, Any]:
        return {"orphans": [v.line() for v in self.orphans], "deleted": [v.line() for v in self.deleted],
                "left": self.left, "kept": [v.line() for v in self.verdicts if not v.reap]}


class Reaper:
    """
    :param pcluster: a ParallelClusterHook; ``stacks``: a NetworkStackHook; ``s3``: an S3Hook (None
        with no ``artifacts_s3_uri``: no scratch scan).
    :param run_state: (dag_id, run_id) -> state or None (classify.RunState).
    :param sleep: waits between polls and attempts (time.sleep; tests pass their own).
    """
    def __init__(self, *, pcluster: Any, stacks: Any, run_state: RunState, s3: Any = None,
                 artifacts_s3_uri: str | None = None, max_delete_attempts: int = 3, retry_delay_s: float = 60,
                 poll_s: float = 15, delete_timeout_s: float = 3600, now: Callable[[], datetime] | None = None,
                 sleep: Callable[[float], None] = time.sleep, log: logging.Logger | None = None) -> None:
        self.pcluster, self.stacks, self.s3 = pcluster, stacks, s3
        self.run_state = run_state
        self.artifacts_s3_uri = artifacts_s3_uri
        self.max_delete_attempts = max_delete_attempts
        self.retry_delay_s, self.poll_s, self.delete_timeout_s = retry_delay_s, poll_s, delete_timeout_s
        self.now = now or (lambda: datetime.now(timezone.utc))
        self.sleep = sleep
        self.log = log or logging.getLogger(__name__)

    # --- finding --------------------------------------------------------------------------------
    def find_clusters(self) -> list[Verdict]:
        verdicts = []
        for entry in self.pcluster.list_clusters():
            name = entry["clusterName"]
            try:
                tags = tags_dict(self.pcluster.describe_cluster(name))
            except ClusterNotFoundError:  # deleted between the list and the describe
                continue
            verdicts.append(judge(CLUSTER, name, tags, self.run_state, self.now()))
        return verdicts

    def find_stacks(self) -> list[Verdict]:
        verdicts = []
        for stack in self.stacks.describe_stacks():
            tags = {t["Key"]: t["Value"] for t in stack.get("Tags") or []}
            if _CLUSTER_STACK_TAG in tags or stack.get("StackStatus") == "DELETE_COMPLETE":
                continue
            verdicts.append(judge(STACK, stack["StackName"], tags, self.run_state, self.now()))
        return verdicts

    def find_scratch(self) -> list[Verdict]:
        if not (self.s3 and self.artifacts_s3_uri):
            return []

        bucket, prefix = split_s3_uri(self.artifacts_s3_uri)
        prefix = prefix.strip("/")
        verdicts = []
        for key in self.s3.list_keys(bucket_name=bucket, prefix=f"{prefix}/" if prefix else "") or []:
            if not key.endswith(f"/{SCRATCH_NAME}"):
                continue
            tagging = self.s3.get_conn().get_object_tagging(Bucket=bucket, Key=key).get("TagSet") or []
            tags = {t["Key"]: t["Value"] for t in tagging}
            verdicts.append(judge(SCRATCH, f"s3://{bucket}/{key}", tags, self.run_state, self.now()))
        return verdicts

    # --- reaping --------------------------------------------------------------------------------
    def reap(self, *, dry_run: bool = False) -> ReapResult:
        """One pass; with ``dry_run``, the verdicts only (nothing is deleted)."""
        result = ReapResult()
        clusters = self.find_clusters()
        self._handle(clusters, result, dry_run, set())
        # A run whose cluster could not be deleted keeps its network (the cluster's interfaces are in
        # it) and its scratch (its nodes read it).
        with_cluster = {v.run_id for v in clusters if v.run_id and f"{CLUSTER} {v.name}" in result.left}
        self._handle(self.find_stacks(), result, dry_run, with_cluster)
        self._handle(self.find_scratch(), result, dry_run, with_cluster)
        return result

    def _handle(self, verdicts: list[Verdict], result: ReapResult, dry_run: bool, with_cluster: set) -> None:
        for verdict in verdicts:
            if verdict.reap and verdict.run_id in with_cluster:
                verdict = Verdict(verdict.kind, verdict.name, verdict.dag_id, verdict.run_id, False,
                                  "kept: the run's cluster could not be deleted")
            self.log.info("%s", verdict.line())
            result.verdicts.append(verdict)
            if verdict.reap and not dry_run:
                self._delete(verdict, result)

    def _delete(self, verdict: Verdict, result: ReapResult) -> None:
        delete = {CLUSTER: self._delete_cluster, STACK: self._delete_stack, SCRATCH: self._delete_scratch}
        reasons = delete[verdict.kind](verdict.name)
        if reasons:
            result.left[f"{verdict.kind} {verdict.name}"] = reasons
        else:
            self.log.info("Deleted and verified gone: %s %s (%s)", verdict.kind, verdict.name, verdict.reason)
            result.deleted.append(verdict)

    def _attempts(self, kind: str, name: str, attempt: Callable[[], list[str]]) -> list[str]:
        """Run ``attempt`` (one delete and its wait: [] when gone, else the failure lines) until it
        succeeds or ``max_delete_attempts`` have failed; returns the last failure lines."""
        reasons: list[str] = []
        for number in range(1, self.max_delete_attempts + 1):
            self.log.info("Deleting %s %s, attempt %d/%d", kind, name, number, self.max_delete_attempts)
            reasons = attempt()
            if not reasons:
                return []
            for line in reasons[:10]:
                self.log.error("%s %s: %s", kind, name, line)
            if number < self.max_delete_attempts:
                self.log.warning("Deleting %s %s failed; deleting again in %s s", kind, name, self.retry_delay_s)
                self.sleep(self.retry_delay_s)
        return reasons

    def _delete_stack(self, name: str) -> list[str]:
        def attempt() -> list[str]:
            status = self.stacks.get_stack_status(name)
            if status in (None, "DELETE_COMPLETE"):
                return []
            if status != "DELETE_IN_PROGRESS":
                self.stacks.delete_stack(name)
            try:  # the provider's boto waiter: success once the stack is gone, failure on DELETE_FAILED
                self.stacks.get_waiter("stack_delete_complete").wait(StackName=name, WaiterConfig={
                    "Delay": max(1, int(self.poll_s)), "MaxAttempts": max(1, int(self.delete_timeout_s // max(1, self.poll_s)))})
            except WaiterError as err:
                return self.stacks.failed_resources(name) or [f"stack is {self.stacks.get_stack_status(name)}: {err}"]
            return []

        return self._attempts(STACK, name, attempt)

    def _delete_cluster(self, name: str) -> list[str]:
        waiter = load_waiter("pcluster", "ClusterDeleteComplete")

        def poll() -> tuple[str, dict | None]:
            try:
                description = self.pcluster.describe_cluster(name)
            except ClusterNotFoundError as err:
                return evaluate(waiter, error=err), None
            return evaluate(waiter, response=description), description

        def attempt() -> list[str]:
            outcome, description = poll()
            if outcome == SUCCESS:
                return []
            if (description or {}).get("clusterStatus") != "DELETE_IN_PROGRESS":
                self.pcluster.delete_cluster(name)
            deadline = time.monotonic() + self.delete_timeout_s
            outcome, description = poll()
            while outcome not in (SUCCESS, FAILURE) and time.monotonic() < deadline:
                self.sleep(self.poll_s)
                outcome, description = poll()
            if outcome == SUCCESS:
                return []
            found = [f"{f.get('failureCode')}: {f.get('failureReason')}" for f in failures(description or {})]
            found += [describe_stack_event(e) for e in failed_stack_events(self.pcluster.get_cluster_stack_events(name))]
            return found or [f"cluster is {(description or {}).get('clusterStatus')}"]

        return self._attempts(CLUSTER, name, attempt)

    def _delete_scratch(self, uri: str) -> list[str]:
        bucket, key = split_s3_uri(uri)
        self.s3.delete_objects(bucket=bucket, keys=[key])
        return [f"{uri} still exists after its delete"] if self.s3.check_for_key(key, bucket_name=bucket) else []
