"""The local cluster's side of the node health gate: the Neuron and EFA stand-ins report each instance
type's devices, the `neuron-unhealthy` / `efa-unhealthy` faults take one away on one node (bound to its
instance, or `NODE:always`), and the clustermgtd stand-in replaces a drained node, dynamic or static, as
ParallelCluster's does (docs/local-cluster.md, Fidelity).
"""
from __future__ import annotations

import json
import subprocess
import time

import boto3

try:
    from test_runtime import LOCALCLUSTER_PYTHON, UcHome, pytestmark, sbatch_job_id, spec_dict, uc_home
except ImportError:   # if tests/localcluster becomes a package
    from tests.localcluster.test_runtime import (LOCALCLUSTER_PYTHON, UcHome, pytestmark, sbatch_job_id, spec_dict,
                                                 uc_home)

__all__ = ["pytestmark", "uc_home"]

FI_INFO = "/opt/amazon/efa/bin/fi_info"
NEURON_LS = "/opt/aws/neuron/bin/neuron-ls"
# What the health gate reads on every node: distinct EFA RDM domains, Neuron devices, fi_info's exit code.
PROBE = (f"/opt/slurm/bin/srun bash -c 'echo $(hostname) $({FI_INFO} -p efa -t FI_EP_RDM 2>/dev/null | "
         f"grep domain: | sort -u | wc -l) $({NEURON_LS} --json-output | grep -o neuron_device | wc -l) "
         f"$({FI_INFO} -p efa -t FI_EP_RDM > /dev/null 2>&1; echo $?)'")
UC_REASON = "UC health check failed: test"   # the product's drain reason


def probe(cluster, nodes: list[str]) -> dict[str, tuple[int, int, int]]:
    """node -> (EFA devices, Neuron devices, fi_info's exit code), from one job on those nodes."""
    out = cluster.dir / "shared" / "home" / f"probe-{time.monotonic_ns()}.out"
    job_id = sbatch_job_id(cluster.slurm("sbatch", "-w", ",".join(nodes), "-N", str(len(nodes)),
                                         "--output", f"/home/{out.name}", "--wrap", PROBE))
    assert cluster.wait_job_state(job_id, {"COMPLETED", "FAILED", "NODE_FAIL"}, timeout=90) == "COMPLETED", \
        out.read_text() if out.exists() else job_id
    rows = [line.split() for line in out.read_text().splitlines()]
    return {name: (int(efa), int(neuron), int(rc)) for name, efa, neuron, rc in rows}


def run_job(cluster, script: str, node: str) -> str:
    out = cluster.dir / "shared" / "home" / f"job-{time.monotonic_ns()}.out"
    job_id = sbatch_job_id(cluster.slurm("sbatch", "-w", node, "--output", f"/home/{out.name}", "--wrap", script))
    cluster.wait_job_state(job_id, {"COMPLETED", "FAILED"}, timeout=60)
    return out.read_text()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def node_field(cluster, node: str, field: str) -> str:
    line = cluster.slurm("scontrol", "-o", "show", "node", node)
    return line.split(f" {field}=", 1)[1].split(" [")[0].strip() if f" {field}=" in line else ""


def instance_of(cluster, node: str) -> str | None:
    return json.loads((cluster.dir / "run" / "nodes" / f"{node}.json").read_text())["instance_id"]


def ec2_state(uc_home: UcHome, instance_id: str) -> str:
    ec2 = boto3.client("ec2", endpoint_url=uc_home.env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"]["Name"]


def test_stand_ins_report_each_instance_types_devices(uc_home: UcHome) -> None:
    resources = [("trn1", "trn1.32xlarge", True), ("trn1n", "trn1n.32xlarge", True),
                 ("small", "trn1.2xlarge", False), ("noefa", "trn1.32xlarge", False)]
    queues = [{"name": "q", "compute_resources": [
        {"name": name, "instance_type": itype, "min_count": 1, "max_count": 1, "efa": efa}
        for name, itype, efa in resources]}]
    cluster = uc_home.provision(spec_dict("nh-types", queues=queues))
    seen = probe(cluster, [f"q-st-{name}-1" for name, _, _ in resources])
    # 8 / 16 EFA devices with Efa.Enabled (none without it, none on trn1.2xlarge: fi_info exits 61), 16 / 1
    # Neuron devices.
    assert seen == {"q-st-trn1-1": (8, 16, 0), "q-st-trn1n-1": (16, 16, 0), "q-st-small-1": (0, 1, 61),
                    "q-st-noefa-1": (0, 16, 61)}

    # libfabric's output: each device's domain under the efa-direct fabric, then under efa.
    out = run_job(cluster, f"{FI_INFO} -p efa -t FI_EP_RDM; {FI_INFO} -p efa -t FI_EP_RDM -x; echo rc=$?; "
                           f"{FI_INFO} -p tcp; echo rc=$?", "q-st-trn1-1")
    entries = out.split("provider: ")[1:]
    assert entries[0] == ("efa\n    fabric: efa-direct\n    domain: rdmap16s0-rdm\n    version: 201.0\n"
                          "    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n")
    fabrics = [(e.split("fabric: ")[1].split()[0], e.split("domain: ")[1].split()[0]) for e in entries]
    domains = [d for _, d in fabrics[:8]]
    assert len(set(domains)) == 8 and fabrics == [("efa-direct", d) for d in domains] + [("efa", d) for d in domains]
    assert "-x is not modelled" in out and "rc=1" in out   # options it does not model fail, loudly
    assert "fi_getinfo: -61 (No data available)\nrc=61" in out   # other providers are not modelled
    small = run_job(cluster, f"{FI_INFO} -p efa -t FI_EP_RDM; echo rc=$?", "q-st-small-1")
    assert small == "fi_getinfo: -61 (No data available)\nrc=61\n"

    # On the head node too, as the EFA installer is on the AMI; the head node has no EFA devices.
    sshd_pid = json.loads((cluster.dir / "run" / "daemons.json").read_text())["sshd"]["pid"]
    head = subprocess.run(["nsenter", "-t", str(sshd_pid), "-m", "-u", FI_INFO, "-p", "efa"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert (head.returncode, head.stdout, head.stderr) == (61, "", "fi_getinfo: -61 (No data available)\n")


def test_faults_make_one_node_unhealthy_and_clustermgtd_replaces_drained_nodes(uc_home: UcHome) -> None:
    static, dynamic = "compute1-st-trn1-1", "compute1-dy-trn1-1"
    spec = spec_dict("nh-faults", min_count=1, max_count=2, faults={
        "efa_unhealthy": [static, dynamic], "neuron_unhealthy": [f"{dynamic}:always"]})
    spec["queues"][0]["compute_resources"][0]["efa"] = True
    cluster = uc_home.provision(spec)

    # NODE binds to the node's first instance (the dynamic node's too, launched by this job).
    assert probe(cluster, [static, dynamic]) == {static: (7, 16, 0), dynamic: (7, 15, 0)}
    first = {static: instance_of(cluster, static), dynamic: instance_of(cluster, dynamic)}

    # The health gate drains both; clustermgtd replaces them (instances terminated): the dynamic node is
    # powered down for the next job to launch again, the static one relaunched and resumed.
    cluster.slurm("scontrol", "update", f"nodename={static},{dynamic}", "state=drain", f"reason={UC_REASON}")
    wait_for(lambda: cluster.node_states().get(dynamic) == "idle~", 30, f"{dynamic} to be powered down")
    assert node_field(cluster, dynamic, "Reason") == "Scheduler health check failed"
    wait_for(lambda: cluster.node_states().get(static) == "idle", 30, f"{static} to be replaced")
    assert all(ec2_state(uc_home, first[n]) == "terminated" for n in first)
    assert instance_of(cluster, static) not in (None, first[static])
    [log_file] = (cluster.dir / "cloudwatch" / "streams").glob("*.clustermgtd")
    log = log_file.read_text()
    for line in (f"Node state check: node {static}(", f"Node state check: node {dynamic}(",
                 "Found the following unhealthy dynamic nodes: (x1) ['compute1-dy-trn1-1(",
                 "Setting unhealthy dynamic nodes to down and power_down.",
                 "Found the following unhealthy static nodes: (x1) ['compute1-st-trn1-1(",
                 "Launching new instances for unhealthy static nodes"):
        assert line in log, log
    assert "in DRAINED, node state: IDLE+DRAIN\n" in log
    assert " - [slurm_plugin.clustermgtd:_maintain_nodes] - INFO - Found the following" in log   # the real format
    controller = (cluster.dir / "log" / "slurmctld.log").read_text()
    assert (f"update_node: node {static} reason set to: Static node maintenance: unhealthy node is being replaced"
            in controller)

    # A fault set on a running node binds to its current instance.
    done = subprocess.run([str(LOCALCLUSTER_PYTHON), "-m", "localcluster.runtime", "faults", str(cluster.dir),
                           "neuron-unhealthy", f"{dynamic}:always", static],
                          env=uc_home.env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["targets"] == [f"{dynamic} always", f"{static} {instance_of(cluster, static)}"]
    # The replacements are healthy, but for what holds on every instance (:always) and what was just set.
    assert probe(cluster, [static, dynamic]) == {static: (8, 15, 0), dynamic: (8, 15, 0)}
    assert instance_of(cluster, dynamic) not in (None, first[dynamic])
    cluster.teardown()
