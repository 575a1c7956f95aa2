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
