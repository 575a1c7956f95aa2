"""The run note: when a pipeline run ends (success or failure), its summary goes into the DAG run's note.

Registered by the ultracluster Airflow plugin (``ui/plugin.py``, ``listeners``). In Airflow 3 a task
cannot write the metadata DB (it talks to the Execution API, which has no call for a run's note), so
the note is written where the run's end is decided: Airflow calls ``on_dag_run_success`` /
``on_dag_run_failed`` in the scheduler (``DagRun.update_state``), and in the API server when a user
marks a run. The summary comes from the run's XComs in the same DB (``report/run_note.py``: the
client's end-of-run lines).

The scheduler calls a listener inside its own transaction, which holds the run's row lock and
allows no commit but its own (``prohibit_commit``: even a SAVEPOINT's release counts). So the
listener only notes the run, and the note is written once that transaction has committed
(the session's ``after_commit``), in a session and transaction of its own: whatever happens there
is logged and never reaches the scheduler. A transaction that rolls back writes nothing; its
listener then waits for the session's next commit and writes only if the run has ended by then.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from airflow import settings
from airflow.listeners import hookimpl

from ultracluster.report.records import XCOM_TASKS
from ultracluster.report.run_note import merged_note, note_text
from ultracluster.run.cost import NO_PRICES, PriceError, load_prices
from ultracluster.run.states import RUN_ENDED, run_state_name

log = logging.getLogger(__name__)


def _value(raw: Any) -> Any:
    # XComs set through the Execution API are stored as JSON values; older rows as JSON text.
    # Plain json: never instantiate classes a task put into an XCom (as Airflow's XComOperatorLink).
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def run_xcoms(session: Any, dag_run: Any) -> dict[str, Any]:
    """Task id -> return value, of the run's tasks that feed a summary (``records.XCOM_TASKS``)."""
    from airflow.models.xcom import XComModel
    from sqlalchemy import select


    rows = session.execute(select(XComModel.task_id, XComModel.value).where(
        XComModel.dag_id == dag_run.dag_id, XComModel.run_id == dag_run.run_id,
        XComModel.key == "return_value", XComModel.map_index == -1, XComModel.task_id.in_(XCOM_TASKS)))
    return {task_id: _value(value) for task_id, value in rows}


def is_pipeline_run(dag_run: Any) -> bool:
    """A run of a DAG with the pipeline's tasks (trn1_bert_pretrain, or a copy of it); a run whose DAG
    is not at hand counts, and gets a note only if it has their XComs."""
    task_ids = getattr(getattr(dag_run, "dag", None), "task_ids", None)
    return task_ids is None or set(XCOM_TASKS) <= set(task_ids)


def write_run_note(bind: Any, dag_run_id: int) -> str | None:
    """Put the run's summary into its note (after a user's own text), in a transaction of its own on
    ``bind`` (an Engine). Returns the note written, or None when there is none to write. Raises on errors."""
    from airflow.models.dagrun import DagRun
    from sqlalchemy.orm import Session


    with Session(bind=bind) as session, session.begin():
        dag_run = session.get(DagRun, dag_run_id)
        state = run_state_name(dag_run.state) if dag_run is not None else None
        if state not in RUN_ENDED:  # deleted, or its end was rolled back
            return None
        xcoms = run_xcoms(session, dag_run)
        if not any(value is not None for value in xcoms.values()):
            log.info("Run %s of %s has no results to sum up: no note", dag_run.run_id, dag_run.dag_id)
            return None
        try:
            prices = load_prices()
        except PriceError as err:  # EC2's bill needs no prices; only estimates do
            log.warning("Run note of %s without prices: %s", dag_run.run_id, err)
            prices = NO_PRICES
        note = merged_note(dag_run.note, note_text(state, xcoms, prices))
        if note is None:
            log.warning("Run %s: its note has no room left for the summary: not written", dag_run.run_id)
            return None
        dag_run.note = note
        log.info("Run %s of %s: summary written into its note", dag_run.run_id, dag_run.dag_id)
    return note


def _write_logged(bind: Any, dag_run_id: int, what: str) -> None:
    try:
        write_run_note(bind, dag_run_id)
    except Exception:  # never the scheduler's problem: the run's state is already decided
        log.exception("Run note of %s not written", what)


def note_when_committed(dag_run: Any) -> None:
    """Write the run's note once the session holding its new state has committed it."""
    from sqlalchemy import event
    from sqlalchemy.orm import object_session

    if not is_pipeline_run(dag_run):
        return
    what = f"{dag_run.run_id} ({dag_run.dag_id})"
    session = object_session(dag_run)
    if session is None:  # nothing pending: the state is in the DB already

        _write_logged(settings.engine, dag_run.id, what)
        return
    bind, dag_run_id = session.get_bind(), dag_run.id

    def after_commit(_session: Any) -> None:
        _write_logged(bind, dag_run_id, what)

    event.listen(session, "after_commit", after_commit, once=True)


class RunNoteListener:
    """Airflow listener (pluggy hook implementations): the run note when a run ends."""
    @staticmethod
    def _note(dag_run: Any) -> None:
        try:
            note_when_committed(dag_run)
        except Exception:
            log.exception("Run note of %s not scheduled", getattr(dag_run, "run_id", "?"))

    @hookimpl
    def on_dag_run_success(self, dag_run: Any, msg: str) -> None:
        self._note(dag_run)

    @hookimpl
    def on_dag_run_failed(self, dag_run: Any, msg: str) -> None:
        self._note(dag_run)


run_note_listener = RunNoteListener()
