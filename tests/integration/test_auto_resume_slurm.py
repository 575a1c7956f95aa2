"""Auto-resume against a REAL local UltraCluster: the real training program (tiny BERT on CPU, 2 nodes)
runs under SlurmJobOperator; the cluster's kill-node fault kills a node mid-run (Slurm ends the job
NODE_FAIL and the node is replaced, as clustermgtd would). The operator waits for the fleet with the
wait_for_fleet trigger, resubmits from the newest checkpoint, and the task succeeds with the whole
step count, no finished step before that checkpoint trained again, and exactly one extra sbatch as
slurmctld logged it.

Run (root; a few minutes): flock /tmp/uc-e2e.lock .venvs/airflow/bin/python -m pytest -q \
    tests/integration/test_auto_resume_slurm.py
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures_localcluster import wait_until_gone
from tests.integration.test_slurm_side import make_cluster

REPO = Path(__file__).resolve().parents[2]
TRAINING_PYTHON = REPO / ".venvs" / "training" / "bin" / "python"
DATA_DIR = Path(os.environ.get("UC_TRAINING_DATASET_CACHE", "/var/lib/local-ultracluster/dataset")) / (
    "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128")
RUNTIME_READY = (os.geteuid() == 0 and bool(shutil.which("slurmctld")) and Path("/usr/sbin/sshd").exists()
                 and TRAINING_PYTHON.exists() and any(DATA_DIR.glob("*_training_*.hdf5")))
pytestmark = [pytest.mark.localcluster, pytest.mark.skipif(
    not RUNTIME_READY, reason="needs root, Slurm, sshd, .venvs/training and the local dataset")]

NAME = "autoresume"
MAX_STEPS = 200
# The node dies this long after the job starts: past the program's start-up and first checkpoints,
# well before its MAX_STEPS (a tiny step takes a fraction of a second).
KILL_AFTER_S = 30
PROGRESS = re.compile(r"^UC_PROGRESS step=(\d+) ")


class Store(dict):
    def set(self, key, value, **_):
        self[key] = value


@pytest.fixture
def cluster(uc_home, uc_env, make_cluster_config, pcluster, monkeypatch):
    make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, NAME,
                 {"local-ultracluster:kill-node-after": str(KILL_AFTER_S)})
    cluster_dir = uc_home / "clusters" / NAME
    fsx = Path(json.loads((cluster_dir / "runtime.json").read_text())["shared_dirs"]["/fsx"])
    yield SimpleNamespace(dir=cluster_dir, fsx=fsx)
    pcluster("delete-cluster", "-n", NAME)
    wait_until_gone(uc_env, NAME, timeout=120)


def head_node() -> dict:
    from ultracluster.triggers.fleet import ComputeFleetTrigger

    trigger = ComputeFleetTrigger(cluster_name=NAME, num_nodes=2, partition=None, pcluster_conn_id="pcluster_default",
                                  ssh_conn_id="ultracluster_head_node",
                                  ssh_port=int(os.environ.get("LOCAL_UC_SSH_PORT", "2222")), poke_interval=1)

    async def first():
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(asyncio.wait_for(first(), timeout=180))
    assert event["status"] == "success", event
    return event["head_node"]


def submissions(cluster_dir: Path) -> int:
    """sbatch submissions slurmctld accepted, from its own log."""
    text = (cluster_dir / "log" / "slurmctld.log").read_text(errors="replace")
    return sum("_slurm_rpc_submit_batch_job" in line for line in text.splitlines())


def steps(log: Path) -> list[int]:
    return [int(m.group(1)) for line in log.read_text(errors="replace").splitlines()
            if (m := PROGRESS.match(line.strip()))]


def test_train_resumes_after_a_node_dies(cluster, capsys):
    from ultracluster.operators.slurm import SlurmJobOperator

    job_dir = "/fsx/jobs/autoresume"
    op = SlurmJobOperator(
        task_id="train", head_node=head_node(), job_dir=job_dir, num_nodes=2,
        job_env={"MODEL_SIZE": "tiny", "BATCH_SIZE": "8", "WARMUP_STEPS": "5", "LR": "0.001", "TORCH_NUM_THREADS": "1",
                 "GRAD_ACCUM_USTEPS": "2", "SCALING_MODE": "strong", "MAX_STEPS": str(MAX_STEPS),
                 "STEPS_THIS_RUN": str(MAX_STEPS), "STEPS_PER_CKPT": "10", "NUM_CKPTS_TO_KEEP": "2",
                 "DATA_DIR": str(DATA_DIR), "TRAINING_PYTHON": str(TRAINING_PYTHON),
                 "COMPILE_CACHE_DIR": f"{job_dir}/compile_cache"},
        training_files_dir=str(REPO / "include" / "training"), deferrable=False, poll_interval=1,
        auto_resume_attempts=2, pcluster_conn_id="pcluster_default", region_name="us-east-1")
    store = Store()
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id="manual__autoresume", task_id="train", map_index=-1,
                         xcom_push=lambda **_: None)
    result = op.execute({"ti": ti, "task_state_store": store})
    out = "".join(capsys.readouterr())  # Airflow logs to stdout, or stderr once a CLI chose it

    # One resume, and it is what the head node saw: exactly one sbatch more than the first.
    assert submissions(cluster.dir) == 2
    (resume,) = result["auto_resume"]["history"]
    print("auto-resume:", json.dumps(resume))  # what the kill hit, for whoever reads the run
    failed, resumed, from_step = resume["failed_job_id"], result["job_id"], resume["from_step"]
    assert resume["state"] == "NODE_FAIL" and resume["job_id"] == resumed != failed
    assert f"Auto-resume 1 of 2: job {failed} ended NODE_FAIL at step {resume['last_step']}; " \
           f"resuming from step {from_step} " in out

    # The failed job: the checkpoint resumed from is its newest, and the steps past it are the ones lost.
    host = cluster.fsx / "jobs" / "autoresume"
    failed_steps = steps(host / f"slurm-{failed}.out")
    assert failed_steps and failed_steps[-1] == resume["last_step"] < MAX_STEPS
    checkpoints = sorted(int(p.stem.split("_")[1]) for p in (host / f"output_{failed}" / "checkpoints").glob("ckpt_*.pt"))
    assert from_step == (checkpoints[-1] if checkpoints else 0) and from_step % 10 == 0
    assert resume["steps_lost"] == resume["last_step"] - from_step

    # The resumed job trains every step after the checkpoint, once, up to the whole count.
    assert steps(host / f"slurm-{resumed}.out") == list(range(from_step + 1, MAX_STEPS + 1))
    results = json.loads((host / f"output_{resumed}" / "results.json").read_text())["results"]["parameters"]
    assert (results["Start step"], results["End step"]) == (from_step, MAX_STEPS)
    assert results["Auto resume"]["resumes"] == 1 and results["Auto resume"]["steps_lost"] == resume["steps_lost"]
    if from_step:
        assert results["Resumed from"].endswith(f"output_{failed}/checkpoints/ckpt_{from_step}.pt")

    # A retry of the task now (a worker crash after the end) reattaches to the resumed job: no third sbatch.
    again = op.execute({"ti": ti, "task_state_store": store})
    assert again["job_id"] == resumed and submissions(cluster.dir) == 2
