"""The scheduler only ever sees the serialised DAG: it must round-trip, with the teardown wiring and
templated fields intact (an operator field named like a BaseOperator attribute breaks this)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "trn1_bert_pretrain.py"


def load_dag():
    spec = importlib.util.spec_from_file_location("trn1_bert_pretrain_ser", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def test_dag_round_trips_through_serialisation():
    from airflow.serialization.serialized_objects import DagSerialization

    dag = load_dag()
    restored = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    assert set(restored.task_dict) == set(dag.task_dict)
    for task_id, task in dag.task_dict.items():
        again = restored.task_dict[task_id]
        assert again.is_teardown == task.is_teardown, task_id
        assert set(again.downstream_task_ids) == set(task.downstream_task_ids), task_id
        assert tuple(again.template_fields) == tuple(task.template_fields), task_id
    # Tasks run on the default executor queue, never on a Slurm partition's name.
    assert {t.queue for t in restored.task_dict.values()} == {dag.task_dict["create_vpc"].queue}


def test_every_aws_facing_task_uses_the_region_param():
    # A task on the connection's default region would look for the cluster in the wrong place.
    dag = load_dag()
    regional = {t.task_id: t.region_name for t in dag.tasks if hasattr(t, "region_name")}
    assert {"create_vpc", "pcluster_create", "wait_for_fleet", "delete_cluster", "delete_vpc"} <= set(regional)
    assert set(regional.values()) == {"{{ params.region }}"}, regional
