"""The job wait's reaction mechanism against a REAL local UltraCluster (Slurm, sshd head node):
the head-node wait command wakes the trigger when the job ends, not when its window does, streams
the progress lines meanwhile, and the whole wait holds one SSH connection."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.integration.test_slurm_side import RUNTIME_READY, make_cluster, wait_for_fleet
from tests.fixtures_localcluster import wait_until_gone

pytestmark = [pytest.mark.localcluster, pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm, sshd")]

JOB = """#!/bin/bash
sleep 3
for i in 1 2 3; do
  echo "UC_PROGRESS step=$i total=3 loss=$((10 - i)).5 lr=0.0001 throughput=1$i.0 eta_s=$((3 - i))"
  sleep 1
done
echo "UC_RESULTS /fsx/jobs/wait/results.json"
"""


def test_a_jobs_end_wakes_the_trigger_without_waiting_for_a_window(uc_home, uc_env, make_cluster_config, pcluster,
                                                                   monkeypatch, tmp_path, capsys):
    from ultracluster import remote_commands as rc
    from ultracluster.hooks.head_node import HeadNodeHook
    from ultracluster.hooks.slurm import SlurmHook
    from ultracluster.triggers.slurm import SlurmJobTrigger

    connections = []
    real_aconnection = HeadNodeHook.aconnection

    @contextlib.asynccontextmanager
    async def counted(self):
        async with real_aconnection(self) as conn:
            connections.append(conn)
            yield conn

    cluster = make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, "jobwait", {})
    try:
        head = wait_for_fleet(cluster, num_nodes=1)["head_node"]
        slurm = SlurmHook(head_node=head)
        slurm.head_node_hook.check(rc.make_dirs("/fsx/jobs/wait"))
        (tmp_path / "job.sh").write_text(JOB)
        slurm.head_node_hook.put_file(str(tmp_path / "job.sh"), "/fsx/jobs/wait/job.sh", mode=0o755)
        job_id = slurm.sbatch(job_dir="/fsx/jobs/wait", script_path="/fsx/jobs/wait/job.sh", num_nodes=1,
                              job_name="uc.wait", comment="wait test", job_env={}, exclusive=False)
        monkeypatch.setattr(HeadNodeHook, "aconnection", counted)
        # A 10-minute window and a 10-minute outer limit... the test's own limit is 3 minutes, so only
        # the job's end can wake the trigger in time.
        trigger = SlurmJobTrigger(head_node=head, ssh_conn_id="ultracluster_head_node", job_id=job_id,
                                  job_dir="/fsx/jobs/wait", log_path=f"/fsx/jobs/wait/slurm-{job_id}.out",
                                  poll_interval=1, wait_window_s=600, outage_timeout=60, progress_log_interval_s=0)

        async def first():
            async for item in trigger.run():
                return item.payload

        event = asyncio.run(asyncio.wait_for(first(), timeout=180))
        assert event["status"] == "success" and event["state"] == "COMPLETED", event
        assert event["last_progress"]["step"] == 3 and event["results_path"] == "/fsx/jobs/wait/results.json"
        out = "".join(capsys.readouterr())  # Airflow logs to stdout, or stderr once a CLI chose it
        assert all(f"UC_PROGRESS step={i}" in out for i in (1, 2, 3)), out[-3000:]
        assert len(connections) == 1, connections
    finally:
        pcluster("delete-cluster", "-n", "jobwait")
        wait_until_gone(uc_env, "jobwait", timeout=120)
