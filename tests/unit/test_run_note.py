"""The run note: the run's summary written into its DAG run note when the run ends.

The text from recorded XComs (a real local run's, tests/fixtures/xcoms/), and the listener through
Airflow's own path: ``DagRun.notify_dagrun_state_changed`` calls the listener manager, which holds
the listeners of the installed plugin (entry point ``airflow.plugins``), under the scheduler's commit
guard, against Airflow's real tables (a SQLite file; foreign keys off, so XComs need no task
instances). The real scheduler on PostgreSQL: tests/e2e/test_ui_links.py.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ultracluster.report.records import XCOM_TASKS
from ultracluster.report.run_note import NOTE_MAX_CHARS, NOTE_TITLE, merged_note, note_text
from ultracluster.report.summary import run_summary, summary_lines
from ultracluster.run.cost import load_prices

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "xcoms" / "trn1_bert_pretrain_success.json"
DAG_ID = "trn1_bert_pretrain"


def recorded_xcoms() -> dict:
    return json.loads(RECORDED.read_text())["xcoms"]


def test_the_note_of_a_recorded_run_holds_its_summary():
    xcoms = recorded_xcoms()
    note = note_text("success", xcoms, load_prices())
    lines = note.splitlines()
    assert lines[:2] == [NOTE_TITLE, ""]
    # The client's end-of-run lines, one list item each, in the same order.
    expected = summary_lines(run_summary("success", xcoms, load_prices()))
    assert lines[2:] == [f"- **{label}**: {text}" for label, text in expected]
    items = dict(line.removeprefix("- **").split("**: ", 1) for line in lines[2:])
    metrics, usage = xcoms["collect_results"], xcoms["delete_cluster"]["usage"]
    assert items["nodes"] == f"2 (world size {metrics['world_size']}, global batch {metrics['global_batch']})"
    assert items["throughput"] == (f"{metrics['average_throughput_seq_per_s']:,.1f} seq/s average, "
                                   f"{metrics['peak_throughput_seq_per_s']:,.1f} peak")
    assert items["time to train"] == f"{metrics['time_to_train_min']:,.2f} min"
    assert items["cost"].startswith(f"${usage['usd']:,.2f} from EC2 instance lives")
    assert items["idle fleet"].endswith(")") and "fleet ready to train" in items["idle fleet"]
    assert float(items["idle fleet"].split()[0]) > 0
    assert len(note) < NOTE_MAX_CHARS


def test_a_user_note_is_kept_and_an_earlier_summary_replaced():
    summary = note_text("success", recorded_xcoms(), load_prices())
    assert merged_note(None, summary) == summary
    assert merged_note("", summary) == summary
    assert merged_note("looked fine to me", summary) == f"looked fine to me\n\n{summary}"
    old = merged_note("looked fine to me", note_text("failed", {}, load_prices()))
    assert merged_note(old, summary) == f"looked fine to me\n\n{summary}"   # a cleared, rerun run
    assert merged_note("x" * (NOTE_MAX_CHARS - 10), summary) is None        # never cuts the user's text


# --- the listener, as the scheduler calls it -----------------------------------------------------------

@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """Airflow's tables in a SQLite file (the note is written on a connection of its own)."""
    from airflow.models import import_all_models
    from airflow.models.base import Base
    from sqlalchemy import create_engine

    import_all_models()
    engine = create_engine(f"sqlite:///{tmp_path_factory.mktemp('metadata') / 'airflow.db'}")
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def scheduler_session(engine):
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        yield session


def running_run(session, run_id: str, xcoms: dict, dag_id: str = DAG_ID):
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel

    dag_run = DagRun(dag_id=dag_id, run_id=run_id, run_type="manual", state="running")
    session.add(dag_run)
    session.flush()
    for task_id, value in xcoms.items():
        # As the Execution API stores a return value: a JSON value, no XComEncoder.
        session.add(XComModel(dag_run_id=dag_run.id, key="return_value", value=value, run_id=run_id,
                              task_id=task_id, dag_id=dag_id, map_index=-1))
    session.add(XComModel(dag_run_id=dag_run.id, key="ultracluster_slurm_job", value={"job_id": "9"},
                          run_id=run_id, task_id="train", dag_id=dag_id, map_index=-1))
    session.commit()
    return dag_run


def end_as_the_scheduler_does(session, dag_run, state: str, before_commit=lambda: None) -> None:
    """DagRun.update_state under the scheduler's commit guard: the state, the listeners, one commit."""
    from airflow.utils.sqlalchemy import prohibit_commit

    with prohibit_commit(session) as guard:
        dag_run.set_state(state)
        dag_run.notify_dagrun_state_changed(msg="success" if state == "success" else "task_failure")
        before_commit()
        guard.commit()


def stored_note(engine, run_id: str):
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        return session.scalars(select(DagRun).where(DagRun.run_id == run_id)).one().note


def test_the_installed_plugin_registers_the_listener():
    from airflow.listeners.listener import get_listener_manager

    from ultracluster.listeners import run_note_listener

    assert get_listener_manager().pm.is_registered(run_note_listener)


@pytest.mark.parametrize("state", ["success", "failed"])
def test_a_run_that_ends_gets_its_summary_as_note(scheduler_session, engine, state):
    xcoms = recorded_xcoms()
    if state == "failed":  # train failed: no results, the cluster still billed
        xcoms = {task: value for task, value in xcoms.items() if task not in ("train", "collect_results")}
    dag_run = running_run(scheduler_session, f"manual__{state}", xcoms)

    def not_yet():  # the note waits for the scheduler's commit of the run's end
        assert stored_note(engine, f"manual__{state}") is None

    end_as_the_scheduler_does(scheduler_session, dag_run, state, before_commit=not_yet)
    note = stored_note(engine, f"manual__{state}")
    assert note == note_text(state, xcoms, load_prices())
    if state == "failed":
        assert "- **throughput**: - seq/s average, - peak" in note


def test_a_users_note_stays_and_other_dags_runs_get_none(scheduler_session, engine):
    dag_run = running_run(scheduler_session, "manual__noted", {"preflight": recorded_xcoms()["preflight"]})
    dag_run.note = "rerun after the capacity error"
    scheduler_session.commit()
    end_as_the_scheduler_does(scheduler_session, dag_run, "success")
    assert stored_note(engine, "manual__noted").startswith("rerun after the capacity error\n\n" + NOTE_TITLE)

    other = running_run(scheduler_session, "manual__other", {}, dag_id="some_other_dag")
    end_as_the_scheduler_does(scheduler_session, other, "success")
    assert stored_note(engine, "manual__other") is None
    # A DAG without the pipeline's tasks gets no note, even with XComs of the same task ids.
    from types import SimpleNamespace

    lookalike = running_run(scheduler_session, "manual__lookalike", recorded_xcoms(), dag_id="lookalike")
    lookalike.dag = SimpleNamespace(task_ids=["train", "collect_results"])
    end_as_the_scheduler_does(scheduler_session, lookalike, "success")
    assert stored_note(engine, "manual__lookalike") is None


def test_a_failed_write_is_logged_and_the_scheduler_goes_on(scheduler_session, engine, caplog):
    from sqlalchemy import text

    dag_run = running_run(scheduler_session, "manual__broken", recorded_xcoms())
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE dag_run_note RENAME TO dag_run_note_gone"))  # every note write fails
    try:
        with caplog.at_level(logging.ERROR, logger="ultracluster.listeners"):
            end_as_the_scheduler_does(scheduler_session, dag_run, "success")   # raises nothing
        assert "Run note of manual__broken (trn1_bert_pretrain) not written" in caplog.text
        scheduler_session.refresh(dag_run)
        assert dag_run.state == "success"  # the scheduler's own commit went through
    finally:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE dag_run_note_gone RENAME TO dag_run_note"))


def test_a_rolled_back_end_writes_nothing(scheduler_session, engine):
    dag_run = running_run(scheduler_session, "manual__rolled_back", recorded_xcoms())
    dag_run.set_state("success")
    dag_run.notify_dagrun_state_changed(msg="success")
    scheduler_session.rollback()
    scheduler_session.commit()  # the session's next commit: the run is still running, so no note
    assert stored_note(engine, "manual__rolled_back") is None


def test_only_the_summarys_xcoms_are_read(scheduler_session):
    from ultracluster.listeners import run_xcoms

    dag_run = running_run(scheduler_session, "manual__xcoms", recorded_xcoms())
    read = run_xcoms(scheduler_session, dag_run)
    assert set(read) == set(XCOM_TASKS) and read == recorded_xcoms()
