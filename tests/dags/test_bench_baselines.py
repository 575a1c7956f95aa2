"""Benchmark 2's baselines (bench/dags): the pipeline's shape, and the deferred one's trigger ends its task."""
from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH_DAGS = REPO / "bench" / "dags"
PIPELINE = "trn1_bert_pretrain"
BASELINES = ("ultracluster_bench_noop", "ultracluster_bench_noop_deferred")
# The pipeline's tasks that defer whenever they run (wait_for_fleet defers only when its first look fails).
DEFERRED = {"pcluster_create", "parallel_compile", "train", "delete_cluster"}


@pytest.fixture(scope="module")
def dags():
    from airflow.dag_processing.dagbag import DagBag

    pipeline = DagBag(dag_folder=str(REPO / "dags"))
    bench = DagBag(dag_folder=str(BENCH_DAGS))
    assert pipeline.import_errors == {} and bench.import_errors == {}
    return {PIPELINE: pipeline.dags[PIPELINE], **{d: bench.dags[d] for d in BASELINES}}


def _shape(dag) -> dict[str, tuple[frozenset[str], bool]]:
    """Each task's ancestors (what must end before it starts) and whether it is a teardown."""
    return {t.task_id: (frozenset(a.task_id for a in t.get_flat_relatives(upstream=True)), t.is_teardown)
            for t in dag.tasks}


@pytest.mark.parametrize("baseline", BASELINES)
def test_baseline_has_the_pipelines_shape(dags, baseline):
    assert _shape(dags[baseline]) == _shape(dags[PIPELINE])


def test_deferred_baseline_defers_where_the_pipeline_does(dags):
    deferring = {t.task_id for t in dags["ultracluster_bench_noop_deferred"].tasks if type(t).__name__ == "DeferOnce"}
    assert deferring == DEFERRED
    assert not any(type(t).__name__ == "DeferOnce" for t in dags["ultracluster_bench_noop"].tasks)


def test_exact_time_trigger_ends_the_task_at_its_moment(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH_DAGS))
    sys.modules.pop("ultracluster_bench_noop", None)
    import ultracluster_bench_noop as baseline
    from airflow.sdk import timezone
    from airflow.triggers.base import TaskSuccessEvent

    moment = timezone.utcnow() + timedelta(seconds=0.3)
    trigger = baseline.ExactTimeTrigger(moment.isoformat())
    classpath, kwargs = trigger.serialize()
    assert classpath == "ultracluster_bench_noop.ExactTimeTrigger"  # what the triggerer imports
    rebuilt = baseline.ExactTimeTrigger(**kwargs)

    async def first_event():
        async for event in rebuilt.run():
            return event, timezone.utcnow()

    event, fired = asyncio.run(first_event())
    assert isinstance(event, TaskSuccessEvent)
    assert fired >= moment
