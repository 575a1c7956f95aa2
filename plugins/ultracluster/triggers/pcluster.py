"""Triggers for the AWS side: a ParallelCluster status wait and a CloudFormation stack wait.

Both hold only serialisable arguments and never block the triggerer's event loop: pcluster runs as an
asyncio subprocess; boto3 (no aiobotocore in this venv) runs in a worker thread.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ultracluster.triggers._kill_guard import task_is_still_deferred

# Transient CLI/API errors tolerated in a row before the wait gives up (network blips, throttling).
MAX_CONSECUTIVE_ERRORS = 5

# Keys of describe-cluster kept in events: clusterConfiguration.url is a presigned S3 URL (a secret).
_DESCRIPTION_KEYS = (
    "clusterName", "clusterStatus", "cloudFormationStackStatus", "cloudformationStackArn", "region",
    "version", "computeFleetStatus", "headNode", "tags", "failures", "scheduler",
)


def public_description(description: dict) -> dict:
    """describe-cluster output minus anything secret, safe for events, logs and XCom."""
    return {k: description[k] for k in _DESCRIPTION_KEYS if k in description}


class ClusterStatusTrigger(BaseTrigger):
    """
    Poll ``pcluster describe-cluster`` until a waiter of waiters/pcluster.json decides.

    :param waiter_name: ``ClusterCreateComplete`` or ``ClusterDeleteComplete``.
    :param owner_run_id: the run id tagged on a cluster this run created; on_kill only deletes a
        cluster carrying it (on_kill can also fire on a triggerer hand-over, so never touch others').
    :param delete_on_kill: delete the cluster when a user kills the waiting task (create waits:
        a teardown is skipped when its setup did not succeed, so nobody else would delete it).
    """

    def __init__(
        self,
        *,
        cluster_name: str,
        waiter_name: str,
        pcluster_conn_id: str = "pcluster_default",
        region_name: str | None = None,
        poll_interval: float = 30,
        max_attempts: int = 240,
        owner_run_id: str | None = None,
        delete_on_kill: bool = False,
    ) -> None:
        super().__init__()
        self.cluster_name = cluster_name
        self.waiter_name = waiter_name
        self.pcluster_conn_id = pcluster_conn_id
        self.region_name = region_name
        self.poll_interval = poll_interval
        self.max_attempts = max_attempts
        self.owner_run_id = owner_run_id
        self.delete_on_kill = delete_on_kill

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{self.__class__.__module__}.{self.__class__.__qualname__}",
            {
                "cluster_name": self.cluster_name,
                "waiter_name": self.waiter_name,
                "pcluster_conn_id": self.pcluster_conn_id,
                "region_name": self.region_name,
                "poll_interval": self.poll_interval,
                "max_attempts": self.max_attempts,
                "owner_run_id": self.owner_run_id,
                "delete_on_kill": self.delete_on_kill,
            },
        )

    def _hook(self):
        from ultracluster.hooks.parallelcluster import ParallelClusterHook

        return ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from ultracluster.parsers.pcluster import PclusterError, failures
        from ultracluster.waiters import FAILURE, RETRY, SUCCESS, evaluate, load_waiter

        waiter = load_waiter("pcluster", self.waiter_name)
        hook = self._hook()
        consecutive_errors = 0
        description: dict = {}
        base = {"cluster_name": self.cluster_name, "waiter_name": self.waiter_name}
        for attempt in range(1, self.max_attempts + 1):
            try:
                description = await hook.adescribe_cluster(self.cluster_name)
                state = evaluate(waiter, response=description)
                consecutive_errors = 0
            except PclusterError as error:
                state = evaluate(waiter, error=error)
                if state == RETRY:
                    consecutive_errors += 1
                    self.log.warning(
                        "describe-cluster %s failed (%d in a row): %s", self.cluster_name, consecutive_errors, error
                    )
                    if consecutive_errors >= MAX_CONSECUTIVE_ERRORS:
                        yield TriggerEvent({**base, "status": "error", "message": str(error)})
                        return
                elif state == SUCCESS:
                    # Deleted and gone: the describe error is the success signal.
                    yield TriggerEvent({**base, "status": "success", "cluster_status": "DELETE_COMPLETE",
                                        "description": {}})
                    return
                else:
                    yield TriggerEvent({**base, "status": "failure", "cluster_status": "",
                                        "message": str(error), "failures": [], "description": {}})
                    return
            else:
                status = description.get("clusterStatus", "")
                self.log.info("Cluster %s: %s (attempt %d/%d)", self.cluster_name, status, attempt, self.max_attempts)
                if state in (SUCCESS, FAILURE):
                    yield TriggerEvent({
                        **base,
                        "status": state,
                        "cluster_status": status,
                        "failures": failures(description),
                        "description": public_description(description),
                        "message": f"cluster {self.cluster_name} reached {status}",
                    })
                    return
            await asyncio.sleep(self.poll_interval)
        yield TriggerEvent({
            **base,
            "status": "timeout",
            "cluster_status": description.get("clusterStatus", ""),
            "message": f"cluster {self.cluster_name} still {description.get('clusterStatus', 'unknown')} "
                       f"after {self.max_attempts} checks",
        })

    async def on_kill(self) -> None:
        if not (self.delete_on_kill and self.owner_run_id):
            return
        if await task_is_still_deferred(self.task_instance):
            # A triggerer hand-over, not a user kill: the wait goes on elsewhere.
            self.log.warning("on_kill while the task is still deferred (trigger moved?); %s kept", self.cluster_name)
            return
        from ultracluster.parsers.pcluster import PclusterError
        from ultracluster.tags import cluster_owner

        hook = self._hook()
        try:
            description = await hook.adescribe_cluster(self.cluster_name)
        except PclusterError as error:
            self.log.warning("on_kill: cannot describe %s, nothing deleted: %s", self.cluster_name, error)
            return
        if cluster_owner(description) != self.owner_run_id:
            self.log.warning("on_kill: cluster %s is not tagged with this run; left alone", self.cluster_name)
            return
        self.log.info("on_kill: deleting cluster %s created by this run", self.cluster_name)
        await asyncio.to_thread(hook.delete_cluster, self.cluster_name)


class CloudFormationStackTrigger(BaseTrigger):
    """
    Wait for a CloudFormation stack with botocore's official waiters (data shipped with botocore).

    Each check is one ``waiter.wait(MaxAttempts=1)`` in a worker thread, so the event loop never
    blocks; between checks the trigger sleeps with asyncio. Same decision rules as the amazon
    provider's ``async_wait``: a terminal-failure WaiterError ends the wait, "Max attempts" retries.

    :param waiter_name: ``stack_create_complete`` or ``stack_delete_complete``.
    :param owner_run_id: with ``delete_on_kill``, killing the waiting task deletes the stack, but only
        if its ``ultracluster:run-id`` tag is this run (a failed setup gets no teardown).
    """

    def __init__(
        self,
        *,
        stack_name: str,
        waiter_name: str,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        waiter_delay: float = 15,
        waiter_max_attempts: int = 240,
        owner_run_id: str | None = None,
        delete_on_kill: bool = False,
    ) -> None:
        super().__init__()
        self.stack_name = stack_name
        self.waiter_name = waiter_name
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.waiter_delay = waiter_delay
        self.waiter_max_attempts = waiter_max_attempts
        self.owner_run_id = owner_run_id
        self.delete_on_kill = delete_on_kill

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{self.__class__.__module__}.{self.__class__.__qualname__}",
            {
                "stack_name": self.stack_name,
                "waiter_name": self.waiter_name,
                "aws_conn_id": self.aws_conn_id,
                "region_name": self.region_name,
                "waiter_delay": self.waiter_delay,
                "waiter_max_attempts": self.waiter_max_attempts,
                "owner_run_id": self.owner_run_id,
                "delete_on_kill": self.delete_on_kill,
            },
        )

    def _delete_if_owned(self) -> str:
        from airflow.providers.amazon.aws.hooks.cloud_formation import CloudFormationHook

        from ultracluster.tags import stack_owner

        hook = CloudFormationHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name)
        owner = stack_owner(hook.get_conn(), self.stack_name)
        if owner != self.owner_run_id:
            return f"stack {self.stack_name} belongs to run {owner!r}: left alone"
        hook.delete_stack(self.stack_name)
        return f"deletion of stack {self.stack_name} started"

    async def on_kill(self) -> None:
        if not (self.delete_on_kill and self.owner_run_id):
            return
        if await task_is_still_deferred(self.task_instance):
            # A triggerer hand-over, not a user kill: the wait goes on elsewhere.
            self.log.warning("on_kill while the task is still deferred (trigger moved?); %s kept", self.stack_name)
            return
        try:
            self.log.info("on_kill: %s", await asyncio.to_thread(self._delete_if_owned))
        except Exception as error:  # best effort: the stack stays visible in the console link
            self.log.warning("on_kill: could not delete stack %s: %s", self.stack_name, error)

    def _check_once(self) -> tuple[str, str]:
        """One poll in a worker thread: ("success"|"failure"|"retry", detail)."""
        from airflow.providers.amazon.aws.hooks.cloud_formation import CloudFormationHook
        from botocore.exceptions import WaiterError

        if not hasattr(self, "_hook"):
            self._hook = CloudFormationHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name)
        waiter = self._hook.get_waiter(self.waiter_name)
        try:
            waiter.wait(StackName=self.stack_name, WaiterConfig={"Delay": 1, "MaxAttempts": 1})
        except WaiterError as error:
            if "terminal failure" in str(error):
                return "failure", str(error)
            if "Max attempts exceeded" in str(error):
                status = ((error.last_response or {}).get("Stacks") or [{}])[0].get("StackStatus", "")
                return "retry", status
            return "error", str(error)
        return "success", ""

    async def run(self) -> AsyncIterator[TriggerEvent]:
        base = {"stack_name": self.stack_name, "waiter_name": self.waiter_name}
        consecutive_errors = 0
        detail = ""
        for attempt in range(1, self.waiter_max_attempts + 1):
            try:
                state, detail = await asyncio.to_thread(self._check_once)
            except Exception as error:  # botocore ClientError, endpoint errors: retry a few times
                state, detail = "error", str(error)
            if state == "error":
                consecutive_errors += 1
                self.log.warning("Stack %s check failed (%d in a row): %s", self.stack_name, consecutive_errors, detail)
                if consecutive_errors >= MAX_CONSECUTIVE_ERRORS:
                    yield TriggerEvent({**base, "status": "error", "message": detail})
                    return
            else:
                consecutive_errors = 0
            if state in ("success", "failure"):
                yield TriggerEvent({**base, "status": state, "message": detail})
                return
            self.log.info("Stack %s: %s (attempt %d/%d)", self.stack_name, detail, attempt, self.waiter_max_attempts)
            await asyncio.sleep(self.waiter_delay)
        yield TriggerEvent({**base, "status": "timeout",
                            "message": f"stack {self.stack_name} still {detail} after {self.waiter_max_attempts} checks"})
