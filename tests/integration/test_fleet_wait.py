"""The fleet wait's Slurm gate against a REAL local UltraCluster (Slurm, sshd head node): dynamic nodes
that become usable (their job ends) wake the trigger through the head-node wait, on one SSH connection,
with one sinfo round trip and one describe-cluster call, although its poll interval and window are
10 minutes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import pytest

from tests.fixtures_localcluster import wait_until_gone
from tests.integration.test_slurm_side import RUNTIME_READY, make_cluster, wait_for_fleet

pytestmark = [pytest.mark.localcluster, pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm, sshd")]

JOB_DIR = "/fsx/jobs/fleetwait"
# Holds both nodes until the test says go, once the trigger is waiting on the head node.
JOB = f"""#!/bin/bash
while [ ! -e {JOB_DIR}/go ]; do sleep 0.5; done
"""


def test_dynamic_nodes_becoming_usable_wake_the_fleet_trigger_through_the_head_node_wait(
        uc_home, uc_env, make_cluster_config, pcluster, monkeypatch, tmp_path):
    from ultracluster import remote_commands as rc
    from ultracluster.hooks.head_node import HeadNodeHook
    from ultracluster.hooks.parallelcluster import ParallelClusterHook
    from ultracluster.hooks.slurm import SlurmHook
    from ultracluster.triggers.fleet import ComputeFleetTrigger

    cluster = make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, "fleetwait", {},
                           static=0, dynamic=2)
    try:
        ready = wait_for_fleet(cluster, num_nodes=2)
        assert ready["status"] == "success", ready
        head = ready["head_node"]
        slurm = SlurmHook(head_node=head)
        slurm.head_node_hook.check(rc.make_dirs(JOB_DIR))
        (tmp_path / "job.sh").write_text(JOB)
        slurm.head_node_hook.put_file(str(tmp_path / "job.sh"), f"{JOB_DIR}/job.sh", mode=0o755)
        job_id = slurm.sbatch(job_dir=JOB_DIR, script_path=f"{JOB_DIR}/job.sh", num_nodes=2, job_name="uc.fleetwait",
                              comment="fleet wait test", job_env={})
        deadline = time.monotonic() + 120
        while [job.state for job in slurm.squeue_job(job_id)] != ["RUNNING"]:
            assert time.monotonic() < deadline, slurm.squeue_job(job_id)
            time.sleep(0.5)

        calls = {"connections": 0, "sinfo": 0, "waits": [], "describe": 0}
        real_aconnection, real_sinfo = HeadNodeHook.aconnection, SlurmHook.asinfo_text
        real_wait, real_describe = SlurmHook.await_nodes_change, ParallelClusterHook.adescribe_cluster

        @contextlib.asynccontextmanager
        async def counted_connection(self):
            async with real_aconnection(self) as conn:
                calls["connections"] += 1
                yield conn

        async def counted_sinfo(self, *args, **kwargs):
            calls["sinfo"] += 1
            return await real_sinfo(self, *args, **kwargs)

        async def counted_wait(self, partition, seen, *, conn, **kwargs):
            if not calls["waits"]:  # the trigger waits on the head node: let the job end
                await conn.run(f"touch {JOB_DIR}/go", check=True)
            calls["waits"].append(seen)
            return await real_wait(self, partition, seen, conn=conn, **kwargs)

        async def counted_describe(self, name):
            calls["describe"] += 1
            return await real_describe(self, name)

        monkeypatch.setattr(HeadNodeHook, "aconnection", counted_connection)
        monkeypatch.setattr(SlurmHook, "asinfo_text", counted_sinfo)
        monkeypatch.setattr(SlurmHook, "await_nodes_change", counted_wait)
        monkeypatch.setattr(ParallelClusterHook, "adescribe_cluster", counted_describe)
        # A 10-minute poll interval and window; the test's own limit is 3 minutes.
        trigger = ComputeFleetTrigger(cluster_name=cluster.name, num_nodes=2, partition=None,
                                      pcluster_conn_id="pcluster_default", ssh_conn_id="ultracluster_head_node",
                                      ssh_port=int(os.environ.get("LOCAL_UC_SSH_PORT", "2222")),
                                      host_key=head["host_key"], host_key_cluster=ready["host_key_cluster"],
                                      poke_interval=600, wait_window_s=600)

        async def first():
            async for event in trigger.run():
                return event.payload

        event = asyncio.run(asyncio.wait_for(first(), timeout=180))
        assert event["status"] == "success" and event["head_node"]["host_key"] == head["host_key"], event
        assert calls["connections"] == 1 and calls["sinfo"] == 1 and calls["describe"] == 1, calls
        # The first wait started from the busy nodes the trigger judged; a change ended each wait.
        assert calls["waits"] and "alloc" in calls["waits"][0], calls["waits"]
    finally:
        pcluster("delete-cluster", "-n", "fleetwait")
        wait_until_gone(uc_env, "fleetwait", timeout=120)
