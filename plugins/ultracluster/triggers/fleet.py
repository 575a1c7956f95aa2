"""Waits until a cluster can run a job of ``num_nodes`` nodes; the verdicts are ``run.fleet``'s.

Two gates:
1. describe-cluster: clusterStatus ready and computeFleetStatus RUNNING, polled every
   ``poke_interval`` (an AWS API behind it: a failing call backs off, with jitter, up to 5 minutes);
2. Slurm on the head node (``sinfo``): the partition has ``num_nodes`` nodes that are idle (static)
   or idle~ (dynamic, powered down, Slurm starts them for the job). Once the first gate holds, the
   trigger keeps one SSH connection and waits on the head node (``SlurmHook.await_nodes_change``):
   sinfo runs there about once a second and any change of its lines wakes the trigger, which judges
   them (``run.fleet.judge_nodes``); describe-cluster is re-checked once per ``wait_window_s``.

First contact: without a pinned host key the trigger reads the head node's key once (asyncssh),
then uses it for every later connection and returns it in its event. A key is pinned for one
cluster identity (``parsers.pcluster.cluster_identity``): a cluster rebuilt under the same name gets
a new first contact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ultracluster.hooks.head_node import (
    HeadNodeHook,
    HeadNodeUnreachableError,
    HostKeyMismatchError,
)
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.hooks.slurm import WAIT_WINDOW_S, SlurmCommandError, SlurmHook
from ultracluster.parsers.pcluster import (
    ClusterNotFoundError,
    PclusterAccessDeniedError,
    PclusterError,
    cluster_facts,
    cluster_identity,
)
from ultracluster.parsers.slurm import parse_sinfo
from ultracluster.run.clock import utc_now
from ultracluster.run.events import event
from ultracluster.run.fleet import Judgement, judge_cluster, judge_nodes
from ultracluster.run.lost_nodes import DEFAULT_NODE_REPLACEMENTS, LostNodes
from ultracluster.run.returns import fleet_ready
from ultracluster.run.states import FAILED, PENDING, READY
from ultracluster.triggers.backoff import api_delay
from ultracluster.triggers.task_end import ending, task_success, warm_up

# Seconds between the head node's sinfo checks while the Slurm gate waits.
NODE_CHECK_INTERVAL_S = 1.0


class ComputeFleetTrigger(BaseTrigger):
    """Fires once (``run.events``): ``complete`` with ``head_node`` and ``ready_at``, or the failing judgement's
    reason (``cluster_failed``, ``node_lost``, ``nodes_stuck``, ...), ``host_key_mismatch``
    or ``trigger_error``; every event carries the pin (``host_key``, ``host_key_cluster``) and the
    lost-node ledger (``lost_nodes``).

    :param cluster_name: ParallelCluster name.
    :param num_nodes: nodes the next job needs.
    :param partition: Slurm partition; None = the default partition.
    :param pcluster_conn_id: connection of ParallelClusterHook.
    :param ssh_conn_id: SSH connection (user, key) of the head node.
    :param ssh_port: port sshd listens on (from the SSH connection).
    :param host_key: pinned key, when an earlier try already made first contact.
    :param host_key_cluster: ``cluster_identity`` of the cluster ``host_key`` was pinned for; the key
        is used only while describe-cluster reports that same identity.
    :param poke_interval: seconds between describe-cluster calls until the cluster gate holds (and
        between retries when the head node cannot be reached).
    :param region_name: AWS region for ParallelClusterHook (None: the connection's).
    :param stuck_after_s: fail when, the job not runnable yet, nodes stay down or not responding this long.
    :param keep_host_key: ``host_key`` was pinned by an earlier task for this cluster (train's
        auto-resume): use it as is, never make first contact again; a recreated cluster then fails
        on the key instead of being trusted anew.
    :param wait_window_s: the head-node wait command runs at most this long before describe-cluster
        is checked again and another starts, on the same connection.
    :param node_replacements: how often a lost node may be replaced (``run.lost_nodes``).
    :param lost_nodes: the task's lost-node ledger so far (``LostNodes.to_dict``).
    :param shared: the cluster is not the run's (``existing_cluster_name``, a sweep's shared cluster):
        nodes other jobs hold are waited for (``run.fleet.judge_capacity``).
    :param end_task: a fleet seen ready ends wait_for_fleet here (``triggers.task_end``), returning
        ``run.returns.fleet_ready``, but only when its task state store needs nothing new: the pin
        and the ledger are the ones it was given (a cleared task reads them there). Otherwise, and on
        any other end, the task resumes on a worker, which stores them.
    """

    def __init__(
        self,
        *,
        cluster_name: str,
        num_nodes: int,
        partition: str | None,
        pcluster_conn_id: str,
        ssh_conn_id: str,
        ssh_port: int = 22,
        host_key: str | None = None,
        host_key_cluster: str | None = None,
        poke_interval: float = 30,
        region_name: str | None = None,
        stuck_after_s: float = 600,
        keep_host_key: bool = False,
        wait_window_s: int | None = None,
        node_replacements: int = DEFAULT_NODE_REPLACEMENTS,
        lost_nodes: dict[str, Any] | None = None,
        end_task: bool = False,
        shared: bool = False,
    ) -> None:
        super().__init__()
        self.shared = bool(shared)
        self.node_replacements = int(node_replacements)
        self.lost_nodes = lost_nodes
        self._lost = LostNodes.from_dict(lost_nodes, self.node_replacements)
        self.keep_host_key = bool(keep_host_key)
        self.stuck_after_s = float(stuck_after_s)
        self._unusable_since: dict[str, float] = {}
        self._last_reason: str | None = None
        self.cluster_name = cluster_name
        self.num_nodes = int(num_nodes)
        self.partition = partition
        self.pcluster_conn_id = pcluster_conn_id
        self.ssh_conn_id = ssh_conn_id
        self.ssh_port = int(ssh_port)
        self.host_key = host_key
        self.host_key_cluster = host_key_cluster
        self.end_task = bool(end_task)
        self._stored = (host_key, host_key_cluster, self._lost.to_dict())  # what the task state store holds
        self.poke_interval = float(poke_interval)
        self.region_name = region_name or None
        self.wait_window_s = int(wait_window_s or WAIT_WINDOW_S)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "cluster_name": self.cluster_name,
                "num_nodes": self.num_nodes,
                "partition": self.partition,
                "pcluster_conn_id": self.pcluster_conn_id,
                "ssh_conn_id": self.ssh_conn_id,
                "ssh_port": self.ssh_port,
                "host_key": self.host_key,
                "host_key_cluster": self.host_key_cluster,
                "poke_interval": self.poke_interval,
                "region_name": self.region_name,
                "stuck_after_s": self.stuck_after_s,
                "keep_host_key": self.keep_host_key,
                "wait_window_s": self.wait_window_s,
                "node_replacements": self.node_replacements,
                "lost_nodes": self.lost_nodes,
                "end_task": self.end_task,
                "shared": self.shared,
            },
        )

    def _slurm(self, head_node: dict[str, Any]) -> SlurmHook:
        return SlurmHook(head_node_hook=HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=head_node))

    async def _cluster_gate(self, pcluster_hook: ParallelClusterHook) -> tuple[Judgement, dict[str, Any] | None]:
        """describe-cluster, then first contact when no key is pinned for this cluster: the judgement,
        and ``{"cluster_name", "address", "host_key"}`` when ready."""
        try:
            description = await pcluster_hook.adescribe_cluster(self.cluster_name)
        except ClusterNotFoundError as err:
            return Judgement(FAILED, "cluster_gone", f"Cluster {self.cluster_name} does not exist: {err}"), None
        facts = cluster_facts(description)
        judgement = judge_cluster(**facts)
        if judgement.verdict != READY:
            return judgement, None
        address, identity = facts["head_node_address"], cluster_identity(description)
        if self.keep_host_key and not self.host_key:
            raise ValueError("keep_host_key needs a pinned host_key")
        if self.host_key is not None and self.host_key_cluster != identity and not self.keep_host_key:
            # Pinned for an earlier cluster of this name (a cleared setup rebuilt it): not this one's key.
            self.log.info("Cluster %s was recreated (%s); making first contact again", self.cluster_name, identity)
            self.host_key = None
        if self.host_key is None:
            try:
                self.host_key = await HeadNodeHook.afetch_host_key(address, self.ssh_port)
            except (TimeoutError, OSError) as err:
                return Judgement(PENDING, "head_node_pending",
                                 f"head node {address}:{self.ssh_port} sshd not answering yet ({err!r})"), None
            self.host_key_cluster = identity
            self.log.info("Pinned head node %s host key %s", address, self.host_key[:40] + "...")
        return judgement, {"cluster_name": self.cluster_name, "address": address, "host_key": self.host_key}

    async def _slurm_gate(self, head_node: dict[str, Any],
                          pcluster_hook: ParallelClusterHook) -> tuple[Judgement, dict[str, Any] | None]:
        """Wait on the head node over one connection until the Slurm gate holds or fails, or the
        cluster gate stops holding. Unreachable or a Slurm not answering yet: pending."""
        slurm = self._slurm(head_node)
        try:
            async with slurm.head_node_hook.aconnection() as conn:
                return await self._wait_on_head_node(slurm, conn, head_node, pcluster_hook)
        except HeadNodeUnreachableError as err:
            return Judgement(PENDING, "head_node_pending", f"head node not reachable over SSH yet: {err}"), None
        except SlurmCommandError as err:  # slurmctld still starting
            return Judgement(PENDING, "slurm_pending", f"Slurm not answering yet: {err}"), None

    async def _wait_on_head_node(self, slurm: SlurmHook, conn: Any, head_node: dict[str, Any],
                                 pcluster_hook: ParallelClusterHook) -> tuple[Judgement, dict[str, Any] | None]:
        text = await slurm.asinfo_text(self.partition, conn=conn)
        while True:
            judgement, capacity = judge_nodes(parse_sinfo(text), self.partition, self.num_nodes,
                                              since=self._unusable_since, now=time.monotonic(),
                                              stuck_after_s=self.stuck_after_s, lost=self._lost,
                                              shared=self.shared)
            if judgement.verdict == READY:
                return judgement, {**head_node, "partition": capacity.partition}
            if judgement.verdict == FAILED:
                return judgement, None
            self._note(judgement.message)
            changed = await slurm.await_nodes_change(self.partition, text, conn=conn,
                                                     interval_s=NODE_CHECK_INTERVAL_S, window_s=self._window())
            if changed is not None:
                text = changed
                continue
            # The window passed with the lines unchanged: the cluster gate again (one describe-cluster
            # per window), then the same lines again (the stuck-node rule counts time).
            try:
                judgement, again = await self._cluster_gate(pcluster_hook)
            except PclusterAccessDeniedError:  # asking again is denied again: run() ends the wait
                raise
            except PclusterError as err:  # the next window asks again: already an API-friendly rate
                self.log.warning("describe-cluster failed, waiting on: %s", err)
                continue
            if judgement.verdict != READY:
                return judgement, None
            if again != head_node:
                return Judgement(PENDING, "head_node_pending",
                                 f"head node of {self.cluster_name} changed ({again['address']})"), None

    def _window(self) -> int:
        """The window, cut short when an unusable node reaches ``stuck_after_s`` before it ends."""
        if not self._unusable_since:
            return self.wait_window_s
        due = min(self._unusable_since.values()) + self.stuck_after_s - time.monotonic()
        return max(1, min(self.wait_window_s, int(due) + 1))

    def _note(self, message: str) -> None:
        if message != self._last_reason:
            self.log.info("Waiting: %s", message)
            self._last_reason = message

    def _event(self, reason: str, message: str, **fields: Any) -> TriggerEvent:
        return TriggerEvent(event(reason, message, host_key=self.host_key, host_key_cluster=self.host_key_cluster,
                                  lost_nodes=self._lost.to_dict(), **fields))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        warm_up(self, self.end_task)
        pcluster_hook = ParallelClusterHook(pcluster_conn_id=self.pcluster_conn_id, region_name=self.region_name)
        api_errors = 0
        while True:
            try:
                judgement, head_node = await self._cluster_gate(pcluster_hook)
                if judgement.verdict == READY:
                    judgement, head_node = await self._slurm_gate(head_node, pcluster_hook)
                api_errors = 0
            except PclusterAccessDeniedError as err:
                yield self._event("access_denied", str(err))
                return
            except PclusterError as err:  # transient CLI/API error: the sensor timeout bounds retries
                api_errors += 1
                judgement, head_node = Judgement(PENDING, "api_error", f"describe-cluster failed: {err}"), None
            except HostKeyMismatchError as err:
                yield self._event("host_key_mismatch", str(err))
                return
            except Exception as err:
                self.log.exception("Compute fleet trigger failed")
                yield self._event("trigger_error", f"{type(err).__name__}: {err}")
                return
            if judgement.verdict == READY:
                end = self._event("complete", judgement.message, head_node=head_node, ready_at=utc_now())
                stored = self._stored == (self.host_key, self.host_key_cluster, self._lost.to_dict())
                if ending(self, end.payload, self.end_task and stored):
                    end = await task_success(self, end, fleet_ready(head_node, end.payload["ready_at"]))
                yield end
                return
            if judgement.verdict == FAILED:
                yield self._event(judgement.reason, judgement.message)
                return
            self._note(judgement.message)
            await asyncio.sleep(api_delay(self.poke_interval, api_errors))
