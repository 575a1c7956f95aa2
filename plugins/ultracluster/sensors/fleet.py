"""wait_for_fleet: the cluster is up and Slurm can run ``num_nodes`` nodes; returns the head node.

The XCom value, ``{"cluster_name", "address", "host_key", "partition"}``, is what every later task
uses to reach the head node; ``host_key`` is pinned here at first contact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException

from ultracluster.clock import utc_now
from ultracluster.hooks import DEFAULT_SSH_CONN_ID
from ultracluster.operators.config import node_count

if TYPE_CHECKING:
    from airflow.sdk import Context

# Task state store key: the host key from first contact survives retries of this sensor, stored as
# {"host_key", "cluster"}: the key is reused only for that same cluster (triggers.fleet.cluster_identity).
STATE_KEY_HOST_KEY = "head_node_host_key"


class ComputeFleetSensor(BaseSensorOperator):
    """Wait for CREATE_COMPLETE + computeFleetStatus RUNNING + enough idle/idle~ Slurm nodes.

    :param cluster_name: ParallelCluster name.
    :param num_nodes: nodes the jobs need.
    :param partition: Slurm partition (a ParallelCluster queue); None = the default partition.
    :param pcluster_conn_id: ParallelClusterHook connection.
    :param ssh_conn_id: SSH connection of the head node (user, key, port).
    :param deferrable: wait in the triggerer (BaseSensorOperator in 3.3 has no such argument).
    :param region_name: AWS region of the cluster (None: the pcluster connection's).
    """

    template_fields: Sequence[str] = ("cluster_name", "num_nodes", "partition", "region_name")
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
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, timeout=timeout, **kwargs)
        self.region_name = region_name
        self.cluster_name = cluster_name
        self.num_nodes = num_nodes
        self.partition = partition
        self.pcluster_conn_id = pcluster_conn_id
        self.ssh_conn_id = ssh_conn_id
        self.deferrable = deferrable
        self._pin: dict[str, Any] | None = None  # {"host_key", "cluster"}

    def _validate(self) -> None:
        self.num_nodes = node_count(self.num_nodes)
        if not self.cluster_name:
            raise ValueError("cluster_name is required")

    def _ssh_port(self) -> int:
        from airflow.sdk import BaseHook

        return int(BaseHook.get_connection(self.ssh_conn_id).port or 22)

    def _trigger(self, context: Context):
        from ultracluster.triggers.fleet import ComputeFleetTrigger

        store = context.get("task_state_store")
        pin = self._pin or (store.get(STATE_KEY_HOST_KEY) if store is not None else None)
        # An older plain-string value has no cluster identity: it cannot be matched, so it is dropped.
        pin = pin if isinstance(pin, dict) else {}
        return ComputeFleetTrigger(
            cluster_name=self.cluster_name,
            num_nodes=int(self.num_nodes),
            partition=self.partition,
            pcluster_conn_id=self.pcluster_conn_id,
            ssh_conn_id=self.ssh_conn_id,
            ssh_port=self._ssh_port(),
            host_key=pin.get("host_key"),
            host_key_cluster=pin.get("cluster"),
            poke_interval=self.poke_interval,
            region_name=self.region_name or None,
        )

    def execute(self, context: Context) -> Any:
        self._validate()
        if not self.deferrable:
            return super().execute(context)
        self.defer(
            trigger=self._trigger(context),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def poke(self, context: Context) -> PokeReturnValue | bool:
        """Worker-side wait: the trigger's checks, one round per poke."""
        from ultracluster.hooks.parallelcluster import ParallelClusterHook
        from ultracluster.triggers.fleet import FAIL, READY

        trigger = self._trigger(context)
        verdict, reason, head_node = asyncio.run(
            trigger.check_once(
                ParallelClusterHook(pcluster_conn_id=self.pcluster_conn_id, region_name=self.region_name or None)
            )
        )
        self._remember_host_key(context, trigger.host_key, trigger.host_key_cluster)
        if verdict == FAIL:
            raise AirflowException(reason)
        self.log.info("%s", reason)
        if verdict == READY:
            head_node = {**head_node, "ready_at": utc_now()}
        return PokeReturnValue(is_done=verdict == READY, xcom_value=head_node)

    def _remember_host_key(self, context: Context, host_key: str | None, cluster: str | None) -> None:
        pin = {"host_key": host_key, "cluster": cluster}
        if host_key and pin != self._pin:
            self._pin = pin
            store = context.get("task_state_store")
            if store is not None:
                store.set(STATE_KEY_HOST_KEY, pin)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":
            self._remember_host_key(context, event.get("host_key"), event.get("host_key_cluster"))
            raise AirflowException(event.get("message") or f"wait_for_fleet failed: {event}")
        head_node = {**event["head_node"], "ready_at": utc_now()}  # idle fleet time starts here
        self._remember_host_key(context, head_node.get("host_key"), event.get("host_key_cluster"))
        self.log.info(
            "Cluster %s ready: head node %s, partition %s. %s",
            head_node["cluster_name"],
            head_node["address"],
            head_node.get("partition"),
            event.get("message"),
        )
        return head_node
