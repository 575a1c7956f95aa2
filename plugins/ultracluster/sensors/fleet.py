"""wait_for_fleet: the cluster is up and Slurm can run ``num_nodes`` nodes; returns the head node.

The XCom value, ``{"cluster_name", "address", "host_key", "partition", "ready_at"}``, is what every
later task uses to reach the head node; ``host_key`` is pinned here at first contact. The task looks
once in its worker (``FleetCheck``); a fleet not ready yet is waited for by ``triggers.fleet``, which
ends the task itself when it has nothing new for the task state store (the pin, the lost-node
ledger). With ``deferrable=False`` (or train's auto-resume without a triggerer) every look is
``FleetCheck``'s. Both judge with ``run.fleet`` and return ``run.returns.fleet_ready``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook, BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ultracluster.hooks import DEFAULT_SSH_CONN_ID
from ultracluster.hooks.head_node import HeadNodeHook, HeadNodeUnreachableError
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.parsers.pcluster import (
    ClusterNotFoundError,
    PclusterError,
    cluster_facts,
    cluster_identity,
)
from ultracluster.parsers.slurm import parse_sinfo
from ultracluster.remote_commands import sinfo
from ultracluster.run.clock import utc_now
from ultracluster.run.existing_cluster import named
from ultracluster.run.events import deterministic
from ultracluster.run.fleet import Judgement, judge_cluster, judge_nodes
from ultracluster.run.lost_nodes import (
    DEFAULT_NODE_REPLACEMENTS,
    LostNodes,
    replacements,
)
from ultracluster.run.plan import node_count
from ultracluster.run.returns import created_description, fleet_ready
from ultracluster.run.shared_cluster import HELD_NODES_TIMEOUT_S
from ultracluster.run.states import FAILED, PENDING, READY
from ultracluster.triggers.fleet import ComputeFleetTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

# Task state store key: the host key from first contact survives retries of this sensor, stored as
# {"host_key", "cluster"}: the key is reused only for that same cluster (parsers.pcluster.cluster_identity).
STATE_KEY_HOST_KEY = "head_node_host_key"
# Task state store key: the lost-node ledger (run.lost_nodes) survives retries of this sensor.
STATE_KEY_LOST_NODES = "lost_nodes"


def ssh_port(ssh_conn_id: str) -> int:
    return int(BaseHook.get_connection(ssh_conn_id).port or 22)


def failure(reason: str, message: str) -> AirflowException:
    """The exception a failed wait raises: deterministic reasons (``run.events``) skip retries."""
    return (AirflowFailException if deterministic({"reason": reason}) else AirflowException)(message)


class FleetCheck:
    """The fleet wait in a worker: one round of both gates per ``check``, on the sync hooks.

    Arguments as ``triggers.fleet.ComputeFleetTrigger``'s; ``pin``: ``{"host_key", "cluster"}``;
    ``lost``: the lost-node ledger (``run.lost_nodes``), updated in place.
    """

    def __init__(self, *, cluster_name: str, num_nodes: int, partition: str | None, pcluster_hook: ParallelClusterHook,
                 ssh_conn_id: str, ssh_port: int, pin: dict[str, Any] | None = None, keep_host_key: bool = False,
                 stuck_after_s: float = 600, lost: LostNodes | None = None, shared: bool = False) -> None:
        self.shared = shared
        self.cluster_name, self.num_nodes, self.partition = cluster_name, int(num_nodes), partition
        self.pcluster_hook, self.ssh_conn_id, self.ssh_port = pcluster_hook, ssh_conn_id, int(ssh_port)
        self.pin = dict(pin or {})
        self.keep_host_key, self.stuck_after_s = keep_host_key, float(stuck_after_s)
        self._unusable_since: dict[str, float] = {}
        self.lost = lost if lost is not None else LostNodes()

    def check(self, description: dict[str, Any] | None = None) -> tuple[Judgement, dict[str, Any] | None]:
        """(judgement, head node when ready). A host key mismatch raises HostKeyMismatchError.
        ``description``: describe-cluster's answer when the caller has a fresh one; else described here."""
        if description is None:
            try:
                description = self.pcluster_hook.describe_cluster(self.cluster_name)
            except ClusterNotFoundError as err:
                return Judgement(FAILED, "cluster_gone", f"Cluster {self.cluster_name} does not exist: {err}"), None
            except PclusterError as err:
                return Judgement(PENDING, "api_error", f"describe-cluster failed: {err}"), None
        facts = cluster_facts(description)
        judgement = judge_cluster(**facts)
        if judgement.verdict != READY:
            return judgement, None
        address, identity = facts["head_node_address"], cluster_identity(description)
        if self.pin.get("cluster") != identity and not self.keep_host_key:
            self.pin = {}  # pinned for an earlier cluster of this name
        if not self.pin.get("host_key"):
            if self.keep_host_key:
                raise ValueError("keep_host_key needs a pinned host_key")
            try:
                self.pin = {"host_key": HeadNodeHook.fetch_host_key(address, self.ssh_port), "cluster": identity}
            except OSError as err:
                return Judgement(PENDING, "head_node_pending",
                                 f"head node {address}:{self.ssh_port} sshd not answering yet ({err!r})"), None
        head_node = {"cluster_name": self.cluster_name, "address": address, "host_key": self.pin["host_key"]}
        hook = HeadNodeHook(ssh_conn_id=self.ssh_conn_id, head_node=head_node)
        try:
            result = hook.run(sinfo(self.partition))
        except HeadNodeUnreachableError as err:
            return Judgement(PENDING, "head_node_pending", f"head node not reachable over SSH yet: {err}"), None
        finally:
            hook.close()
        if not result.ok:  # slurmctld still starting
            return Judgement(PENDING, "slurm_pending", f"Slurm not answering yet: {result.stderr.strip()[:500]}"), None
        judgement, capacity = judge_nodes(parse_sinfo(result.stdout), self.partition, self.num_nodes,
                                          since=self._unusable_since, now=time.monotonic(),
                                          stuck_after_s=self.stuck_after_s, lost=self.lost, shared=self.shared)
        if judgement.verdict != READY:
            return judgement, None
        return judgement, {**head_node, "partition": capacity.partition}

    def wait(self, timeout_s: float, interval_s: float, log: Any) -> dict[str, Any]:
        """``check`` until ready (the head node) or failed (AirflowException), at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            judgement, head_node = self.check()
            if judgement.verdict == READY:
                return head_node
            if judgement.verdict == FAILED:
                raise failure(judgement.reason, judgement.message)
            if time.monotonic() >= deadline:
                raise AirflowException(f"Fleet not ready after {timeout_s:.0f} s: {judgement.message}")
            log.info("Waiting: %s", judgement.message)
            time.sleep(interval_s)


class ComputeFleetSensor(BaseSensorOperator):
    """Wait for the cluster gate (CREATE_COMPLETE, fleet RUNNING) and enough idle/idle~ Slurm nodes.

    :param cluster_name: ParallelCluster name.
    :param num_nodes: nodes the jobs need.
    :param partition: Slurm partition (a ParallelCluster queue); None = the default partition.
    :param pcluster_conn_id: ParallelClusterHook connection.
    :param ssh_conn_id: SSH connection of the head node (user, key, port).
    :param deferrable: wait in the triggerer (BaseSensorOperator in 3.3 has no such argument).
    :param region_name: AWS region of the cluster (None: the pcluster connection's).
    :param node_replacements: how often a lost node (bootstrap timeout, failed power-up) may be
        replaced before the wait fails naming it (``run.lost_nodes``); 0 fails at once.
    :param existing_cluster_name: set (rendered) when the run did not create the cluster, e.g. a
        sweep's shared cluster: nodes other jobs hold are waited for, ``held_nodes_timeout`` seconds at
        most instead of ``timeout``, rather than failing for "not enough usable nodes".
    :param cluster: pcluster_create's return (``run.returns.cluster_created``), described moments
        before: a first try's first look judges the cluster gate on it instead of describing the
        cluster again. Retries, and every later look, describe it.
    """

    template_fields: Sequence[str] = ("cluster_name", "num_nodes", "partition", "region_name", "node_replacements",
                                      "existing_cluster_name", "cluster")
    ui_color = "#e8f8f5"

    def __init__(
        self,
        *,
        cluster_name: str,
        num_nodes: int | str,
        partition: str | None = None,
        pcluster_conn_id: str = "pcluster_default",
        ssh_conn_id: str = DEFAULT_SSH_CONN_ID,
        poke_interval: float = 30,
        timeout: float = 3600,
        deferrable: bool = True,
        region_name: str | None = None,
        node_replacements: int | str = DEFAULT_NODE_REPLACEMENTS,
        existing_cluster_name: str | None = None,
        held_nodes_timeout: float = HELD_NODES_TIMEOUT_S,
        cluster: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, timeout=timeout, **kwargs)
        self.cluster = cluster
        self.existing_cluster_name = existing_cluster_name
        self.held_nodes_timeout = float(held_nodes_timeout)
        self.node_replacements = node_replacements
        self.region_name = region_name
        self.cluster_name = cluster_name
        self.num_nodes = num_nodes
        self.partition = partition
        self.pcluster_conn_id = pcluster_conn_id
        self.ssh_conn_id = ssh_conn_id
        self.deferrable = deferrable
        self._check: FleetCheck | None = None

    def _validate(self) -> None:
        self.num_nodes = node_count(self.num_nodes)
        self.node_replacements = replacements(self.node_replacements)
        if not self.cluster_name:
            raise ValueError("cluster_name is required")
        if self.shared:
            self.timeout = self.held_nodes_timeout  # other jobs may hold the nodes for hours

    @property
    def shared(self) -> bool:
        return named(self.existing_cluster_name) is not None

    def _stored_pin(self, context: Context) -> dict[str, Any]:
        store = context.get("task_state_store")
        pin = store.get(STATE_KEY_HOST_KEY) if store is not None else None
        return pin if isinstance(pin, dict) else {}  # an older plain string has no cluster: dropped

    def _remember_pin(self, context: Context, pin: dict[str, Any]) -> None:
        store = context.get("task_state_store")
        if pin.get("host_key") and store is not None and pin != self._stored_pin(context):
            store.set(STATE_KEY_HOST_KEY, pin)

    def _lost(self, context: Context) -> LostNodes:
        store = context.get("task_state_store")
        return LostNodes.from_dict(store.get(STATE_KEY_LOST_NODES) if store is not None else None,
                                   int(self.node_replacements))

    def _remember_lost(self, context: Context, lost: dict[str, Any] | None) -> None:
        store = context.get("task_state_store")
        if store is not None and lost is not None and lost != store.get(STATE_KEY_LOST_NODES):
            store.set(STATE_KEY_LOST_NODES, lost)

    def _fleet_check(self, context: Context) -> FleetCheck:
        if self._check is None:
            self._check = FleetCheck(
                cluster_name=self.cluster_name, num_nodes=int(self.num_nodes), partition=self.partition,
                pcluster_hook=ParallelClusterHook(self.pcluster_conn_id, region_name=self.region_name or None),
                ssh_conn_id=self.ssh_conn_id, ssh_port=ssh_port(self.ssh_conn_id), pin=self._stored_pin(context),
                lost=self._lost(context), shared=self.shared)
        return self._check

    def _look(self, context: Context, description: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any] | None]:
        """One round of both gates in the worker (``FleetCheck``): the pin and the ledger stored, a
        failure raised, else (judgement, the return value when ready)."""
        check = self._fleet_check(context)
        try:
            judgement, head_node = check.check(description)
        finally:
            self._remember_pin(context, check.pin)
            self._remember_lost(context, check.lost.to_dict())
        if judgement.verdict == FAILED:
            raise failure(judgement.reason, judgement.message)
        self.log.info("%s", judgement.message)
        return judgement, fleet_ready(head_node, utc_now()) if judgement.verdict == READY else None

    def execute(self, context: Context) -> Any:
        self._validate()
        if not self.deferrable:
            return super().execute(context)
        # One look first: a fleet ready at once (dynamic nodes right after CREATE_COMPLETE) needs no
        # deferral, and a first contact made here is stored before the trigger starts.
        judgement, ready = self._look(context, created_description(self.cluster, self.cluster_name,
                                                                   context["ti"].try_number))
        if judgement.verdict == READY:
            return ready
        check = self._fleet_check(context)
        trigger = ComputeFleetTrigger(
            cluster_name=self.cluster_name, num_nodes=int(self.num_nodes), partition=self.partition,
            pcluster_conn_id=self.pcluster_conn_id, ssh_conn_id=self.ssh_conn_id, ssh_port=check.ssh_port,
            host_key=check.pin.get("host_key"), host_key_cluster=check.pin.get("cluster"),
            poke_interval=self.poke_interval, region_name=self.region_name or None,
            node_replacements=int(self.node_replacements), lost_nodes=check.lost.to_dict(), end_task=True,
            shared=self.shared)
        self.defer(trigger=trigger, method_name="execute_complete", timeout=timedelta(seconds=self.timeout))

    def poke(self, context: Context) -> PokeReturnValue | bool:
        """Worker-side wait: one round of both gates per poke (``FleetCheck``)."""
        judgement, ready = self._look(context)
        return PokeReturnValue(is_done=judgement.verdict == READY, xcom_value=ready)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The trigger's event when it did not end the task itself: store what it learnt first."""
        self._remember_pin(context, {"host_key": event.get("host_key"), "cluster": event.get("host_key_cluster")})
        self._remember_lost(context, event.get("lost_nodes"))
        if event.get("status") != "success":
            raise failure(str(event.get("reason")), event.get("message") or f"wait_for_fleet failed: {event}")
        head_node = fleet_ready(event["head_node"], event.get("ready_at") or utc_now())  # idle fleet time starts here
        self.log.info("Cluster %s ready: head node %s, partition %s. %s", head_node["cluster_name"],
                      head_node["address"], head_node.get("partition"), event.get("message"))
        return head_node
