"""The fleet wait's Slurm gate against a REAL local UltraCluster (Slurm, sshd head node): dynamic nodes
that become usable (their job ends) wake the trigger through the head-node wait, on one SSH connection,
with one sinfo round trip and one describe-cluster call, although its poll interval and window are
10 minutes; and an outage of the head node's sshd during that wait is ridden out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures_localcluster import LOCALCLUSTER_PYTHON, wait_until_gone
from tests.integration.test_slurm_side import RUNTIME_READY, make_cluster, wait_for_fleet

pytestmark = [pytest.mark.localcluster, pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm, sshd")]

JOB_DIR = "/fsx/jobs/fleetwait"
# Holds both nodes until the test says go, once the trigger is waiting on the head node.
JOB = f"""#!/bin/bash
while [ ! -e {JOB_DIR}/go ]; do sleep 0.5; done
"""


def _hold_nodes(slurm, job_dir: str, script: str, num_nodes: int, tmp_path) -> str:
    """Submit ``script`` on ``num_nodes`` nodes from ``job_dir``; its job id once it runs."""
    from ultracluster import remote_commands as rc

    slurm.head_node_hook.check(rc.make_dirs(job_dir))
    (tmp_path / "job.sh").write_text(script)
    slurm.head_node_hook.put_file(str(tmp_path / "job.sh"), f"{job_dir}/job.sh", mode=0o755)
    job_id = slurm.sbatch(job_dir=job_dir, script_path=f"{job_dir}/job.sh", num_nodes=num_nodes,
                          job_name="uc.fleetwait", comment="fleet wait test", job_env={})
    deadline = time.monotonic() + 120
    while [job.state for job in slurm.squeue_job(job_id)] != ["RUNNING"]:
        assert time.monotonic() < deadline, slurm.squeue_job(job_id)
        time.sleep(0.5)
    return job_id


def test_dynamic_nodes_becoming_usable_wake_the_fleet_trigger_through_the_head_node_wait(
        uc_home, uc_env, make_cluster_config, pcluster, monkeypatch, tmp_path):
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
        _hold_nodes(slurm, JOB_DIR, JOB, 2, tmp_path)

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


def test_the_fleet_wait_rides_out_a_head_node_sshd_outage(uc_home, uc_env, make_cluster_config, pcluster,
                                                          monkeypatch, tmp_path, capsys):
    """The fleet trigger waits on the head node for a node a job holds; sshd goes down (its sessions
    killed), the trigger finds the head node unreachable and keeps waiting, sshd comes back, the job
    ends, and the trigger reports the fleet ready on the pinned host key.

    No timing: the job holds its node until the test releases it after sshd is back, and the outage
    lasts until the test has seen the trigger fail to reach the head node (the fault reports when
    sshd went down and came back, run/faults/ssh-outage.json)."""
    from ultracluster.hooks.slurm import SlurmHook
    from ultracluster.triggers.fleet import ComputeFleetTrigger

    name, job_dir = "fleetoutage", "/fsx/jobs/fleetoutage"
    cluster = make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, name, {}, static=0, dynamic=1)
    cluster_dir = uc_home / "clusters" / name
    fsx = Path(json.loads((cluster_dir / "runtime.json").read_text())["shared_dirs"]["/fsx"])
    report, release = cluster_dir / "run" / "faults" / "ssh-outage.json", tmp_path / "release-sshd"
    outage = None
    try:
        ready = wait_for_fleet(cluster, num_nodes=1)
        assert ready["status"] == "success", ready
        head = ready["head_node"]
        slurm = SlurmHook(head_node=head)
        job_id = _hold_nodes(slurm, job_dir, f"#!/bin/bash\nwhile [ ! -e {job_dir}/release ]; do sleep 0.2; done\n",
                             1, tmp_path)
        trigger = ComputeFleetTrigger(cluster_name=name, num_nodes=1, partition=None,
                                      pcluster_conn_id="pcluster_default", ssh_conn_id="ultracluster_head_node",
                                      ssh_port=int(os.environ.get("LOCAL_UC_SSH_PORT", "2222")),
                                      host_key=head["host_key"], host_key_cluster=ready["host_key_cluster"],
                                      poke_interval=1, wait_window_s=600)
        seen: list[str] = []

        def reported(state: str) -> bool:
            return report.exists() and json.loads(report.read_text())["state"] == state

        def logged(text: str) -> bool:
            seen.append("".join(capsys.readouterr()))  # the trigger logs to stdout (or stderr)
            return text in "".join(seen)

        first = None

        async def until(condition, what: str) -> None:
            while not condition():
                assert outage is None or outage.poll() is None or reported("up"), \
                    f"the outage ended early: {outage.stdout.read()}"
                # Unreachable is pending, not an end: the trigger fires only once the node is free.
                assert not first.done(), f"the trigger ended before {what}: {first.result().payload}"
                await asyncio.sleep(0.2)
            seen.append(f"<{what}>")

        async def drive() -> dict:
            nonlocal outage, first
            first = asyncio.ensure_future(anext(trigger.run()))
            await until(lambda: logged("Waiting:"), "trigger waits on the head node")
            outage = subprocess.Popen([str(LOCALCLUSTER_PYTHON), "-m", "localcluster.runtime.agent", str(cluster_dir),
                                       "ssh-outage-now", "--release", str(release)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            await until(lambda: reported("down"), "sshd down")
            await until(lambda: logged("head node not reachable over SSH"), "trigger met the outage")
            release.touch()
            await until(lambda: reported("up"), "sshd up")
            (fsx / "jobs" / "fleetoutage" / "release").touch()  # the node frees only after sshd is back
            return (await asyncio.wait_for(first, timeout=300)).payload

        # Each step waits for the one before; the bound only keeps a broken run from hanging.
        event = asyncio.run(asyncio.wait_for(drive(), timeout=600))
        assert event["status"] == "success" and event["head_node"]["host_key"] == head["host_key"], event
        times = json.loads(report.read_text())
        assert times["state"] == "up" and times["down_at"] < times["up_at"]
        assert outage.wait(timeout=60) == 0
        held = [job.state for job in SlurmHook(head_node=head).squeue_job(job_id)]  # a new connection: sshd restarted
        assert "RUNNING" not in held, f"ready while the job still held the node: {held}"
    finally:
        release.touch()
        if outage is not None and outage.poll() is None:
            outage.wait(timeout=60)
        pcluster("delete-cluster", "-n", name)
        wait_until_gone(uc_env, name, timeout=120)
