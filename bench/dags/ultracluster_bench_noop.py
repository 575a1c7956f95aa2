"""Benchmark 2's baselines (bench/pipeline.py): trn1_bert_pretrain's shape with no-op tasks.

``ultracluster_bench_noop``: the same 15 task ids, edges, setups and teardowns as
dags/trn1_bert_pretrain.py, each a Python task that returns at once, so each one takes Airflow's
whole path: scheduled, queued, a worker process, success.

``ultracluster_bench_noop_deferred``: the same, but the pipeline's four deferred waits
(pcluster_create, parallel_compile, train, delete_cluster) each defer once to ExactTimeTrigger,
which fires WAIT_S after the deferral and ends the task in the triggerer, as the pipeline's triggers
do (Airflow's DateTimeTrigger sleeps a second at a time, so it fires up to a second late). WAIT_S
outlasts the triggerer's pick-up (up to about 2 s), as the cluster's work outlasts it in the
pipeline; the benchmark subtracts it as it subtracts the cluster's busy time.
What remains is Airflow's own cost of the shape with its waits: the floor under benchmark 2.

Only the benchmarks' deployment reads this folder (bench/_deploy.py), never a user's; it puts the
folder on PYTHONPATH, so the triggerer imports ExactTimeTrigger from this module by its classpath.
"""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, BaseOperator, timezone
from airflow.triggers.base import BaseTrigger, TaskSuccessEvent

# Each wait's length in the deferred baseline (bench/pipeline.py subtracts 4 x this).
WAIT_S = 3.0
WAITS = ("pcluster_create", "parallel_compile", "train", "delete_cluster")
TASK_IDS = ("preflight", "create_vpc", "render_config", "pcluster_create", "wait_for_fleet", "download_data",
            "restore_compile_cache", "restore_checkpoint", "parallel_compile", "train", "save_compile_cache",
            "collect_results", "save_failure_artifacts", "delete_cluster", "delete_vpc")


def _noop() -> None:
    return None


class ExactTimeTrigger(BaseTrigger):
    """Ends its task at ``moment``, to the event loop's precision."""

    def __init__(self, moment: str) -> None:
        super().__init__()
        self.moment = moment

    def serialize(self):
        return "ultracluster_bench_noop.ExactTimeTrigger", {"moment": self.moment}

    async def run(self):
        await asyncio.sleep(max(0.0, (datetime.fromisoformat(self.moment) - timezone.utcnow()).total_seconds()))
        yield TaskSuccessEvent()


class DeferOnce(BaseOperator):
    """Defers at once; the trigger fires WAIT_S later and ends the task (no worker resumes it)."""

    def execute(self, context):
        moment = timezone.utcnow() + timedelta(seconds=WAIT_S)
        self.defer(trigger=ExactTimeTrigger(moment.isoformat()), method_name="execute_complete")

    def execute_complete(self, context, event=None):  # not reached: the trigger ends the task
        return None


def _shape(dag_id: str, deferred: bool) -> DAG:
    with DAG(dag_id, schedule=None, catchup=False, is_paused_upon_creation=False,
             max_active_runs=1, tags=["ultracluster-bench"]) as dag:
        t = {task_id: DeferOnce(task_id=task_id) if deferred and task_id in WAITS
             else PythonOperator(task_id=task_id, python_callable=_noop) for task_id in TASK_IDS}
        (t["preflight"] >> t["create_vpc"] >> t["render_config"] >> t["pcluster_create"] >> t["wait_for_fleet"]
         >> t["download_data"] >> t["parallel_compile"] >> t["train"] >> t["collect_results"]
         >> t["save_failure_artifacts"].as_teardown(setups=t["pcluster_create"])
         >> t["delete_cluster"].as_teardown(setups=t["pcluster_create"])
         >> t["delete_vpc"].as_teardown(setups=t["create_vpc"], on_failure_fail_dagrun=True))
        t["wait_for_fleet"] >> t["restore_compile_cache"] >> t["parallel_compile"]
        t["wait_for_fleet"] >> t["restore_checkpoint"] >> t["train"]
        t["train"] >> t["save_compile_cache"] >> t["save_failure_artifacts"] >> t["delete_cluster"]
    return dag


noop = _shape("ultracluster_bench_noop", deferred=False)
noop_deferred = _shape("ultracluster_bench_noop_deferred", deferred=True)
