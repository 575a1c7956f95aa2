"""ultracluster_reaper parses lightly, runs hourly without catchup; resource_ttl_hours reaches every
task that tags a resource (a param that does nothing would be a stub)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.dags.test_dag_integrity import LAZY, modules_after_loading

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_the_reaper_dag_parses_hourly_without_catchup(dagbag):
    assert dagbag.import_errors == {}
    dag = dagbag.dags["ultracluster_reaper"]
    assert dag.task_ids == ["reap"]
    assert dag.schedule == "@hourly" and dag.catchup is False and dag.max_active_runs == 1
    assert set(dag.params) == {"region", "artifacts_s3_uri", "dry_run"}
    assert dag.params["dry_run"] is False


def test_the_reaper_dag_parse_loads_no_heavy_library():
    loaded = modules_after_loading(DAGS / "ultracluster_reaper.py")
    assert "ultracluster.reaper" in loaded
    assert sorted(m for m in loaded if m.split(".")[0] in LAZY) == []


@pytest.mark.parametrize(("dag_id", "task_ids"), [
    ("trn1_bert_pretrain", ("create_vpc", "render_config")),
    ("trn1_sweep_network", ("create_vpc",)),
])
def test_resource_ttl_hours_is_a_param_every_tagging_task_uses(dagbag, dag_id, task_ids):
    dag = dagbag.dags[dag_id]
    param = dag.params.get_param("resource_ttl_hours")
    assert param.value == 168 and param.schema["type"] == "integer" and param.schema["minimum"] == 1
    for task_id in task_ids:
        task = dag.get_task(task_id)
        assert "resource_ttl_hours" in task.template_fields
        assert task.resource_ttl_hours == "{{ params.resource_ttl_hours }}"
