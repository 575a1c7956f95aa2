"""Waits until a cluster can run a job of ``num_nodes`` nodes.

Two gates:
1. describe-cluster: clusterStatus CREATE_COMPLETE (or UPDATE_COMPLETE) and computeFleetStatus RUNNING,
   polled every ``poke_interval`` (an AWS API behind it: a failing call backs off, with jitter, up to
   5 minutes);
2. Slurm on the head node (``sinfo``): the partition has ``num_nodes`` nodes that are idle (static)
   or idle~ (dynamic, powered down, Slurm starts them for the job). Once the first gate holds, the
   trigger keeps one SSH connection and waits on the head node (``SlurmHook.await_nodes_change``):
   sinfo runs there about once a second and any change of its lines wakes the trigger, which judges
   them here; describe-cluster is re-checked once per ``wait_window_s`` meanwhile.
It fails fast, with the reason, when waiting cannot help: CREATE_FAILED (failures[]), deletion,
PROTECTED or stopped fleets, too few usable nodes (down, drained) in the partition, nodes whose
power-up failed (Slurm's reason: insufficient capacity, bootstrap failure, ResumeTimeout) while the job
cannot run without them, or nodes that stay down or not responding (``stuck_after_s``).

First contact: without a pinned host key the trigger reads the head node's key once (asyncssh),
then uses it for every later connection and returns it in its event. A key is pinned for one
cluster identity (``cluster_identity``): a cluster rebuilt under the same name gets a new first contact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ultracluster.parsers.pcluster import (
    CREATE_COMPLETE,
    CREATE_FAILED,
    DELETE_COMPLETE,
    DELETE_FAILED,
    DELETE_IN_PROGRESS,
    UPDATE_COMPLETE,
    UPDATE_FAILED,
    UPDATE_IN_PROGRESS,
    ClusterNotFoundError,
    PclusterError,
    cluster_status,
    failures,
    head_node_address,
    stack_arn,
)
from ultracluster.triggers._backoff import api_delay

WAIT, READY, FAIL = "wait", "ready", "fail"
# Seconds between the head node's sinfo checks while the Slurm gate waits.
NODE_CHECK_INTERVAL_S = 1.0

# Any other clusterStatus (CREATE_IN_PROGRESS, unknown) waits; so does any other fleet status than
# RUNNING or the failed ones (START_REQUESTED, STARTING, UNKNOWN, not reported yet).
_READY_CLUSTER = {CREATE_COMPLETE, UPDATE_COMPLETE, UPDATE_IN_PROGRESS}
_FAILED_CLUSTER = {CREATE_FAILED, DELETE_IN_PROGRESS, DELETE_COMPLETE, DELETE_FAILED, UPDATE_FAILED}
_FAILED_FLEET = {"PROTECTED", "STOP_REQUESTED", "STOPPING", "STOPPED"}


def evaluate_cluster(description: dict[str, Any]) -> tuple[str, str]:
    """(verdict, reason) for a describe-cluster result."""
    status = cluster_status(description)
    fleet = str(description.get("computeFleetStatus") or "")
    name = description.get("clusterName", "?")
    if status in _FAILED_CLUSTER:
        reasons = "; ".join(
            f"{f.get('failureCode', '?')}: {f.get('failureReason', '')}".strip() for f in failures(description)
        )
        return FAIL, f"Cluster {name} is {status}" + (f" ({reasons})" if reasons else "")
    if status not in _READY_CLUSTER:
        return WAIT, f"cluster {name} is {status or 'in an unknown state'}"
    if fleet == "PROTECTED":
        return FAIL, (
            f"Compute fleet of {name} is PROTECTED: ParallelCluster stopped launching nodes after repeated "
            "bootstrap failures (check the node logs), then set it RUNNING with update-compute-fleet"
        )
    if fleet in _FAILED_FLEET:
        return FAIL, f"Compute fleet of {name} is {fleet}; start it with update-compute-fleet --status START_REQUESTED"
    if fleet != "RUNNING":
        return WAIT, f"compute fleet of {name} is {fleet or 'not reported yet'}"
    if not head_node_address(description):
        return WAIT, f"cluster {name} reports no head node address yet"
    return READY, f"cluster {name} is {status}, compute fleet RUNNING"


def cluster_identity(description: dict[str, Any]) -> str:
    """What tells one creation of a cluster from a later one of the same name (the stack ARN holds a
    per-stack UUID; creation time and head node instance are there in case it is missing)."""
    head = description.get("headNode") or {}
    parts = (stack_arn(description), description.get("creationTime"), head.get("instanceId"))
    return "|".join(str(part or "") for part in parts)


def evaluate_capacity(capacity) -> tuple[str, str]:
    """(verdict, reason) for a ``parsers.slurm.PartitionCapacity``.

    Nodes whose power-up failed (insufficient capacity, a bootstrap failure, ResumeTimeout) fail the
    wait at once when the others cannot run the job: ParallelCluster retries them only after its
    insufficient-capacity timeout or a replacement, so waiting would mostly run into the timeout.
    """
    if capacity.ready:
        return READY, capacity.describe()
    if capacity.failed:
        failed = "; ".join(f"{node} ({why})" for node, why in sorted(capacity.failed.items()))
        return FAIL, f"Nodes failed to power up: {failed}. {capacity.describe()}"
    if capacity.impossible:
        return FAIL, "Not enough usable nodes: " + capacity.describe()
    return WAIT, capacity.describe()


def stuck_nodes(capacity, since: dict[str, float], now: float, after_s: float) -> list[str]:
    """Unusable nodes (down, not responding, drained) seen unusable at every check for ``after_s``;
    ``since`` (node -> first seen) is updated in place."""
    for node in list(since):
        if node not in capacity.unusable:
            del since[node]
    for node in capacity.unusable:
        since.setdefault(node, now)
    return sorted(node for node, first in since.items() if now - first >= after_s)


class ComputeFleetTrigger(BaseTrigger):
    """Fires once: ``{"status": "success", "head_node": {...}}`` or ``{"status": "failed", "message"}``.

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
    ) -> None:
        from ultracluster.hooks.slurm import WAIT_WINDOW_S

        super().__init__()
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
            },
        )

    def _slurm(self, head_node: dict[str, Any]):
        from ultracluster.hooks.head_node import HeadNodeHook
        from ultracluster.hooks.slurm import SlurmHook

        return SlurmHook(head_node_hook=HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=head_node))

    async def check_once(self, pcluster_hook) -> tuple[str, str, dict[str, Any] | None]:
        """One round of both gates (one sinfo over a fresh connection): (verdict, reason, head_node or None)."""
        verdict, reason, head_node = await self._cluster_gate(pcluster_hook)
        if verdict != READY:
            return verdict, reason, None
        return await self._slurm_gate(head_node)

    async def _cluster_gate(self, pcluster_hook) -> tuple[str, str, dict[str, Any] | None]:
        """describe-cluster, then first contact when no key is pinned for this cluster: (verdict, reason,
        ``{"cluster_name", "address", "host_key"}`` when READY)."""
        from ultracluster.hooks.head_node import HeadNodeHook

        try:
            description = await pcluster_hook.adescribe_cluster(self.cluster_name)
        except ClusterNotFoundError as err:
            return FAIL, f"Cluster {self.cluster_name} does not exist: {err}", None
        verdict, reason = evaluate_cluster(description)
        if verdict != READY:
            return verdict, reason, None
        address = head_node_address(description)
        identity = cluster_identity(description)
        if self.keep_host_key and not self.host_key:
            return FAIL, "keep_host_key needs a pinned host_key", None
        if self.host_key is not None and self.host_key_cluster != identity and not self.keep_host_key:
            # Pinned for an earlier cluster of this name (a cleared setup rebuilt it): not this one's key.
            self.log.info("Cluster %s was recreated (%s); making first contact again", self.cluster_name, identity)
            self.host_key = None
        if self.host_key is None:
            try:
                self.host_key = await HeadNodeHook.afetch_host_key(address, self.ssh_port)
            except (TimeoutError, OSError) as err:
                return WAIT, f"head node {address}:{self.ssh_port} sshd not answering yet ({err!r})", None
            self.host_key_cluster = identity
            self.log.info("Pinned head node %s host key %s", address, self.host_key[:40] + "...")
        return READY, reason, {"cluster_name": self.cluster_name, "address": address, "host_key": self.host_key}

    async def _slurm_gate(self, head_node: dict[str, Any], pcluster_hook=None) -> tuple[str, str, dict[str, Any] | None]:
        """The Slurm gate: one sinfo over a fresh connection; with ``pcluster_hook``, the wait on the
        head node over one connection until the gate holds or fails, or the cluster gate stops holding."""
        from ultracluster.hooks.head_node import HeadNodeUnreachableError, HostKeyMismatchError
        from ultracluster.hooks.slurm import SlurmCommandError
        from ultracluster.parsers.slurm import SlurmParseError

        slurm = self._slurm(head_node)
        try:
            if pcluster_hook is None:
                return self._judge(await slurm.asinfo_text(self.partition), head_node)
            async with slurm.head_node_hook.aconnection() as conn:
                return await self._wait_on_head_node(slurm, conn, head_node, pcluster_hook)
        except HostKeyMismatchError as err:
            return FAIL, str(err), None
        except HeadNodeUnreachableError as err:
            return WAIT, f"head node not reachable over SSH yet: {err}", None
        except SlurmCommandError as err:  # slurmctld still starting
            return WAIT, f"Slurm not answering yet: {err}", None
        except SlurmParseError as err:  # e.g. the partition is unknown: waiting will not create it
            return FAIL, str(err), None

    async def _wait_on_head_node(self, slurm, conn, head_node: dict[str, Any],
                                 pcluster_hook) -> tuple[str, str, dict[str, Any] | None]:
        text = await slurm.asinfo_text(self.partition, conn=conn)
        while True:
            verdict, reason, ready = self._judge(text, head_node)
            if verdict != WAIT:
                return verdict, reason, ready
            self._note(reason)
            changed = await slurm.await_nodes_change(self.partition, text, conn=conn,
                                                     interval_s=NODE_CHECK_INTERVAL_S, window_s=self._window())
            if changed is not None:
                text = changed
                continue
            # The window passed with the lines unchanged: the cluster gate again (one describe-cluster
            # per window), then the same lines again (the stuck-node rule counts time).
            try:
                verdict, reason, again = await self._cluster_gate(pcluster_hook)
            except PclusterError as err:  # the next window asks again: already an API-friendly rate
                self.log.warning("describe-cluster failed, waiting on: %s", err)
                continue
            if verdict != READY:
                return verdict, reason, None
            if again != head_node:
                return WAIT, f"head node of {self.cluster_name} changed ({again['address']})", None

    def _window(self) -> int:
        """The window, cut short when an unusable node reaches ``stuck_after_s`` before it ends."""
        if not self._unusable_since:
            return self.wait_window_s
        due = min(self._unusable_since.values()) + self.stuck_after_s - time.monotonic()
        return max(1, min(self.wait_window_s, int(due) + 1))

    def _judge(self, sinfo_text: str, head_node: dict[str, Any]) -> tuple[str, str, dict[str, Any] | None]:
        """The Slurm gate's verdict on one sinfo output (capacity, then the stuck-node rule)."""
        from ultracluster.parsers.slurm import parse_sinfo, partition_capacity

        capacity = partition_capacity(parse_sinfo(sinfo_text), self.partition, self.num_nodes)
        verdict, reason = evaluate_capacity(capacity)
        stuck = stuck_nodes(capacity, self._unusable_since, time.monotonic(), self.stuck_after_s)
        if verdict == WAIT and stuck:
            verdict, reason = FAIL, (f"Nodes stayed down, drained or not responding for {self.stuck_after_s:.0f}s: "
                                     + "; ".join(f"{n} ({capacity.unusable[n]})" for n in stuck) + f". {reason}")
        if verdict != READY:
            return verdict, reason, None
        return verdict, reason, {**head_node, "partition": capacity.partition}

    def _note(self, reason: str) -> None:
        if reason != self._last_reason:
            self.log.info("Waiting: %s", reason)
            self._last_reason = reason

    def _pin(self) -> dict[str, Any]:
        return {"host_key": self.host_key, "host_key_cluster": self.host_key_cluster}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from ultracluster.hooks.parallelcluster import ParallelClusterHook

        pcluster_hook = ParallelClusterHook(pcluster_conn_id=self.pcluster_conn_id, region_name=self.region_name)
        api_errors = 0
        while True:
            try:
                verdict, reason, head_node = await self._cluster_gate(pcluster_hook)
                if verdict == READY:
                    verdict, reason, head_node = await self._slurm_gate(head_node, pcluster_hook)
                api_errors = 0
            except PclusterError as err:  # transient CLI/API error: the sensor timeout bounds retries
                api_errors += 1
                verdict, reason, head_node = WAIT, f"describe-cluster failed: {err}", None
            except Exception as err:
                self.log.exception("Compute fleet trigger failed")
                yield TriggerEvent({"status": "failed", "message": f"{type(err).__name__}: {err}", **self._pin()})
                return
            if verdict == READY:
                yield TriggerEvent({"status": "success", "message": reason, "head_node": head_node, **self._pin()})
                return
            if verdict == FAIL:
                yield TriggerEvent({"status": "failed", "message": reason, **self._pin()})
                return
            self._note(reason)
            await asyncio.sleep(api_delay(self.poke_interval, api_errors))
