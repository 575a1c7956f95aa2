"""Benchmark 2's baseline (bench/pipeline.py): trn1_bert_pretrain's shape with no-op tasks.

The same 15 task ids, edges, setups and teardowns as dags/trn1_bert_pretrain.py, each a Python task
that returns at once, so each one takes Airflow's whole path: scheduled, queued, a worker process,
success. Only the benchmarks' deployment reads this folder (bench/_deploy.py), never a user's.
"""
from __future__ import annotations

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG


def _noop() -> None:
    return None


with DAG("ultracluster_bench_noop", schedule=None, catchup=False, is_paused_upon_creation=False,
         max_active_runs=1, tags=["ultracluster-bench"]) as dag:
    t = {task_id: PythonOperator(task_id=task_id, python_callable=_noop) for task_id in (
        "preflight", "create_vpc", "render_config", "pcluster_create", "wait_for_fleet", "download_data",
        "restore_compile_cache", "restore_checkpoint", "parallel_compile", "train", "save_compile_cache",
        "collect_results", "save_failure_artifacts", "delete_cluster", "delete_vpc")}
    (t["preflight"] >> t["create_vpc"] >> t["render_config"] >> t["pcluster_create"] >> t["wait_for_fleet"]
     >> t["download_data"] >> t["parallel_compile"] >> t["train"] >> t["collect_results"]
     >> t["save_failure_artifacts"].as_teardown(setups=t["pcluster_create"])
     >> t["delete_cluster"].as_teardown(setups=t["pcluster_create"])
     >> t["delete_vpc"].as_teardown(setups=t["create_vpc"], on_failure_fail_dagrun=True))
    t["wait_for_fleet"] >> t["restore_compile_cache"] >> t["parallel_compile"]
    t["wait_for_fleet"] >> t["restore_checkpoint"] >> t["train"]
    t["train"] >> t["save_compile_cache"] >> t["save_failure_artifacts"] >> t["delete_cluster"]
