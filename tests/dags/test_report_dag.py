"""trn1_scaling_report: loads cleanly and lightly, listens to the pipeline's results Asset, a valid form."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from tests.dags.test_dag_integrity import LAZY, modules_after_loading
from tests.dags.test_param_form import form_problems, form_view

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "trn1_scaling_report.py"
DAG_ID = "trn1_scaling_report"


def load(monkeypatch, profile: str | None = None):
    from airflow.dag_processing.dagbag import DagBag

    for key in [k for k in os.environ if k.startswith("ULTRACLUSTER_")]:
        monkeypatch.delenv(key)
    if profile:
        monkeypatch.setenv("ULTRACLUSTER_PROFILE", profile)
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    return bag.dags[DAG_ID]


@pytest.fixture(scope="module")
def dag():
    with pytest.MonkeyPatch.context() as monkeypatch:
        return load(monkeypatch)


def test_one_task_scheduled_on_the_pipelines_results(dag):
    from airflow.serialization.serialized_objects import DagSerialization

    assert dag.task_ids == ["build_report"]
    assert dag.timetable.asset_condition.name == "trn1_bert_pretrain_results"
    assert [a.name for a in dag.get_task("build_report").outlets] == ["trn1_bert_pretrain_scaling_report"]
    assert dag.max_active_runs == 1
    restored = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    assert restored.task_ids == ["build_report"]


def test_the_pipeline_emits_the_asset_this_dag_waits_for(dag):
    from airflow.dag_processing.dagbag import DagBag

    pipeline = DagBag(dag_folder=str(REPO / "dags" / "trn1_bert_pretrain.py")).dags["trn1_bert_pretrain"]
    emitted = {a.name for a in pipeline.get_task("collect_results").outlets}
    assert dag.timetable.asset_condition.name in emitted


@pytest.mark.parametrize("profile", ["production", "local"])
def test_the_form_keeps_trigger_enabled_in_each_profile(monkeypatch, profile):
    from ultracluster.run.profiles import load_profile

    dag = load(monkeypatch, profile)
    params = {name: dag.params.get_param(name) for name in dag.params}
    assert form_problems(form_view(params)) == []
    assert params["artifacts_s3_uri"].value == load_profile(profile)["artifacts_s3_uri"]
    assert params["sweep_id"].value is None and params["partial"].value is False


@pytest.mark.parametrize("conf, valid", [
    ({"sweep_id": "s1", "partial": True}, True),
    ({"sweep_id": None}, True),
    ({"sweep_id": "Bad_Id"}, False),
    ({"partial": "yes"}, False),
    ({"artifacts_s3_uri": "https://example.com/x"}, False),
])
def test_params_validate(dag, conf, valid):
    from airflow.sdk.definitions.param import ParamValidationError

    params = copy.deepcopy(dag.params)
    if valid:
        params.update(conf)
        assert params.validate()
    else:
        with pytest.raises(ParamValidationError):
            params.update(conf)
            params.validate()


def test_the_parse_loads_no_heavy_library():
    loaded = modules_after_loading(DAG_FILE)
    assert "ultracluster.operators.scaling_report" in loaded  # the DAG's own imports are seen
    assert sorted(m for m in loaded if m.split(".")[0] in (*LAZY, "PIL")) == []
