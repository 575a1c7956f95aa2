"""Fixtures for the training tests: the training venv, the local dataset, a data dir to vary."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.training.support import DATASET_NAME, REPO, TRAINING_PYTHON


@pytest.fixture(scope="session")
def training_python() -> Path:
    if not TRAINING_PYTHON.exists():
        pytest.skip(f"{TRAINING_PYTHON} missing: run scripts/setup_training_venv.sh")
    return TRAINING_PYTHON


@pytest.fixture(scope="session")
def dataset_cache(training_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local dataset, built once per session (or reused from UC_TRAINING_DATASET_CACHE)."""
    cache = Path(os.environ.get("UC_TRAINING_DATASET_CACHE") or tmp_path_factory.mktemp("dataset"))
    done = subprocess.run(["bash", str(REPO / "scripts" / "build_local_dataset.sh"), str(cache)],
                          env={**os.environ, "TRAINING_PYTHON": str(training_python)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(cache / f"{DATASET_NAME}.tar")
    return cache


@pytest.fixture(scope="session")
def data_dir(dataset_cache: Path) -> Path:
    return dataset_cache / DATASET_NAME


@pytest.fixture
def few_shards(data_dir: Path, tmp_path: Path):
    """A data dir holding only the first n shards of the local dataset."""
    def make(n: int) -> Path:
        target = tmp_path / f"shards-{n}"
        target.mkdir()
        for shard in sorted(data_dir.glob("*_training_*.hdf5"))[:n]:
            shutil.copy(shard, target / shard.name)
        return target
    return make
