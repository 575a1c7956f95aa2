"""A cancelled training job leaves Slurm on SIGTERM, not on KillWait's SIGKILL, against a REAL local
UltraCluster: the real run script and training program (tiny BERT on CPU) on 2 nodes, submitted with
the product's sbatch, cancelled with the product's scancel while it makes progress.

slurmstepd signals a cancelled step's processes with SIGTERM and, KillWait (30 s, ParallelCluster's
default too) later, with SIGKILL; the job stays COMPLETING meanwhile, its nodes held. The run script
and the program must end on the SIGTERM: the job's processes are gone, and every node's log says the
script stopped its launcher on SIGTERM, before slurmstepd would have had to escalate.

Run (root; about a minute): flock /tmp/uc-e2e.lock .venvs/airflow/bin/python -m pytest -q -s \
    tests/integration/test_kill_slurm.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.fixtures_localcluster import wait_until_gone
from tests.integration.test_auto_resume_slurm import DATA_DIR, REPO, RUNTIME_READY, TRAINING_PYTHON
from tests.integration.test_slurm_side import make_cluster, wait_for_fleet

pytestmark = [pytest.mark.localcluster, pytest.mark.skipif(
    not RUNTIME_READY, reason="needs root, Slurm, sshd, .venvs/training and the local dataset")]

NAME = "killjob"
JOB_DIR = "/fsx/jobs/killjob"
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED"}
# The run script, the training program and its pretrain_* modules.
FILES = ("run_dp_bert_large_hf_pretrain_bf16_s128.sh", "dp_bert_large_hf_pretrain_hdf5.py",
         *sorted(p.name for p in (REPO / "include" / "training").glob("pretrain_*.py")))


def job_processes(marker: str) -> dict[int, str]:
    """This machine's processes (every local node's) whose command line names the job directory."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if marker in cmdline and "pytest" not in cmdline:
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found[int(entry.name)] = f"state={stat[0]} ppid={stat[1]} {cmdline[:140]}"
    return found


def progress_lines(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(line.startswith("UC_PROGRESS ") for line in log.read_text(errors="replace").splitlines())


def test_a_cancelled_training_job_ends_on_sigterm(uc_home, uc_env, make_cluster_config, pcluster, monkeypatch):
    from ultracluster import remote_commands as rc
    from ultracluster.hooks.slurm import SlurmHook

    cluster = make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, NAME, {})
    try:
        event = wait_for_fleet(cluster, num_nodes=2)
        assert event["status"] == "success", event
        slurm = SlurmHook(head_node=event["head_node"])
        cluster_dir = uc_home / "clusters" / NAME
        fsx = Path(json.loads((cluster_dir / "runtime.json").read_text())["shared_dirs"]["/fsx"])
        slurm.head_node_hook.check(rc.make_dirs(JOB_DIR))
        for name in FILES:
            slurm.head_node_hook.put_file(str(REPO / "include" / "training" / name), f"{JOB_DIR}/{name}", mode=0o755)
        job_id = slurm.sbatch(
            job_dir=JOB_DIR, script_path=f"{JOB_DIR}/{FILES[0]}", num_nodes=2, job_name="uc.killjob",
            comment="kill test",
            job_env={"MODEL_SIZE": "tiny", "BATCH_SIZE": "8", "WARMUP_STEPS": "5", "TORCH_NUM_THREADS": "1",
                     "GRAD_ACCUM_USTEPS": "2", "MAX_STEPS": "100000", "STEPS_PER_CKPT": "5",
                     "DATA_DIR": str(DATA_DIR), "TRAINING_PYTHON": str(TRAINING_PYTHON),
                     "COMPILE_CACHE_DIR": f"{JOB_DIR}/compile_cache"})
        host_dir = fsx / "jobs" / NAME
        slurm_log = host_dir / f"slurm-{job_id}.out"
        deadline = time.monotonic() + 240
        while progress_lines(slurm_log) < 7:  # training, past its first checkpoint (step 5)
            assert time.monotonic() < deadline, slurm_log.read_text(errors="replace") if slurm_log.exists() else "no log"
            time.sleep(0.5)
        assert job_processes(JOB_DIR)  # what the test looks for is there while the job runs

        slurm.scancel(job_id)
        cancelled = time.monotonic()
        states = []
        while True:
            queued = slurm.squeue_job(job_id)
            now = round(time.monotonic() - cancelled, 2)
            states.append((now, [q.state for q in queued]))
            if not any(q.state in ACTIVE for q in queued):  # default squeue hides it now
                break
            assert now < 120, states
            time.sleep(0.3)
        # A figure for whoever reads the run, not a check.
        print(f"scancel to leaving squeue: {states[-1][0]} s; states {states}")
        left = job_processes(JOB_DIR)
        text = slurm_log.read_text(errors="replace")
        print("left:", left, "\nslurm log:", text[-2000:])
        # Gone with the job: before the fix bash died on the SIGTERM and torchrun, orphaned, outlived it.
        assert left == {}
        assert states[-1][1] == ["CANCELLED"]
        # Each node's script stopped its launcher on slurmstepd's SIGTERM and waited for it.
        for node in (0, 1):
            assert f"UC_INFO node={node} got SIGTERM: stopping the launcher" in text
        # The newest checkpoint is complete: one is only ever renamed into place once written.
        checkpoints = list((host_dir / f"output_{job_id}" / "checkpoints").glob("ckpt_*.pt"))
        assert checkpoints and all(path.stat().st_size > 0 for path in checkpoints)
    finally:
        pcluster("delete-cluster", "-n", NAME)
        wait_until_gone(uc_env, NAME, timeout=120)
