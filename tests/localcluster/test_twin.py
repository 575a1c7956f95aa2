"""The twin: inside its node namespaces a local cluster matches a ParallelCluster 3.16 node wherever the
product depends on it, and the host keeps its own packages. One test per row group of the fidelity
table in docs/local-cluster.md (each value's source is named there).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import boto3
import pytest

try:
    from test_runtime import (SLURM_BIN, UcHome, pytestmark, run_over_ssh, sbatch_job_id, spec_dict, ssh_hook,
                              uc_home)
except ImportError:   # if tests/localcluster becomes a package
    from tests.localcluster.test_runtime import (SLURM_BIN, UcHome, pytestmark, run_over_ssh, sbatch_job_id,
                                                 spec_dict, ssh_hook, uc_home)

__all__ = ["pytestmark", "uc_home"]

# The cookbook's aws-parallelcluster-slurm/templates/default/slurm/head_node/slurm.sh.erb, rendered.
SLURM_SH = """#
# slurm.sh:
#   Setup slurm environment variables
#

PATH=$PATH:/opt/slurm/bin
MANPATH=$MANPATH:/opt/slurm/share/man

export PATH MANPATH
"""
NEURON_VENV = "/opt/aws_neuron_venv_pytorch"


def run_job(cluster, script: str, node: str, timeout: float = 120) -> str:
    """A one-node batch job on ``node`` (submitted from the host); its output."""
    out = cluster.dir / "shared" / "home" / f"job-{time.monotonic_ns()}.out"
    job_id = sbatch_job_id(cluster.slurm("sbatch", "-w", node, "--output", f"/home/{out.name}",
                                         "--wrap", script))
    cluster.wait_job_state(job_id, {"COMPLETED", "FAILED"}, timeout=timeout)
    return out.read_text()


def ssh_status(hook, command: str) -> tuple[int, str]:
    with hook.get_conn() as client:
        status, out, err = hook.exec_ssh_client_command(client, command, get_pty=False, environment=None)
    return status, out.decode() + err.decode()


def test_slurm_user_sudo_home_neuron_tools_and_alarms_are_a_parallelcluster_nodes(uc_home: UcHome,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = ["compute1-st-trn1-1", "compute1-st-trn1-2"]
    cluster = uc_home.provision(spec_dict("tw-node", min_count=2, max_count=2,
                                          faults={"neuron_unhealthy": [nodes[1]]}))
    hook = ssh_hook(cluster, monkeypatch)

    # Slurm: /opt/slurm/bin, on a login shell's PATH only; Debian's /usr/bin copies hidden on the nodes.
    assert ssh_status(hook, "sinfo") == (127, "bash: line 1: sinfo: command not found\n")
    assert run_over_ssh(hook, "bash -lc 'command -v sinfo'").strip() == f"{SLURM_BIN}/sinfo"
    assert run_over_ssh(hook, "cat /etc/profile.d/slurm.sh") == SLURM_SH
    assert run_over_ssh(hook, "ls /usr/bin/sinfo /usr/bin/srun 2>&1 || true").count("No such file") == 2
    on_compute = run_job(cluster, f"ls /usr/bin/srun 2>&1; ls {SLURM_BIN}/srun; cat /etc/profile.d/slurm.sh",
                         nodes[0])
    assert "'/usr/bin/srun': No such file" in on_compute and f"{SLURM_BIN}/srun\n" in on_compute
    assert SLURM_SH in on_compute
    # The host keeps its own packages and sees none of it.
    assert Path("/usr/bin/sinfo").is_file() and not Path("/opt/slurm").exists()
    assert not Path("/etc/profile.d/slurm.sh").exists()

    # The OS's default user, with passwordless sudo from a sudoers file only the nodes see.
    assert cluster.runtime["ssh_user"] == "ubuntu"
    assert run_over_ssh(hook, "id -un; sudo -n id -un").split() == ["ubuntu", "root"]
    assert not Path("/etc/sudoers.d/90-cloud-init-users").exists()

    # /home and the shared storage mount are shared between the head node and the compute nodes.
    run_over_ssh(hook, "echo from-head > ~/probe && echo from-head > /fsx/probe")
    seen = run_job(cluster, "cat /home/ubuntu/probe /fsx/probe; id -un", nodes[0])
    assert seen.split()[:2] == ["from-head", "from-head"]

    # The Neuron tools at their real paths, on the compute nodes only; neuron-ls lists one device fewer on
    # the node the neuron-unhealthy fault names, and on that one only (test_node_health.py has the rest).
    assert "No such file" in run_over_ssh(hook, "ls /opt/aws/neuron/bin 2>&1 || true")
    healthy = run_job(cluster, "/opt/aws/neuron/bin/neuron-ls --json-output; echo rc=$?", nodes[0])
    devices = json.loads(healthy.split("rc=")[0])
    assert len(devices) == 16 and {d["nc_count"] for d in devices} == {2} and healthy.strip().endswith("rc=0")
    broken = run_job(cluster, "/opt/aws/neuron/bin/neuron-ls --json-output; echo rc=$?", nodes[1])
    assert len(json.loads(broken.split("rc=")[0])) == 15 and broken.strip().endswith("rc=0")
    venv = run_job(cluster, f"ls {NEURON_VENV}/bin/neuronx-cc {NEURON_VENV}/bin/neuron_parallel_compile && "
                            f"{NEURON_VENV}/bin/python -c 'import sys, torch; print(sys.prefix)'", nodes[0])
    assert venv.split()[-1] == NEURON_VENV, venv
    assert not Path(NEURON_VENV).exists() and not Path("/opt/aws/neuron").exists()

    # The cluster stack's head-node alarms (monitoring.py), put once the head node is up.
    cloudwatch = boto3.client("cloudwatch", endpoint_url=uc_home.env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
    alarms = cloudwatch.describe_alarms(AlarmNamePrefix="tw-node-HeadNode",
                                        AlarmTypes=["CompositeAlarm", "MetricAlarm"])
    metric = {a["AlarmName"]: a for a in alarms["MetricAlarms"]}
    assert sorted(metric) == [f"tw-node-HeadNode-{m}" for m in ("ClustermgtdHeartbeat", "Cpu", "Disk", "Health", "Mem")]
    head_id = cluster.runtime["head_node"]["instance_id"]
    assert {"Name": "InstanceId", "Value": head_id} in metric["tw-node-HeadNode-Health"]["Dimensions"]
    [composite] = alarms["CompositeAlarms"]
    assert composite["AlarmName"] == "tw-node-HeadNode"
    assert composite["AlarmRule"].count("ALARM(") == 5 and ":alarm:tw-node-HeadNode-Cpu" in composite["AlarmRule"]


def test_a_node_past_its_bootstrap_timeout_is_failed_and_replaced(uc_home: UcHome) -> None:
    """ResumeTimeout is the bootstrap timeout. A node not up by then is set DOWN by Slurm (its job ends
    NODE_FAIL: no requeue, as the product submits); clustermgtd terminates its instance and powers the
    node down; the next job launches it again, on a new instance."""
    spec = {**spec_dict("tw-boot", min_count=0, max_count=1, faults={"boot_delay": 60}),
            "compute_node_bootstrap_timeout": 5}
    cluster = uc_home.provision(spec)
    node = "compute1-dy-trn1-1"
    assert "ResumeTimeout=5\n" in (cluster.dir / "etc" / "slurm" / "slurm.conf").read_text()
    job_id = sbatch_job_id(cluster.slurm("sbatch", "--output", "/dev/null", "--wrap", "hostname"))
    assert cluster.wait_job_state(job_id, {"NODE_FAIL"}, timeout=90) == "NODE_FAIL"
    power_log = cluster.dir / "log" / "power.log"
    launches = lambda: [line.split()[-1] for line in power_log.read_text().splitlines()  # noqa: E731
                        if f"resume {node}: booting" in line]
    # The job's end and the node's power-down are Slurm's and clustermgtd's own steps: wait for both.
    deadline = time.monotonic() + 60
    [clustermgtd_log] = (cluster.dir / "cloudwatch" / "streams").glob("*.clustermgtd")
    expected = f"Node bootstrap error: Resume timeout expires for node {node}("
    while expected not in clustermgtd_log.read_text():
        assert time.monotonic() < deadline, clustermgtd_log.read_text()
        time.sleep(0.5)
    # slurmctld runs its ResumeFailProgram, which writes this line, on its own schedule.
    failed = f"Node bootstrap error: Resume timeout expires for node {node} ({launches()[0]})"
    while failed not in power_log.read_text():
        assert time.monotonic() < deadline, power_log.read_text()
        time.sleep(0.5)
    # Powered down (idle~) and available again; its instance terminated.
    while cluster.node_states().get(node) != "idle~":
        assert time.monotonic() < deadline, cluster.node_states()
        time.sleep(0.5)
    ec2 = boto3.client("ec2", endpoint_url=uc_home.env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    [reservation] = ec2.describe_instances(InstanceIds=[launches()[0]])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] == "terminated"
    # The replacement: a node that boots in time (the knob, changed in place) runs the next job, and
    # a dynamic node (started by ResumeProgram, in slurmctld's namespace) has the Neuron venv too.
    runtime = json.loads((cluster.dir / "runtime.json").read_text())
    runtime["faults"]["boot_delay"] = 0
    (cluster.dir / "runtime.json").write_text(json.dumps(runtime))
    job_id = sbatch_job_id(cluster.slurm("sbatch", "--output", "/dev/null", "--wrap",
                                         f"{NEURON_VENV}/bin/python -c 'import torch'"))
    assert cluster.wait_job_state(job_id, {"COMPLETED"}, timeout=120) == "COMPLETED"
    assert len(launches()) == 2 and launches()[1] != launches()[0]
