"""Fixtures shared by the unit tests."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def slurm_stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Remote commands name Slurm's programs by absolute path (/opt/slurm/bin on a ParallelCluster node):
    point that directory at ``tmp_path/bin``, where tests put their stand-in sbatch, srun, squeue, sinfo."""
    from ultracluster.remote_commands import slurm

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    monkeypatch.setattr(slurm, "SLURM_BIN", str(bin_dir))
    return bin_dir


@pytest.fixture
def pushed(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The XComs a trigger pushes when it ends its task (triggers.task_end: through the Task SDK, which
    the triggerer's supervisor serves): key -> value as JSON carries it."""
    import json

    from ultracluster.triggers import task_end

    values: dict = {}

    class Recorder:
        @staticmethod
        async def aset(key, value, *, dag_id, task_id, run_id, map_index=-1):
            assert (dag_id, task_id, map_index) and run_id
            values[key] = json.loads(json.dumps(value))

    monkeypatch.setattr(task_end, "XCom", Recorder)
    monkeypatch.setitem(task_end._warmed, "done", True)  # no execution API here to warm up
    return values
