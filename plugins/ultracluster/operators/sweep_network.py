"""hold_network: keep a sweep's shared network until every point that uses it has ended.

The points of a sweep run on one network (default regional quotas: 5 VPCs, 5 Elastic IPs), made by
``trn1_sweep_network``'s create_vpc; each point adopts it through the ``existing_*`` params. This
task holds it until the sweep index (written by each point's preflight) lists ``points`` runs on
this VPC and all of them have ended: one look in its worker, then one deferral to
``triggers.sweep_network.SweepNetworkTrigger``, which ends the task itself. Then the teardown
deletes the network. It gives up waiting after ``max_hold``: delete_vpc then fails if a cluster
still holds the network.

``trn1_sweep_cluster``'s hold_cluster is the same task holding a sweep's shared cluster
(``cluster_name``; ``run.shared_cluster``): it counts the runs on that cluster instead, and its
teardowns delete the cluster, then its network.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from ultracluster.run.clock import utc_now
from ultracluster.run.sweep import HOLD
from ultracluster.triggers.sweep_network import SweepNetworkTrigger, hold_message, look

if TYPE_CHECKING:
    from airflow.sdk import Context


class SweepNetworkHoldOperator(BaseOperator):
    """
    :param network: create_vpc's network (its ``vpc_id``).
    :param sweep_id: the sweep whose points use it.
    :param points: how many runs of the sweep use it (the client's fan-out starts one per point).
    :param source_dag_id: the pipeline DAG the points run in.
    :param artifacts_s3_uri: where the sweep index lives (the points' ``artifacts_s3_uri``).
    :param poll_interval: seconds between looks, deferred in between.
    :param max_hold_hours: stop waiting after this long.
    :param cluster_name: the sweep's shared cluster, when this task holds one (None: the network).
    """
    template_fields: Sequence[str] = ("network", "sweep_id", "points", "source_dag_id", "artifacts_s3_uri",
                                      "max_hold_hours", "cluster_name")
    ui_color = "#e8daef"

    def __init__(self, *, network: Any, sweep_id: str, points: Any, source_dag_id: str, artifacts_s3_uri: str,
                 aws_conn_id: str | None = "aws_default", poll_interval: float = 60, max_hold_hours: Any = 72,
                 cluster_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cluster_name = cluster_name
        self.network = network
        self.sweep_id = sweep_id
        self.points = points
        self.source_dag_id = source_dag_id
        self.artifacts_s3_uri = artifacts_s3_uri
        self.aws_conn_id = aws_conn_id
        self.poll_interval = poll_interval
        self.max_hold_hours = max_hold_hours

    def execute(self, context: Context) -> dict[str, Any]:
        watch = {"aws_conn_id": self.aws_conn_id, "artifacts_s3_uri": self.artifacts_s3_uri,
                 "source_dag_id": self.source_dag_id, "sweep_id": self.sweep_id,
                 "vpc_id": (self.network or {}).get("vpc_id"), "points": int(self.points), "since": utc_now(),
                 "max_hold_hours": float(self.max_hold_hours), "cluster_name": self.cluster_name or None}
        verdict, summary, open_runs = look(self.log, **watch)
        message = hold_message(verdict, summary, open_runs, watch["max_hold_hours"])
        if verdict != HOLD:
            self.log.info("%s", message)
            return summary
        self.log.info("%s; waiting in the triggerer, looking every %s s", message, self.poll_interval)
        self.defer(trigger=SweepNetworkTrigger(**watch, poll_interval=self.poll_interval),
                   method_name="execute_complete")
        raise AssertionError("unreachable")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """In a triggerer the trigger ends the task itself once the network can go: this runs when its
        looks kept failing, or under dag.test() (``triggers.task_end``)."""
        if event.get("status") == "success":
            return event["summary"]
        held = f"cluster {self.cluster_name}" if self.cluster_name else "the network"
        raise AirflowException(f"Holding {held} of sweep {self.sweep_id}: {event.get('message')}")
