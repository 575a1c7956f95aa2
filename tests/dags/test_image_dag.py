"""trn1_build_image: parses cleanly and lightly, three tasks in a line, the profile's parameter and
roles, a form that keeps Trigger enabled, and a round trip through the scheduler's serialisation."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from tests.dags.test_dag_integrity import LAZY, modules_after_loading
from tests.dags.test_param_form import form_problems, form_view

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "trn1_build_image.py"
DAG_ID = "trn1_build_image"


def load(monkeypatch, profile: str | None = None, **env: str):
    from airflow.dag_processing.dagbag import DagBag

    for key in [k for k in os.environ if k.startswith("ULTRACLUSTER_")]:
        monkeypatch.delenv(key)
    if profile:
        monkeypatch.setenv("ULTRACLUSTER_PROFILE", profile)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    return bag.dags[DAG_ID]


@pytest.fixture(scope="module")
def dag():
    with pytest.MonkeyPatch.context() as monkeypatch:
        return load(monkeypatch)


def test_build_then_record_then_delete_superseded(dag):
    assert sorted(dag.task_ids) == ["build_image", "delete_superseded", "record_image"]
    assert dag.get_task("build_image").downstream_task_ids == {"record_image"}
    assert dag.get_task("record_image").downstream_task_ids == {"delete_superseded"}
    assert dag.schedule is None or str(dag.timetable.summary) in ("None", "")
    assert dag.max_active_runs == 1
    # Each later task works on what build_image returned; every AWS call in the run's region.
    for task_id in ("record_image", "delete_superseded"):
        assert dag.get_task(task_id).image == "{{ ti.xcom_pull(task_ids='build_image') }}"
    assert {t.region_name for t in dag.tasks} == {"{{ params.region }}"}
    assert dag.get_task("delete_superseded").delete == "{{ params.delete_superseded }}"


def test_the_production_profile_names_the_parameter_and_the_roles(monkeypatch):
    dag = load(monkeypatch, "production", ULTRACLUSTER_PERMISSIONS_BOUNDARY_ARN="arn:aws:iam::1:policy/b",
               ULTRACLUSTER_IMAGE_CLEANUP_ROLE_ARN="arn:aws:iam::1:role/parallelcluster/c")
    build = dag.get_task("build_image")
    assert build.parameter == "/ultracluster/node-image/trn1"
    assert (build.permissions_boundary_arn, build.cleanup_role_arn) == (
        "arn:aws:iam::1:policy/b", "arn:aws:iam::1:role/parallelcluster/c")
    preflight_parameter = load(monkeypatch, "production").get_task("build_image").parameter
    pipeline = _pipeline(monkeypatch, "production")
    assert pipeline.get_task("preflight").node_image_parameter == preflight_parameter


def _pipeline(monkeypatch, profile: str):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("ULTRACLUSTER_PROFILE", profile)
    return DagBag(dag_folder=str(REPO / "dags" / "trn1_bert_pretrain.py")).dags["trn1_bert_pretrain"]


@pytest.mark.parametrize("profile", ["production", "local"])
def test_the_form_keeps_trigger_enabled(monkeypatch, profile):
    dag = load(monkeypatch, profile)
    params = {name: dag.params.get_param(name) for name in dag.params}
    assert form_problems(form_view(params)) == []
    assert params["delete_superseded"].value is False and params["parent_image"].value is None


@pytest.mark.parametrize("conf, valid", [
    ({"delete_superseded": True}, True),
    ({"parent_image": "ami-0123456789abcdef0"}, True),
    ({"parent_image": "ubuntu"}, False),
    ({"delete_superseded": "yes"}, False),
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


def test_the_dag_round_trips_through_serialisation(dag):
    from airflow.serialization.serialized_objects import DagSerialization

    restored = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    assert set(restored.task_dict) == set(dag.task_dict)
    for task_id, task in dag.task_dict.items():
        assert tuple(restored.task_dict[task_id].template_fields) == tuple(task.template_fields), task_id


def test_the_parse_loads_no_heavy_library():
    loaded = modules_after_loading(DAG_FILE)
    assert "ultracluster.operators.node_image" in loaded
    assert sorted(m for m in loaded if m.split(".")[0] in LAZY) == []
