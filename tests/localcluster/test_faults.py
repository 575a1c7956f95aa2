"""Fault knobs of the local UltraCluster (docs/contracts.md), each with real daemons."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

try:
    from test_runtime import (LOCALCLUSTER_PYTHON, SLURM_BIN, UcHome, assert_cluster_gone, pytestmark,
                              run_over_ssh, sbatch_job_id, spec_dict, ssh_hook, uc_home)
except ImportError:   # if tests/localcluster becomes a package
    from tests.localcluster.test_runtime import (LOCALCLUSTER_PYTHON, SLURM_BIN, UcHome, assert_cluster_gone,
                                                 pytestmark, run_over_ssh, sbatch_job_id, spec_dict, ssh_hook,
                                                 uc_home)

__all__ = ["pytestmark", "uc_home", "LOCALCLUSTER_PYTHON"]

ICE_REASON = "(Code:InsufficientInstanceCapacity)Failure when resuming nodes"


def node_field(cluster, node: str, field: str) -> str:
    out = cluster.slurm("scontrol", "show", "node", node)
    # Reason=... runs to the end of its line and may hold spaces.
    for line in out.splitlines():
        line = line.strip()
        if line.startswith(field + "="):
            return line.split("=", 1)[1].split(" [")[0]
        for token in line.split():
            if token.startswith(field + "="):
                return token.split("=", 1)[1]
    raise AssertionError(f"{field} not in {out}")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def test_insufficient_capacity_leaves_the_node_down_with_pcluster_reason(uc_home: UcHome) -> None:
    queues = [{"name": "compute1", "compute_resources": [
        {"name": "trn1", "instance_type": "trn1.32xlarge", "min_count": 0, "max_count": 1},
        {"name": "trn1b", "instance_type": "trn1.2xlarge", "min_count": 0, "max_count": 1}]}]
    cluster = uc_home.provision(spec_dict("ft-ice", queues=queues, faults={"insufficient_capacity": ["trn1"]}))
    denied, allowed = "compute1-dy-trn1-1", "compute1-dy-trn1b-1"

    job_id = sbatch_job_id(cluster.slurm("sbatch", "--constraint", "trn1", "--output", "/dev/null",
                                         "--wrap", "hostname"))
    wait_for(lambda: cluster.node_states()[denied].startswith("down"), 60, "the denied node to go down")
    assert node_field(cluster, denied, "Reason") == ICE_REASON
    state = cluster.wait_job_state(job_id, {"NODE_FAIL", "PENDING", "FAILED", "CANCELLED"}, timeout=60)
    assert state != "COMPLETED"
    assert [i["nodeType"] for i in cluster.describe()["instances"]] == ["HeadNode"]

    # Other compute resources still launch.
    job_id = sbatch_job_id(cluster.slurm("sbatch", "--constraint", "trn1b", "--output", "/dev/null",
                                         "--wrap", "hostname"))
    cluster.wait_job_state(job_id, {"COMPLETED"}, timeout=120)
    assert cluster.job_field(job_id, "NodeList") == allowed
    assert cluster.node_states()[denied].startswith("down")

    cluster.teardown()
    assert_cluster_gone(cluster)


def test_insufficient_capacity_is_held_then_the_nodes_launch_again(uc_home: UcHome) -> None:
    """clustermgtd's insufficient-capacity hold, as ParallelCluster's: the failed node stays down, the
    resource's powered-down node is disabled with the code, and after insufficient_capacity_timeout both
    are powered down (idle~), so the next job launches again (and fails again while capacity lacks)."""
    hold_s = 8
    cluster = uc_home.provision(spec_dict("ft-icehold", min_count=0, max_count=2, faults={
        "insufficient_capacity": ["trn1"], "insufficient_capacity_timeout": hold_s}))
    failed, sibling = "compute1-dy-trn1-1", "compute1-dy-trn1-2"

    def launch_and_fail() -> None:
        job_id = sbatch_job_id(cluster.slurm("sbatch", "--output", "/dev/null", "--wrap", "hostname"))
        assert cluster.wait_job_state(job_id, {"NODE_FAIL", "FAILED", "CANCELLED", "COMPLETED"}, timeout=60) == "NODE_FAIL"
        assert cluster.job_field(job_id, "NodeList") == failed

    launch_and_fail()
    assert cluster.node_states()[failed].startswith("down") and node_field(cluster, failed, "Reason") == ICE_REASON
    disabled = "(Code:InsufficientInstanceCapacity)Temporarily disabling node due to insufficient capacity"
    wait_for(lambda: disabled in cluster.slurm("scontrol", "show", "node", sibling), hold_s, "the sibling to be disabled")
    assert cluster.node_states()[sibling].startswith("down")
    wait_for(lambda: all(cluster.node_states()[n] == "idle~" for n in (failed, sibling)), hold_s + 60,
             "both nodes back in power saving")
    log = (cluster.dir / "log" / "power.log").read_text()
    assert log.count("insufficient capacity") == 1, log
    launch_and_fail()   # launched again: denied again
    assert (cluster.dir / "log" / "power.log").read_text().count("insufficient capacity") == 2
    cluster.teardown()
    assert_cluster_gone(cluster)


def test_kill_node_after_fails_the_running_job_and_the_node_is_replaced(uc_home: UcHome) -> None:
    cluster = uc_home.provision(spec_dict("ft-kill", min_count=2, max_count=2, faults={"kill_node_after": 3}))
    # A job that ends before the deadline is spared; the fault waits for the next one.
    short_job = sbatch_job_id(cluster.slurm("sbatch", "--output", "/dev/null", "--wrap", "true"))
    assert cluster.wait_job_state(short_job, {"COMPLETED", "NODE_FAIL"}, timeout=60) == "COMPLETED"
    job_id = sbatch_job_id(cluster.slurm("sbatch", "--nodes", "2", "--output", "/dev/null",
                                         "--wrap", f"{SLURM_BIN}/srun sleep 120"))
    cluster.wait_job_state(job_id, {"RUNNING"}, timeout=60)
    first_node = cluster.slurm("scontrol", "show", "hostnames", cluster.job_field(job_id, "NodeList")).split()[0]

    assert cluster.wait_job_state(job_id, {"NODE_FAIL"}, timeout=90) == "NODE_FAIL"
    agent_log = (cluster.dir / "log" / "agent.log").read_text()
    assert f"killed {first_node} (job {job_id})" in agent_log
    controller_log = (cluster.dir / "log" / "slurmctld.log").read_text()
    assert f"update_node: node {first_node} reason set to: Node failure: instance terminated" in controller_log
    assert f"update_node: node {first_node} state set to DOWN" in controller_log

    # Like clustermgtd replacing an unhealthy static node, it comes back once; no second kill.
    wait_for(lambda: cluster.node_states()[first_node] == "idle", 90, f"{first_node} to be replaced")
    job_id = sbatch_job_id(cluster.slurm("sbatch", "--nodes", "2", "--output", "/dev/null", "--wrap", f"{SLURM_BIN}/srun sleep 5"))
    assert cluster.wait_job_state(job_id, {"COMPLETED", "NODE_FAIL"}, timeout=90) == "COMPLETED"

    cluster.teardown()
    assert_cluster_gone(cluster)


def processes_in_uts_of(cluster, daemon: str) -> list[str]:
    """Command lines of the processes in the UTS namespace of one of the cluster's daemons."""
    daemons = json.loads((cluster.dir / "run" / "daemons.json").read_text())
    uts = daemons[daemon]["uts_ns"]
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}/ns/uts").st_ino == uts:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def raw_cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""   # exited meanwhile


def uts_of(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/uts").st_ino
    except OSError:
        return None


def running(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ssh_reachable(cluster) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((cluster.head_ip, cluster.ssh_port)) == 0


def test_ssh_outage_stops_and_restarts_sshd_with_the_same_host_key(uc_home: UcHome,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow.providers.ssh.hooks.ssh  # noqa: F401  (slow first import; not inside the window)
    cluster = uc_home.provision(spec_dict("ft-ssh", min_count=1, max_count=1, faults={"ssh_outage": [10, 8]}))
    hook = ssh_hook(cluster, monkeypatch, conn_retry_attempts=1)
    host_key_before = (cluster.dir / "ssh" / "ssh_host_ed25519_key.pub").read_text()

    # Something left running on the head node (like a detached job runner) outlives the outage.
    run_over_ssh(hook, "nohup sleep 300 > /dev/null 2>&1 &")
    hook.client = None
    wait_for(lambda: not ssh_reachable(cluster), 60, "sshd to go away", interval=0.2)
    assert any("sleep 300" in p for p in processes_in_uts_of(cluster, "sshd"))
    # This cluster's sleep only: another test's cluster may run one too (`make test` runs two at once).
    uts = json.loads((cluster.dir / "run" / "daemons.json").read_text())["sshd"]["uts_ns"]
    left_behind = [pid for pid in filter(str.isdigit, os.listdir("/proc"))
                   if b"sleep\x00300" in raw_cmdline(pid) and uts_of(pid) == uts]
    with pytest.raises(OSError):   # paramiko NoValidConnectionsError: connection refused
        hook.get_conn()
    wait_for(lambda: ssh_reachable(cluster), 60, "sshd to come back", interval=0.2)

    # Host key verification still passes: same key after the restart.
    assert (cluster.dir / "ssh" / "ssh_host_ed25519_key.pub").read_text() == host_key_before
    hook.client = None
    assert "compute1-st-trn1-1" in run_over_ssh(hook, f"{SLURM_BIN}/sinfo -h -N -o %N")
    agent_log = (cluster.dir / "log" / "agent.log").read_text()
    assert "sshd" in agent_log and "restarted" in agent_log

    assert left_behind and all(running(pid) for pid in left_behind)
    cluster.teardown()
    assert_cluster_gone(cluster)
    assert not any(running(pid) for pid in left_behind)   # swept with the old namespace


def test_wait_for_fleet_sees_a_failed_power_up_with_slurms_reason(uc_home: UcHome,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """wait_for_fleet's own sinfo and parse on a real Slurm: nodes denied capacity fail the wait, with the reason."""
    from ultracluster import remote_commands
    from ultracluster.parsers.slurm import parse_sinfo
    from ultracluster.run.fleet import judge_capacity, partition_capacity
    from ultracluster.run.lost_nodes import LostNodes
    from ultracluster.run.states import FAILED

    cluster = uc_home.provision(spec_dict("ft-fleet", min_count=0, max_count=2,
                                          faults={"insufficient_capacity": ["*"]}))
    cluster.slurm("sbatch", "--nodes", "2", "--output", "/dev/null", "--wrap", "hostname")   # Slurm resumes both
    nodes = ["compute1-dy-trn1-1", "compute1-dy-trn1-2"]
    wait_for(lambda: all(cluster.node_states()[n].startswith("down") for n in nodes), 60, "both nodes to go down")
    command = remote_commands.sinfo()   # as wait_for_fleet runs it: over SSH, in a non-login shell
    out = run_over_ssh(ssh_hook(cluster, monkeypatch), command.shell)
    capacity = partition_capacity(parse_sinfo(out), None, 2)
    # Within node_replacements, the wait waits for ParallelCluster's retry; past it (0 here) it fails.
    assert judge_capacity(capacity, LostNodes(limit=1)).reason == "nodes_replacing"
    verdict, code, reason = judge_capacity(capacity, LostNodes(limit=0))
    assert (verdict, code) == (FAILED, "node_lost") and reason.startswith("Nodes lost past node_replacements=0: "), reason
    assert all(f"{n} (down" in reason for n in nodes) and ICE_REASON in reason, reason
    if os.environ.get("UC_CAPTURE_DIR"):   # how tests/fixtures/slurm/sinfo_power_up_failed.* were made
        capture = Path(os.environ["UC_CAPTURE_DIR"])
        (capture / "sinfo_power_up_failed.cmd").write_text(command.shell + "\n")
        (capture / "sinfo_power_up_failed.out").write_text(out)
        (capture / "sinfo_power_up_failed.rc").write_text("0\n")
    cluster.teardown()
    assert_cluster_gone(cluster)
