"""Sweep points and the run plan (ultracluster/run/sweep.py), and the `sweep` param's schema."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import jsonschema
import pytest

from ultracluster.run.plan import run_plan
from ultracluster.run.sweep import (
    ORIGIN,
    SWEEP_SCHEMA,
    SweepError,
    describe_point,
    sweep_location,
    sweep_point,
    tick_index,
)

WEEK = timedelta(days=7)
SWEEP = {"id": "s1", "num_nodes": [1, 2, 4, 8, 16], "scaling_mode": "weak"}


def sunday(weeks_after_origin: int) -> datetime:
    return ORIGIN + weeks_after_origin * WEEK


@pytest.mark.parametrize("first", [0, 3, 117, 5000])
def test_any_consecutive_ticks_cover_every_point_once(first):
    chosen = [sweep_point(SWEEP, sunday(first + i), WEEK)["num_nodes"] for i in range(len(SWEEP["num_nodes"]))]
    assert sorted(chosen) == sorted(SWEEP["num_nodes"])


def test_a_longer_range_repeats_points_in_order():
    chosen = [sweep_point(SWEEP, sunday(10 + i), WEEK)["index"] for i in range(7)]
    assert chosen == [0, 1, 2, 3, 4, 0, 1]


def test_a_backfill_starts_where_its_first_week_falls():
    """Issue 25: points 1, 2, 3 backfilled over the Sundays from 2026-03-29 (week 169) run as 2, 3, 1."""
    sweep = {"id": "s1", "num_nodes": [1, 2, 3]}
    first = datetime(2026, 3, 29, tzinfo=timezone.utc)
    assert [sweep_point(sweep, first + i * WEEK, WEEK)["num_nodes"] for i in range(3)] == [2, 3, 1]


def test_the_task_sdk_does_not_tell_a_run_its_backfill():
    """Why a backfill cannot start at its first point: what a task knows of its DagRun (the execution
    API's model, as the Task SDK receives it) has the run type, no backfill id nor its dates. When this
    fails, Airflow tells a run its backfill: start the points at the backfill's first tick."""
    from airflow.api_fastapi.execution_api.datamodels.taskinstance import DagRun as ServedDagRun
    from airflow.sdk.api.datamodels._generated import DagRun

    for model in (DagRun, ServedDagRun):
        assert "run_type" in model.model_fields and "logical_date" in model.model_fields
        assert not {name for name in model.model_fields if "backfill" in name or name in ("from_date", "to_date")}


def test_the_weekly_schedule_ticks_are_whole_indexes():
    # The DAG's @weekly ticks are Sundays 00:00 UTC; a backfill's logical dates are those ticks.
    assert ORIGIN.weekday() == 6 and (ORIGIN.hour, ORIGIN.minute) == (0, 0)
    assert tick_index(datetime(2026, 11, 29, tzinfo=timezone.utc), WEEK) == 204
    assert tick_index(datetime(2026, 11, 29, 0, 0, 1, tzinfo=timezone.utc), WEEK) == 204
    # Airflow hands tasks pendulum datetimes.
    import pendulum

    assert tick_index(pendulum.datetime(2026, 11, 29, tz="UTC"), WEEK) == 204


def test_a_named_point_wins_and_must_be_one_of_the_points():
    point = sweep_point({**SWEEP, "point": {"num_nodes": 8}}, sunday(0), WEEK)
    assert (point["index"], point["count"], point["num_nodes"], point["chosen_by"]) == (3, 5, 8, "point")
    with pytest.raises(SweepError, match="num_nodes=3 is not one of its points"):
        sweep_point({**SWEEP, "point": {"num_nodes": 3}}, sunday(0), WEEK)
    alone = sweep_point({"id": "s2", "point": {"num_nodes": 4}}, None, WEEK)
    assert (alone["index"], alone["count"], alone["points"]) == (0, 1, [4])


def test_a_sweep_run_without_a_logical_date_must_name_its_point():
    with pytest.raises(SweepError, match="must name its point"):
        sweep_point(SWEEP, None, WEEK)


def test_the_plan_applies_the_point():
    params = {"num_nodes": 16, "max_nodes": 4, "min_nodes": 0, "scaling_mode": "strong", "sweep": SWEEP}
    plan = run_plan(params, sunday(4), WEEK)  # index 4: 16 nodes
    assert (plan["num_nodes"], plan["max_nodes"], plan["scaling_mode"]) == (16, 16, "weak")
    # The cluster is sized to the point (the node cap counts MaxCount), unless min_nodes is larger.
    plan = run_plan(dict(params, max_nodes=32), sunday(1), WEEK)
    assert (plan["num_nodes"], plan["max_nodes"]) == (2, 2)
    plan = run_plan(dict(params, max_nodes=32, min_nodes=4), sunday(1), WEEK)
    assert (plan["num_nodes"], plan["max_nodes"]) == (2, 4)
    assert describe_point(plan["sweep_point"]).startswith("sweep s1: point 2/5 -> num_nodes=2")
    assert run_plan({"num_nodes": 3, "sweep": None}, None, WEEK) == {"num_nodes": 3, "sweep": None,
                                                                    "sweep_point": None}


@pytest.mark.parametrize("sweep, ok", [
    (None, True),
    (SWEEP, True),
    ({"id": "s1", "point": {"num_nodes": 2}}, True),
    ({"id": "s1", "num_nodes": []}, False),  # a sweep of 0 points
    ({"id": "s1"}, False),  # neither points nor a point
    ({"id": "S 1", "num_nodes": [1]}, False),  # the id goes into S3 keys
    ({"id": "s1", "num_nodes": [1, 1]}, False),
    ({"id": "s1", "num_nodes": [0]}, False),
    ({"id": "s1", "num_nodes": [1], "scaling_mode": "linear"}, False),
    ({"id": "s1", "num_nodes": [1], "nodes": [2]}, False),
])
def test_the_schema_refuses_bad_sweeps(sweep, ok):
    validator = jsonschema.Draft7Validator(SWEEP_SCHEMA)
    assert validator.is_valid(sweep) is ok


def test_sweep_files_live_under_the_artifacts_prefix():
    assert sweep_location("s3://bucket/runs", "sweeps", "trn1_bert_pretrain", "s1") == (
        "bucket", "runs/sweeps/trn1_bert_pretrain/s1")
    assert sweep_location("s3://bucket", "reports", "d", "s1") == ("bucket", "reports/d/s1")
