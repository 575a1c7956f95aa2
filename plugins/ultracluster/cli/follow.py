"""Following DAG runs task by task: one line per task state change, until every run has ended."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from ultracluster.cli.client import AirflowClient, segment
from ultracluster.run.states import RUN_ENDED

TASK_WIDTH = len("save_failure_artifacts")  # the longest task id of trn1_bert_pretrain


def say(*parts: object) -> None:
    """stdout, flushed: `ultracluster` is followed live through pipes (make, tee, CI logs)."""
    print(*parts, flush=True)


def run_path(dag_id: str, run_id: str) -> str:
    return f"/api/v2/dags/{segment(dag_id)}/dagRuns/{segment(run_id)}"


def task_instances(client: AirflowClient, dag_id: str, run_id: str) -> list[dict]:
    """The run's task instances, in the order they started (not yet started last, by task id)."""
    tis = client.get(f"{run_path(dag_id, run_id)}/taskInstances", params={"limit": 100})["task_instances"]
    return sorted(tis, key=lambda ti: (ti.get("start_date") or "~", ti["task_id"], ti.get("map_index", -1)))


def task_name(ti: dict) -> str:
    index = ti.get("map_index", -1)
    return ti["task_id"] if index is None or index < 0 else f"{ti['task_id']}[{index}]"


def task_line(label: str, name: str, state: str, when: str) -> str:
    return f"  {label}{name:<{TASK_WIDTH}} {state:<14} {when:>6}"


def xcom_value(client: AirflowClient, dag_id: str, run_id: str, task_id: str) -> object | None:
    """A task's return value (the stored JSON; an older Airflow may hand it back as a string)."""
    entry = client.get(f"{run_path(dag_id, run_id)}/taskInstances/{segment(task_id)}/xcomEntries/return_value",
                       missing_ok=True)
    if entry is None:
        return None
    value = entry.get("value")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


@dataclass
class Followed:
    """One run being followed; ``label`` prefixes its lines when several runs are followed at once."""

    dag_id: str
    run_id: str
    label: str = ""
    state: str | None = None
    tasks: dict[str, str] = field(default_factory=dict)

    def poll(self, client: AirflowClient, elapsed: float) -> None:
        # The run's state first: task states read after it include every change up to its end.
        self.state = client.get(run_path(self.dag_id, self.run_id))["state"]
        for ti in task_instances(client, self.dag_id, self.run_id):
            name, state = task_name(ti), ti.get("state")
            if state and self.tasks.get(name) != state:
                self.tasks[name] = state
                say(task_line(self.label, name, state, f"{elapsed:.0f}s"))


def follow(client: AirflowClient, runs: list[Followed], *, poll_s: float, timeout_s: float = 0) -> bool:
    """Follow ``runs`` until each has ended (or ``timeout_s`` passed, 0: no limit). True when every
    run succeeded. Stopping to follow never stops a run."""
    start = time.monotonic()
    pending = list(runs)
    while pending:
        elapsed = time.monotonic() - start
        for run in pending:
            run.poll(client, elapsed)
            if run.state in RUN_ENDED:
                say(f"{run.label}run {run.run_id} finished: {run.state} in {elapsed:.0f} s")
        pending = [run for run in pending if run.state not in RUN_ENDED]
        if pending and timeout_s and time.monotonic() - start >= timeout_s:
            for run in pending:
                say(f"{run.label}run {run.run_id} still {run.state} after {timeout_s:.0f} s: "
                    "stopped following it (the run goes on)")
            return False
        if pending:
            time.sleep(poll_s)
    return all(run.state == "success" for run in runs)
