"""Submits Airflow 3's task-ending trigger events to deferred task instances, as the triggerer does
(``Trigger.submit_event``), on a metadata DB of its own, and prints what became of each task as one
JSON line. tests/integration/test_task_end_events.py runs it in a subprocess (its own AIRFLOW_HOME,
SQLite, DAGs folder)."""
from __future__ import annotations

import json
import os
import sys

DAG_FILE = '''
from datetime import datetime, timedelta

from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG("task_end_events", schedule=None, start_date=datetime(2026, 1, 1)):
    EmptyOperator(task_id="fails_with_a_retry_left", retries=1, retry_delay=timedelta(seconds=1))
    EmptyOperator(task_id="fails_without_retries", retries=0)
    EmptyOperator(task_id="succeeds", retries=1)
'''


def main() -> None:
    dags = os.environ["AIRFLOW__CORE__DAGS_FOLDER"]
    os.makedirs(dags, exist_ok=True)
    with open(os.path.join(dags, "task_end_events.py"), "w") as handle:
        handle.write(DAG_FILE)

    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.dagbag import DBDagBag
    from airflow.models.dagrun import DagRun
    from airflow.models.trigger import Trigger
    from airflow.models.xcom import XComModel
    from airflow.triggers.base import TaskFailedEvent, TaskSuccessEvent
    from airflow.sdk import timezone
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    with create_session() as session:
        manager = DagBundlesManager()
        manager.sync_bundles_to_db(session=session)
    for bundle in manager.get_all_dag_bundles():
        bundle.initialize()
        sync_bag_to_db(BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name),
                       bundle.name, bundle.version)
    events = {"fails_with_a_retry_left": TaskFailedEvent(xcoms={"return_value": "not pushed"}),
              "fails_without_retries": TaskFailedEvent(),
              "succeeds": TaskSuccessEvent(xcoms={"return_value": {"cluster_name": "uc-x"}, "extra": [1, 2]})}
    with create_session() as session:
        dag = DBDagBag().get_latest_version_of_dag("task_end_events", session=session)
        run = dag.create_dagrun(run_id="probe", run_after=timezone.utcnow(), run_type=DagRunType.MANUAL,
                                triggered_by=DagRunTriggeredByType.TEST, state=DagRunState.RUNNING, session=session)
        session.flush()
        for task_id in events:
            ti = run.get_task_instance(task_id, session=session)
            trigger = Trigger(classpath="tests.probe.Trigger", kwargs={})
            session.add(trigger)
            session.flush()
            ti.try_number, ti.state, ti.trigger_id = 1, TaskInstanceState.DEFERRED, trigger.id
            ti.start_date = timezone.utcnow()
            session.flush()
            events[task_id] = (trigger.id, events[task_id])
    for task_id, (trigger_id, event) in events.items():
        with create_session() as session:
            Trigger.submit_event(trigger_id, event, session=session)
    outcome = {}
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id="task_end_events", run_id="probe").one()
        for task_id in events:
            ti = run.get_task_instance(task_id, session=session)
            xcoms = {x.key: x.value for x in session.query(XComModel).filter_by(
                dag_id="task_end_events", run_id="probe", task_id=task_id)}
            outcome[task_id] = {"state": str(getattr(ti.state, "value", ti.state)), "try_number": ti.try_number,
                                "trigger_id": ti.trigger_id, "xcoms": xcoms}
    print("PROBE " + json.dumps(outcome, default=str))


if __name__ == "__main__":
    sys.exit(main())
