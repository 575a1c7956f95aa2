"""bench/_first_step.py: a run's records turned into its time to first step, by phase (no timings
are asserted: the records here are made up, and the breakdown must account for every second)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _first_step as fs  # noqa: E402

T0 = 1_800_000_000.0  # the trigger


def results(at: str | None, seconds: float | None) -> dict:
    first = {"MetricName": "First step", "MeasuredValue": seconds, "Units": "seconds",
             "AdditionalData": {"at": at, "step": 1}}
    return {"results": {"parameters": {}, "metrics": [{"MetricName": "Loss", "MeasuredValue": 9.0}, first]}}


def ti(start: float, end: float) -> dict:
    return {"state": "success", "start": T0 + start, "end": T0 + end}


def record(**changes) -> dict:
    """A run: tasks one after another with a 1 s hop before each, train's job submitted at +41.5,
    started (Slurm, whole seconds) at +45, its training loop at +50, the first step done at +52.25."""
    tis = {"preflight": ti(2, 4), "create_vpc": ti(5, 7), "render_config": ti(8, 10), "pcluster_create": ti(11, 20),
           "wait_for_fleet": ti(21, 23), "download_data": ti(24, 27), "restore_compile_cache": ti(24, 25),
           "restore_checkpoint": ti(24, 24.5), "parallel_compile": ti(28, 40), "train": ti(41, 60)}
    first_step_at = "2027-01-15T08:00:52.250+00:00"  # T0 + 52.25
    r = {"queued": T0, "start": T0 + 1, "tis": tis,
         "logs": {"train": [(T0 + 41.2, "Submitted Slurm job 3 (uc-train, 1 node(s)); log /fsx/slurm-3.out"),
                            (T0 + 41.5, "Submitted Slurm job 4 (uc-train, 1 node(s)); log /fsx/slurm-4.out")]},
         "jobs": {"4": {"submit": T0 + 41, "start": T0 + 45, "end": T0 + 58}},
         "first_step": fs.first_step_mark(results(first_step_at, 2.25))}
    r.update(changes)
    return r


def test_the_first_step_is_read_from_results_json():
    mark = fs.first_step_mark(results("2027-01-15T08:00:52.250+00:00", 2.25))
    assert mark == {"at": T0 + 52.25, "loop_start": T0 + 50.0}
    assert fs.first_step_mark(results(None, None)) is None  # no step ran
    assert fs.first_step_mark({"results": {"metrics": []}}) is None and fs.first_step_mark(None) is None


def test_the_phases_partition_trigger_to_first_step():
    breakdown = fs.phases(record())
    got = [(p["phase"], p["s"], p["hop_s"]) for p in breakdown["phases"]]
    assert got == [
        ("queued (trigger to the run's start)", 1.0, None),
        ("preflight", 3.0, 1.0), ("network (create_vpc)", 3.0, 1.0), ("config (render_config)", 3.0, 1.0),
        ("cluster (pcluster_create)", 10.0, 1.0), ("fleet (wait_for_fleet)", 3.0, 1.0),
        ("data and caches", 4.0, 1.0),  # ends with the last of the three, download_data
        ("compile (parallel_compile)", 13.0, 1.0),
        (fs.TRAIN_PHASES[0], 1.5, 1.0),  # the last submission: the job that trained
        (fs.TRAIN_PHASES[1], 3.5, None), (fs.TRAIN_PHASES[2], 5.0, None), (fs.TRAIN_PHASES[3], 2.25, None)]
    assert breakdown["total_s"] == pytest.approx(52.25) == pytest.approx(sum(p[1] for p in got))


@pytest.mark.parametrize("change, missing", [
    ({"queued": None}, "trigger time"),
    ({"first_step": None}, "job start to training loop"),
    ({"logs": {}}, "task start to sbatch"),
    ({"jobs": {}}, "sbatch to job start"),
])
def test_a_missing_mark_is_named(change, missing):
    with pytest.raises(fs.MissingMark, match=missing):
        fs.phases(record(**change))


def test_a_stage_with_a_task_still_unended_has_no_end():
    tis = {**record()["tis"], "restore_checkpoint": {"state": "running", "start": T0 + 24, "end": None}}
    with pytest.raises(fs.MissingMark, match="data and caches"):
        fs.phases(record(tis=tis))
