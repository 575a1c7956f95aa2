"""Runs trn1_bert_pretrain once with dag.test() in this process and prints one JSON line:
{"state": ..., "run_id": ..., "tasks": {task_id: state}, "tries": {task_id: try number},
"results": <collect_results XCom>}. Its argument, if any, is the run's conf as JSON.
Used by tests/e2e/test_pipeline.py in a subprocess with the deployment's environment."""
from __future__ import annotations

import importlib.util
import json
import os
import sys


def main() -> None:
    conf = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    path = os.path.join(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], "trn1_bert_pretrain.py")
    spec = importlib.util.spec_from_file_location("trn1_bert_pretrain", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag_run = module.dag.test(run_conf=conf)

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        instances = dag_run.get_task_instances(session=session)
        tis = {ti.task_id: str(ti.state) for ti in instances}
        tries = {ti.task_id: ti.try_number for ti in instances}
        row = session.query(XComModel).filter_by(
            dag_id=dag_run.dag_id, run_id=dag_run.run_id, task_id="collect_results", key="return_value"
        ).one_or_none()
        results = row.value if row is not None else None
    if isinstance(results, str):
        results = json.loads(results)
    print("E2E_RESULT " + json.dumps({"state": str(dag_run.state), "run_id": dag_run.run_id, "tasks": tis,
                                      "tries": tries, "results": results}, default=str))


if __name__ == "__main__":
    main()
