"""ParallelCluster status wait: pcluster describe-cluster as an asyncio subprocess, waiters/pcluster.json.

Holds only serialisable arguments and never blocks the triggerer's event loop.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.hooks.usage import arecord_usage
from ultracluster.parsers.pcluster import PclusterAccessDeniedError, PclusterError, failures, public_description
from ultracluster.run.clock import utc_now
from ultracluster.run.events import event
from ultracluster.run.returns import cluster_created, cluster_deleted
from ultracluster.run.states import DELETE_COMPLETE, GONE, cluster_verdict
from ultracluster.run.tags import cluster_owner
from ultracluster.triggers.backoff import api_delay
from ultracluster.triggers.kill_guard import should_delete_on_kill
from ultracluster.triggers.task_end import ending, task_success, warm_up
from ultracluster.waiters import FAILURE, RETRY, SUCCESS, evaluate, load_waiter

# Transient CLI/API errors tolerated in a row before the wait gives up (network blips, throttling).
MAX_CONSECUTIVE_ERRORS = 5


class ClusterStatusTrigger(BaseTrigger):
    """
    Poll ``pcluster describe-cluster`` until a waiter of waiters/pcluster.json decides.

    Events (``run.events``), with ``cluster_name``, ``waiter_name``, ``cluster_status``,
    ``failures`` and ``description`` (secrets removed): ``complete``; ``cluster_failed`` or
    ``cluster_gone`` (the waiter's failure states); ``api_error``; ``timeout``.

    :param waiter_name: ``ClusterCreateComplete`` or ``ClusterDeleteComplete``.
    :param owner_run_id: the run id tagged on a cluster this run created; on_kill only deletes a
        cluster carrying it (on_kill can also fire on a triggerer hand-over, so never touch others').
    :param delete_on_kill: delete the cluster when a user kills the waiting task (create waits:
        a teardown is skipped when its setup did not succeed, so nobody else would delete it).
    :param end_task: a wait that succeeds ends its task here (``triggers.task_end``): a create wait
        pcluster_create, returning ``run.returns.cluster_created`` with ``config_s3_uri``; a delete wait
        delete_cluster, once it billed the cluster (``hooks.usage.arecord_usage`` with ``bill``),
        returning ``run.returns.cluster_deleted``. Any other end resumes the task.
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
        end_task: bool = False,
        config_s3_uri: str | None = None,
        bill: dict[str, Any] | None = None,
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
        if end_task and waiter_name == "ClusterDeleteComplete" and not bill:
            raise ValueError("end_task: a delete wait ends delete_cluster only once it billed the cluster (bill)")
        self.end_task = bool(end_task)
        self.config_s3_uri = config_s3_uri
        self.bill = dict(bill) if bill else None

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
                "end_task": self.end_task,
                "config_s3_uri": self.config_s3_uri,
                "bill": self.bill,
            },
        )

    def _hook(self) -> ParallelClusterHook:
        return ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name)

    def _event(self, reason: str, message: str, description: dict | None = None) -> TriggerEvent:
        description = description or {}
        return TriggerEvent(event(
            reason, message, cluster_name=self.cluster_name, waiter_name=self.waiter_name,
            cluster_status=description.get("clusterStatus", ""), failures=failures(description),
            description=public_description(description)))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        warm_up(self, self.end_task)
        waiter = load_waiter("pcluster", self.waiter_name)
        hook = self._hook()
        consecutive_errors = 0
        description: dict = {}
        for attempt in range(1, self.max_attempts + 1):
            called_at = time.monotonic()
            try:
                description = await hook.adescribe_cluster(self.cluster_name)
                state = evaluate(waiter, response=description)
                consecutive_errors = 0
            except PclusterAccessDeniedError as error:
                yield self._event("access_denied", str(error))
                return
            except PclusterError as error:
                state = evaluate(waiter, error=error)
                if state == SUCCESS:  # deleted and gone: the describe error is the success signal
                    end = self._event("complete", f"cluster {self.cluster_name} is gone", {"clusterStatus": DELETE_COMPLETE})
                    yield await self._task_end(end) if ending(self, end.payload, self.end_task) else end
                    return
                if state == FAILURE:
                    yield self._event("cluster_gone", str(error))
                    return
                consecutive_errors += 1
                self.log.warning("describe-cluster %s failed (%d in a row): %s", self.cluster_name,
                                 consecutive_errors, error)
                if consecutive_errors >= MAX_CONSECUTIVE_ERRORS:
                    yield self._event("api_error", str(error))
                    return
            else:
                status = description.get("clusterStatus", "")
                self.log.info("Cluster %s: %s (attempt %d/%d)", self.cluster_name, status, attempt, self.max_attempts)
                if state != RETRY:
                    reason = ("complete" if state == SUCCESS
                              else "cluster_gone" if cluster_verdict(status) == GONE else "cluster_failed")
                    end = self._event(reason, f"cluster {self.cluster_name} reached {status}", description)
                    yield await self._task_end(end) if ending(self, end.payload, self.end_task) else end
                    return
            # One look per interval, the call's own time included; after failures, the backoff in full.
            spent = 0.0 if consecutive_errors else time.monotonic() - called_at
            await asyncio.sleep(max(0.0, api_delay(self.poll_interval, consecutive_errors) - spent))
        yield self._event("timeout", f"cluster {self.cluster_name} still {description.get('clusterStatus', 'unknown')} "
                                     f"after {self.max_attempts} checks", description)

    async def _task_end(self, end: TriggerEvent) -> TriggerEvent:
        if self.waiter_name == "ClusterCreateComplete":
            return await task_success(self, end, cluster_created(self.cluster_name, end.payload["description"],
                                                                 self.config_s3_uri))
        deleted_at = utc_now()
        self.log.info("Cluster %s deleted", self.cluster_name)
        usage = await arecord_usage(self.log, self.bill or {}, deleted_at)
        return await task_success(self, end, cluster_deleted(self.cluster_name, deleted_at, usage))

    async def on_kill(self) -> None:
        if not await should_delete_on_kill(self, self.cluster_name):
            return
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
