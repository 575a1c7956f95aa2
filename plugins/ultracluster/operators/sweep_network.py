"""hold_network: keep a sweep's shared network until every point that uses it has ended.

The points of a sweep run on one network (default regional quotas: 5 VPCs, 5 Elastic IPs), made by
``trn1_sweep_network``'s create_vpc; each point adopts it through the ``existing_*`` params. This
task waits, deferred, until the sweep index (written by each point's preflight) lists ``points``
runs on this VPC and all of them have ended. Then the teardown deletes the network. It gives up
waiting after ``max_hold``: delete_vpc then fails if a cluster still holds the network.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk import BaseOperator

from ultracluster.hooks.dag_runs import get_dagrun_state
from ultracluster.run.clock import parse_time
from ultracluster.run.states import RUN_ENDED, run_state_name
from ultracluster.run.sweep import read_index

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
    """
    template_fields: Sequence[str] = ("network", "sweep_id", "points", "source_dag_id", "artifacts_s3_uri",
                                      "max_hold_hours")
    ui_color = "#e8daef"

    def __init__(self, *, network: Any, sweep_id: str, points: Any, source_dag_id: str, artifacts_s3_uri: str,
                 aws_conn_id: str | None = "aws_default", poll_interval: float = 60, max_hold_hours: Any = 72,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.network = network
        self.sweep_id = sweep_id
        self.points = points
        self.source_dag_id = source_dag_id
        self.artifacts_s3_uri = artifacts_s3_uri
        self.aws_conn_id = aws_conn_id
        self.poll_interval = poll_interval
        self.max_hold_hours = max_hold_hours

    def execute(self, context: Context, event: Any = None, since: str | None = None) -> dict[str, Any]:
        vpc_id = (self.network or {}).get("vpc_id")
        started = parse_time(since) or datetime.now(timezone.utc)
        entries = [e for e in read_index(S3Hook(aws_conn_id=self.aws_conn_id), self.artifacts_s3_uri,
                                          self.source_dag_id, self.sweep_id, self.log)
                   if (e.get("plan") or {}).get("existing_vpc_id") == vpc_id]
        states = {e["run_id"]: run_state_name(get_dagrun_state(e.get("dag_id") or self.source_dag_id, e["run_id"]))
                  for e in entries}
        # A run that no longer exists ("missing": deleted) has ended too.
        open_runs = sorted(run for run, state in states.items() if state not in (*RUN_ENDED, "missing"))
        summary = {"vpc_id": vpc_id, "sweep_id": self.sweep_id, "runs": states, "expected": int(self.points)}
        if len(states) >= int(self.points) and not open_runs:
            self.log.info("Sweep %s: all %d runs on %s have ended: releasing the network", self.sweep_id,
                          len(states), vpc_id)
            return summary
        if datetime.now(timezone.utc) - started > timedelta(hours=float(self.max_hold_hours)):
            self.log.warning("Sweep %s: held %s for %s h with %d of %d runs seen, %s still open: releasing it "
                             "anyway (delete_vpc fails if a cluster still uses it)", self.sweep_id, vpc_id,
                             self.max_hold_hours, len(states), self.points, open_runs)
            return {**summary, "gave_up": True}
        self.log.info("Sweep %s: %d of %d runs on %s seen, open: %s; looking again in %s s", self.sweep_id,
                      len(states), self.points, vpc_id, open_runs or "none", self.poll_interval)

        self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=self.poll_interval)), method_name="execute",
                   kwargs={"since": started.isoformat()})
        raise AssertionError("unreachable")
