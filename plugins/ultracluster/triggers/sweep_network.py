"""The wait of the sweep holders (``trn1_sweep_network``'s hold_network, ``trn1_sweep_cluster``'s
hold_cluster): one deferral until the sweep's network, or cluster, can go.

Each look reads the sweep index (S3) and the state of each run on the network, through the Task
SDK's execution API (``hooks.dag_runs``: in the triggerer, the supervisor answers it, as for
Airflow's own DagStateTrigger); ``run.sweep.network_hold`` decides. The task makes its first look in
its worker (``look``, the same code); the trigger looks every ``poll_interval`` after that, logs
only what changed, and ends the task itself (``triggers.task_end``) once the network is released or
held for ``max_hold_hours``: the task has nothing left to do, delete_vpc follows.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from airflow.triggers.base import BaseTrigger, TriggerEvent

from ultracluster.hooks.dag_runs import get_dagrun_state
from ultracluster.run.clock import minutes_between, utc_now
from ultracluster.run.events import event
from ultracluster.run.states import run_state_name
from ultracluster.run.sweep import HOLD, RELEASE, network_hold, on_held, read_index
from ultracluster.triggers.backoff import api_delay
from ultracluster.triggers.task_end import ending, task_success, warm_up

# Failed looks in a row (S3 or the API server unreachable) before the wait ends and the task fails.
MAX_CONSECUTIVE_ERRORS = 5


def look(log: Any, *, aws_conn_id: str | None, artifacts_s3_uri: str, source_dag_id: str, sweep_id: str,
         vpc_id: str | None, points: int, since: str, max_hold_hours: float, cluster_name: str | None = None,
         ) -> tuple[str, dict[str, Any], list[str]]:
    """One look: ``run.sweep.network_hold``'s (verdict, return value, open runs). Blocking I/O: the
    trigger runs it in a thread. ``cluster_name``: the holder holds that cluster (and its network)."""
    entries = on_held(read_index(S3Hook(aws_conn_id=aws_conn_id), artifacts_s3_uri, source_dag_id, sweep_id, log),
                      vpc_id, cluster_name)
    states = {e["run_id"]: run_state_name(get_dagrun_state(e.get("dag_id") or source_dag_id, e["run_id"]))
              for e in entries}
    held_s = 60 * (minutes_between(since, utc_now()) or 0.0)
    return network_hold(entries, states, vpc_id=vpc_id, sweep_id=sweep_id, points=points, held_s=held_s,
                        max_hold_hours=max_hold_hours, cluster_name=cluster_name)


def hold_message(verdict: str, summary: dict[str, Any], open_runs: list[str], max_hold_hours: float) -> str:
    """What a look found, for the task log."""
    vpc, sweep, seen, expected = summary["vpc_id"], summary["sweep_id"], len(summary["runs"]), summary["expected"]
    held = summary.get("cluster_name")
    if held:
        vpc = f"cluster {held}"
    if verdict == RELEASE:
        return f"Sweep {sweep}: all {seen} runs on {vpc} have ended: releasing the {'cluster' if held else 'network'}"
    if verdict != HOLD:
        return (f"Sweep {sweep}: held {vpc} for {max_hold_hours} h with {seen} of {expected} runs seen, "
                f"{open_runs} still open: releasing it anyway ("
                + ("delete_cluster cancels what still runs on it)" if held else
                   "delete_vpc fails if a cluster still uses it)"))
    return f"Sweep {sweep}: {seen} of {expected} runs on {vpc} seen, open: {open_runs or 'none'}"


class SweepNetworkTrigger(BaseTrigger):
    """Until the network is released (or held for ``max_hold_hours`` since ``since``, ISO-8601): then
    ``TaskSuccessEvent`` with ``run.sweep.network_hold``'s return value (outside a triggerer, the
    ``complete`` event with it as ``summary``). Looks that keep failing end the wait with an
    ``api_error`` event (the task then fails)."""

    def __init__(self, *, vpc_id: str | None, sweep_id: str, points: int, source_dag_id: str, artifacts_s3_uri: str,
                 since: str, max_hold_hours: float, poll_interval: float = 60,
                 aws_conn_id: str | None = "aws_default", cluster_name: str | None = None) -> None:
        super().__init__()
        self.kwargs = {"vpc_id": vpc_id, "sweep_id": sweep_id, "points": int(points), "source_dag_id": source_dag_id,
                       "artifacts_s3_uri": artifacts_s3_uri, "since": since, "max_hold_hours": float(max_hold_hours),
                       "aws_conn_id": aws_conn_id, "cluster_name": cluster_name}
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {**self.kwargs, "poll_interval": self.poll_interval})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        warm_up(self, True)
        errors, said = 0, ""
        while True:
            await asyncio.sleep(api_delay(self.poll_interval, errors))
            try:
                verdict, summary, open_runs = await asyncio.to_thread(look, self.log, **self.kwargs)
            except Exception as err:  # S3 or the API server: the next look tries again
                errors += 1
                self.log.warning("Looking at sweep %s failed (%d in a row): %s", self.kwargs["sweep_id"], errors, err)
                if errors >= MAX_CONSECUTIVE_ERRORS:
                    yield TriggerEvent(event("api_error", f"{type(err).__name__}: {err}"))
                    return
                continue
            errors = 0
            message = hold_message(verdict, summary, open_runs, self.kwargs["max_hold_hours"])
            if verdict != HOLD:
                done = TriggerEvent(event("complete", message, summary=summary))
                yield await task_success(self, done, summary) if ending(self, done.payload, True) else done
                return
            if message != said:
                self.log.info("%s; looking every %s s", message, self.poll_interval)
                said = message
