"""The local UltraCluster runtime with real daemons: Slurm, munge, sshd (and MariaDB for accounting).

Tests drive `python -m localcluster.runtime` in the localcluster venv (never import it) and reach the
head node with Airflow's SSHHook, verifying its host key.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures_localcluster import processes_mentioning

REPO = Path(__file__).resolve().parents[2]
LOCALCLUSTER_PYTHON = REPO / ".venvs" / "localcluster" / "bin" / "python"
KEY_NAME = "runtime-test-key"
# Slurm's commands on a ParallelCluster node: on a login shell's PATH only, so non-login SSH commands
# and jobs submitted without it name them in full (tests/localcluster/test_twin.py holds this).
SLURM_BIN = "/opt/slurm/bin"
# A slot/port range of its own so tests never meet a developer's `make up` (slots 1-99).
TEST_ENV = {"LOCAL_UC_SLOT_MIN": "240", "LOCAL_UC_SLOT_MAX": "254", "LOCAL_UC_PORT_BASE": "20000",
            "LOCAL_UC_DB_PORT": "20060", "LOCAL_UC_TRAINING_VENV": str(REPO / ".venvs" / "training")}

pytestmark = [
    pytest.mark.localcluster,
    pytest.mark.skipif(os.geteuid() != 0 or not LOCALCLUSTER_PYTHON.exists() or not shutil.which("slurmctld"),
                       reason="needs root, the localcluster venv and Slurm"),
]


def spec_dict(name: str, *, min_count: int = 2, max_count: int = 2, idletime_min: float = 10.0,
              accounting: bool = False, faults: dict | None = None, queues: list[dict] | None = None) -> dict:
    return {
        "name": name, "region": "us-east-1", "head_instance_type": "c5.4xlarge", "key_name": KEY_NAME,
        "queues": queues or [{"name": "compute1", "compute_resources": [
            {"name": "trn1", "instance_type": "trn1.32xlarge", "min_count": min_count, "max_count": max_count}]}],
        "mount_dirs": ["/fsx"], "accounting": accounting, "scaledown_idletime_min": idletime_min,
        "faults": {"boot_delay": 1.0, **(faults or {})},
    }


@dataclass
class UcHome:
    path: Path
    env: dict[str, str]

    @property
    def private_key(self) -> Path:
        return self.path / "keys" / KEY_NAME

    def runtime(self, *args: str, timeout: float = 180) -> dict:
        done = subprocess.run([str(LOCALCLUSTER_PYTHON), "-m", "localcluster.runtime", *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"runtime {args[0]} failed: {done.stderr}"
        return json.loads(done.stdout)

    def provision(self, spec: dict) -> "Cluster":
        cluster_dir = self.path / "clusters" / spec["name"]
        cluster_dir.mkdir(parents=True)
        (cluster_dir / "spec.json").write_text(json.dumps(spec))
        runtime = self.runtime("provision", str(cluster_dir / "spec.json"), str(cluster_dir))
        return Cluster(home=self, dir=cluster_dir, runtime=runtime)


@dataclass
class Cluster:
    home: UcHome
    dir: Path
    runtime: dict

    @property
    def head_ip(self) -> str:
        return self.runtime["head_node"]["ip"]

    @property
    def ssh_port(self) -> int:
        return self.runtime["head_node"]["ssh_port"]

    @property
    def node_names(self) -> list[str]:
        return [n["name"] for n in self.runtime["nodes"]]

    def slurm(self, *args: str, check: bool = True) -> str:
        """A Slurm client command run from the host against this cluster."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = self.runtime["slurm"]["conf"]
        done = subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=30)
        if check:
            assert done.returncode == 0, f"{args}: {done.stderr}"
        return done.stdout

    def node_states(self) -> dict[str, str]:
        out = self.slurm("sinfo", "-h", "-N", "-o", "%N %t")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def job_field(self, job_id: str, field: str) -> str:
        out = self.slurm("scontrol", "show", "job", job_id)
        for token in out.split():
            if token.startswith(field + "="):
                return token.split("=", 1)[1]
        raise AssertionError(f"{field} not in {out}")

    def wait_job_state(self, job_id: str, wanted: set[str], timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job_field(job_id, "JobState")
            if state in wanted:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} stayed {state}, wanted {wanted}")

    def describe(self) -> dict:
        return self.home.runtime("describe", str(self.dir))

    def ports(self) -> list[int]:
        slurm = self.runtime["slurm"]
        ports = [slurm["slurmctld_port"], *slurm["slurmd_ports"].values()]
        return ports + ([slurm["slurmdbd_port"]] if slurm.get("slurmdbd_port") else [])

    def addresses(self) -> list[tuple[str, int]]:
        """Where each Slurm daemon listens: its own node's address, never 0.0.0.0."""
        slurm = self.runtime["slurm"]
        addresses = [(self.head_ip, slurm["slurmctld_port"])]
        addresses += [(self.head_ip, slurm["slurmdbd_port"])] if slurm.get("slurmdbd_port") else []
        return addresses + [(n["ip"], n["port"]) for n in self.runtime["nodes"]]

    def teardown(self) -> None:
        self.home.runtime("teardown", str(self.dir))


def listening(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def assert_cluster_gone(cluster: Cluster) -> None:
    assert not cluster.dir.exists()
    assert processes_mentioning(str(cluster.dir)) == []
    assert [a for a in cluster.addresses() if listening(*a)] == []
    assert not listening(cluster.head_ip, cluster.ssh_port)


@pytest.fixture
def uc_home(moto_server: str) -> Iterator[UcHome]:
    # Under /tmp but searchable by all: the cluster user must reach slurm.conf and the munge socket.
    path = Path(tempfile.mkdtemp(prefix="uc-runtime-", dir="/tmp"))
    path.chmod(0o755)
    (path / "keys").mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path / "keys" / KEY_NAME)],
                   check=True)
    # Nodes are EC2 instances too: the runtime launches and terminates them in moto.
    env = {**os.environ, **TEST_ENV, "LOCAL_ULTRACLUSTER_HOME": str(path), "AWS_ENDPOINT_URL": moto_server,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    home = UcHome(path=path, env=env)
    try:
        yield home
    finally:
        subprocess.run([str(LOCALCLUSTER_PYTHON), "-m", "localcluster.runtime", "stop-everything", str(path)],
                       env=env, capture_output=True, timeout=120)
        keep = os.environ.get("UC_TEST_KEEP_LOGS")   # a dir to copy cluster logs to, for debugging
        try:
            if keep and (path / "clusters").is_dir():
                shutil.copytree(path / "clusters", Path(keep) / path.name, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("shared", "spool"))
        finally:
            shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Listener:
    address: str      # as ss prints it: 127.100.240.1, 0.0.0.0, *, [::]
    port: int
    pids: tuple[int, ...]
    commands: tuple[str, ...]


def tcp_listeners() -> list[Listener]:
    """Every listening TCP socket of the machine, with the processes holding it (`ss -ltnpH`)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        address, _, port = fields[3].rpartition(":")
        users = " ".join(fields[5:])
        found.append(Listener(address=address, port=int(port),
                              pids=tuple(int(p) for p in re.findall(r"pid=(\d+)", users)),
                              commands=tuple(re.findall(r'\("([^"]+)"', users))))
    return found


def belongs_to(pid: int, cluster: Cluster) -> bool:
    """A process of the cluster: it sees the cluster's /etc/hosts (every node namespace, job steps, sruns)
    or its command line names the cluster dir (munged)."""
    try:
        hosts = os.stat(f"/proc/{pid}/root/etc/hosts")
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    mine = os.stat(cluster.dir / "etc" / "hosts")
    return (hosts.st_dev, hosts.st_ino) == (mine.st_dev, mine.st_ino) or str(cluster.dir) in cmd


def is_loopback_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip("[]").split("%")[0])
    except ValueError:   # "*"
        return False
    return ip.is_loopback and not ip.is_unspecified


def ssh_hook(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, conn_retry_attempts: int = 3):
    from airflow.providers.ssh.hooks.ssh import SSHHook

    host_key = (cluster.dir / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()
    conn = {"conn_type": "ssh", "host": cluster.head_ip, "port": cluster.ssh_port,
            "login": cluster.runtime["ssh_user"],
            "extra": {"key_file": str(cluster.home.private_key), "host_key": f"{host_key[0]} {host_key[1]}",
                      "look_for_keys": "false"}}
    conn_id = "uc_head_" + cluster.runtime["cluster_name"].replace("-", "_")
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return SSHHook(ssh_conn_id=conn_id, conn_timeout=10, cmd_timeout=60, conn_retry_attempts=conn_retry_attempts)


def run_over_ssh(hook, command: str) -> str:
    with hook.get_conn() as client:
        status, out, err = hook.exec_ssh_client_command(client, command, get_pty=False, environment=None)
    assert status == 0, f"{command!r} exited {status}: {err.decode()}"
    return out.decode()


def sbatch_job_id(output: str) -> str:
    assert output.startswith("Submitted batch job "), output
    return output.split()[-1]


# --- tests ---------------------------------------------------------------------------------------

def test_two_static_nodes_job_over_ssh_then_teardown(uc_home: UcHome, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = uc_home.provision(spec_dict("rt-static", min_count=2, max_count=2))
    nodes = ["compute1-st-trn1-1", "compute1-st-trn1-2"]
    assert cluster.node_names == nodes
    hook = ssh_hook(cluster, monkeypatch)

    sinfo = run_over_ssh(hook, f"{SLURM_BIN}/sinfo -h -N -o '%N %t %P'")
    assert sorted(sinfo.split("\n")[:2]) == [f"{n} idle compute1*" for n in nodes]
    assert run_over_ssh(hook, "hostname").strip() == cluster.runtime["head_node"]["hostname"]

    job_id = sbatch_job_id(run_over_ssh(hook, f"cd ~ && {SLURM_BIN}/sbatch --exclusive --nodes 2 "
                                              f"--wrap '{SLURM_BIN}/srun hostname'"))
    cluster.wait_job_state(job_id, {"COMPLETED"})
    output = run_over_ssh(hook, f"cat ~/slurm-{job_id}.out")
    assert sorted(output.split()) == nodes

    # What the training script does for MASTER_ADDR, plus the shared /fsx seen from every node.
    script = (f"MASTER=$({SLURM_BIN}/scontrol show hostnames $SLURM_JOB_NODELIST | head -1); getent hosts $MASTER; "
              f"{SLURM_BIN}/srun bash -c 'echo $(hostname) > /fsx/seen-$(hostname)'")
    submit = f"cd ~ && {SLURM_BIN}/sbatch --nodes 2 --output ~/resolve.out --wrap {shlex.quote(script)}"
    job_id = sbatch_job_id(run_over_ssh(hook, submit))
    cluster.wait_job_state(job_id, {"COMPLETED"})
    resolved = run_over_ssh(hook, "cat ~/resolve.out").split()
    assert resolved == [cluster.runtime["nodes"][0]["ip"], nodes[0]]
    assert sorted(run_over_ssh(hook, "cat /fsx/seen-*").split()) == nodes
    assert sorted(p.name for p in Path(cluster.runtime["shared_dirs"]["/fsx"]).iterdir()) == \
        [f"seen-{n}" for n in nodes]

    # While a 2-node job step runs, every daemon of the cluster (slurmctld, slurmd, sshd) listens on its
    # own 127.100.k.x address: nothing on 0.0.0.0, [::] or a non-loopback address. srun is the exception
    # (runtime README): it must listen on 0.0.0.0 because slurmstepd connects back to 127.0.0.1.
    job_id = sbatch_job_id(run_over_ssh(hook, f"cd ~ && {SLURM_BIN}/sbatch --nodes 2 --output /dev/null "
                                              f"--wrap '{SLURM_BIN}/srun sleep 300'"))
    cluster.wait_job_state(job_id, {"RUNNING"})
    deadline = time.monotonic() + 60
    ours: list[Listener] = []
    while time.monotonic() < deadline:
        ours = [l for l in tcp_listeners() if any(belongs_to(p, cluster) for p in l.pids)]
        if "srun" in {c for l in ours for c in l.commands}:
            break
        time.sleep(0.2)
    assert "srun" in {c for l in ours for c in l.commands}, ours
    assert [l for l in ours if not is_loopback_address(l.address) and set(l.commands) != {"srun"}] == []
    assert set(cluster.addresses()) <= {(l.address, l.port) for l in ours}, ours
    cluster.slurm("scancel", job_id)
    cluster.wait_job_state(job_id, {"CANCELLED"})

    instances = cluster.describe()["instances"]
    assert [i["nodeType"] for i in instances] == ["HeadNode", "ComputeNode", "ComputeNode"]
    assert all(i["state"] == "running" and i["instanceId"].startswith("i-") for i in instances)

    cluster.teardown()
    assert_cluster_gone(cluster)
    assert list((uc_home.path / "slots").glob("*.json")) == []
    cluster.teardown()   # idempotent


def test_dynamic_node_powers_up_for_a_job_and_down_when_idle(uc_home: UcHome) -> None:
    # A 3 s boot keeps the powering-up state (#) long enough to be seen by polling on a busy machine.
    cluster = uc_home.provision(spec_dict("rt-dynamic", min_count=0, max_count=1, idletime_min=0.1,
                                          faults={"boot_delay": 3.0}))
    node = "compute1-dy-trn1-1"
    assert cluster.node_states() == {node: "idle~"}
    assert [i["nodeType"] for i in cluster.describe()["instances"]] == ["HeadNode"]

    job_id = sbatch_job_id(cluster.slurm("sbatch", "--nodes", "1", "--output", "/dev/null", "--wrap", "sleep 3"))
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = cluster.node_states()[node]
        if not seen or seen[-1] != state:
            seen.append(state)
        if cluster.job_field(job_id, "JobState") == "COMPLETED":
            break
        time.sleep(0.2)
    assert cluster.job_field(job_id, "JobState") == "COMPLETED", seen
    assert seen[0] == "idle~"
    assert any(s.endswith("#") for s in seen), seen            # powering up
    assert any(s in ("alloc", "mix") for s in seen), seen        # running on the booted node
    assert cluster.job_field(job_id, "NodeList") == node
    # Launched when the node registered (the PrologSlurmctld ended), not at Slurm's 30 s periodic check.
    controller_log = (cluster.dir / "log" / "slurmctld.log").read_text(errors="replace")
    assert f"prolog_running_decr: Configuration for JobId={job_id} is complete" in controller_log
    assert f"job_time_limit: Configuration for JobId={job_id} complete" not in controller_log

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and cluster.node_states()[node] != "idle~":
        time.sleep(0.5)
    assert cluster.node_states()[node] == "idle~"
    assert [i["nodeType"] for i in cluster.describe()["instances"]] == ["HeadNode"]
    assert processes_mentioning(f"-N {node}") == []

    # EC2 saw what a bill is made of: the head node running, the compute node launched at resume
    # and terminated at suspend, tagged as pcluster tags them.
    instances = ec2_instances(uc_home, "rt-dynamic")
    assert {(i["Tags"]["parallelcluster:node-type"], i["State"]["Name"]) for i in instances} == {
        ("HeadNode", "running"), ("Compute", "terminated")}, instances
    compute = next(i for i in instances if i["Tags"]["parallelcluster:node-type"] == "Compute")
    assert compute["InstanceType"] == "trn1.32xlarge" and compute["Tags"]["Name"] == node
    assert compute["StateTransitionReason"].startswith("User initiated (")

    cluster.teardown()
    assert_cluster_gone(cluster)


def ec2_instances(home: UcHome, cluster_name: str) -> list[dict]:
    import boto3
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=home.env["AWS_ENDPOINT_URL"],
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    reservations = ec2.describe_instances(Filters=[
        {"Name": "tag:parallelcluster:cluster-name", "Values": [cluster_name]}])["Reservations"]
    return [{**i, "Tags": {t["Key"]: t["Value"] for t in i.get("Tags", [])}}
            for r in reservations for i in r["Instances"]]


def test_three_clusters_at_once_are_isolated(uc_home: UcHome) -> None:
    names = ["rt-multi-a", "rt-multi-b", "rt-multi-c"]
    for name in names:
        cluster_dir = uc_home.path / "clusters" / name
        cluster_dir.mkdir(parents=True)
        (cluster_dir / "spec.json").write_text(json.dumps(spec_dict(name, min_count=1, max_count=1)))
    # Provision concurrently: slot allocation must hold under the lock.
    procs = [subprocess.Popen([str(LOCALCLUSTER_PYTHON), "-m", "localcluster.runtime", "provision",
                               str(uc_home.path / "clusters" / n / "spec.json"), str(uc_home.path / "clusters" / n)],
                              env=uc_home.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in names]
    clusters = []
    for name, proc in zip(names, procs, strict=True):
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        clusters.append(Cluster(home=uc_home, dir=uc_home.path / "clusters" / name, runtime=json.loads(out)))

    assert len({c.runtime["slot"] for c in clusters}) == 3
    assert len({c.head_ip for c in clusters}) == 3
    all_ports = [p for c in clusters for p in c.ports()]
    assert len(all_ports) == len(set(all_ports))
    keys = {(c.dir / "munge" / "munge.key").read_bytes() for c in clusters}
    assert len(keys) == 3

    job_ids = [sbatch_job_id(c.slurm("sbatch", "--output", "/dev/null", "--wrap", "hostname")) for c in clusters]
    for cluster, job_id in zip(clusters, job_ids, strict=True):
        cluster.wait_job_state(job_id, {"COMPLETED"})
        assert cluster.job_field(job_id, "NodeList") == "compute1-st-trn1-1"

    # A credential of one cluster is worthless on another.
    a, b = clusters[0], clusters[1]
    cred = subprocess.run(["munge", "-S", a.runtime["slurm"]["munge_socket"], "-n"],
                          capture_output=True, check=True).stdout
    assert subprocess.run(["unmunge", "-S", a.runtime["slurm"]["munge_socket"]], input=cred,
                          capture_output=True).returncode == 0
    assert subprocess.run(["unmunge", "-S", b.runtime["slurm"]["munge_socket"]], input=cred,
                          capture_output=True).returncode != 0

    for cluster in clusters:
        cluster.teardown()
    for cluster in clusters:
        assert_cluster_gone(cluster)


def test_compute_fleet_stop_and_start(uc_home: UcHome) -> None:
    cluster = uc_home.provision(spec_dict("rt-fleet", min_count=1, max_count=2, idletime_min=10))
    job_id = sbatch_job_id(cluster.slurm("sbatch", "--nodes", "2", "--output", "/dev/null", "--wrap", "hostname"))
    cluster.wait_job_state(job_id, {"COMPLETED"})
    assert len(cluster.describe()["instances"]) == 3

    assert uc_home.runtime("fleet", str(cluster.dir), "STOP_REQUESTED") == {"status": "STOPPED"}
    described = cluster.describe()
    assert described["compute_fleet_status"] == "STOPPED"
    assert [i["nodeType"] for i in described["instances"]] == ["HeadNode"]
    assert "inactive" in cluster.slurm("sinfo", "-h", "-o", "%a")
    assert [p for p in processes_mentioning(str(cluster.dir)) if "slurmd -D" in p] == []

    assert uc_home.runtime("fleet", str(cluster.dir), "START_REQUESTED") == {"status": "RUNNING"}
    assert cluster.node_states()["compute1-st-trn1-1"] == "idle"
    job_id = sbatch_job_id(cluster.slurm("sbatch", "--output", "/dev/null", "--wrap", "hostname"))
    cluster.wait_job_state(job_id, {"COMPLETED"})
    cluster.teardown()
    assert_cluster_gone(cluster)


def test_accounting_with_slurmdbd(uc_home: UcHome) -> None:
    cluster = uc_home.provision(spec_dict("rt-acct", min_count=1, max_count=1, accounting=True))
    assert listening(cluster.head_ip, cluster.runtime["slurm"]["slurmdbd_port"])
    job_id = sbatch_job_id(cluster.slurm("sbatch", "--output", "/dev/null", "--wrap", "hostname"))
    cluster.wait_job_state(job_id, {"COMPLETED"})
    deadline = time.monotonic() + 60
    rows: list[str] = []
    while time.monotonic() < deadline:
        rows = cluster.slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State", check=False).split()
        if rows == [f"{job_id}|COMPLETED"]:
            break
        time.sleep(1)
    assert rows == [f"{job_id}|COMPLETED"]
    assert processes_mentioning(str(uc_home.path / "mariadb"))   # the shared MariaDB, while a cluster uses it
    cluster.teardown()
    assert_cluster_gone(cluster)
    # The last cluster with a database took the server along: nothing left running.
    assert processes_mentioning(str(uc_home.path / "mariadb")) == []


def test_without_accounting_sacct_c_reads_the_job_completion_log(uc_home: UcHome) -> None:
    cluster = uc_home.provision(spec_dict("rt-jobcomp", min_count=1, max_count=1))
    job_id = sbatch_job_id(cluster.slurm("sbatch", "--output", "/dev/null", "--wrap", "hostname"))
    cluster.wait_job_state(job_id, {"COMPLETED"})
    out = cluster.slurm("sacct", "-c", "-n", "-P", "-o", "JobID,State")
    assert f"{job_id}|COMPLETED" in out.split()
    cluster.teardown()
    assert_cluster_gone(cluster)


def test_stop_everything_stops_every_cluster_of_a_home(uc_home: UcHome) -> None:
    clusters = [uc_home.provision(spec_dict(name, min_count=1, max_count=1)) for name in ("rt-down-a", "rt-down-b")]
    stopped = uc_home.runtime("stop-everything", str(uc_home.path))["stopped"]
    for cluster in clusters:
        assert any(s.startswith(f"{cluster.dir.name}: slurmctld[") for s in stopped), stopped
        assert processes_mentioning(str(cluster.dir)) == []
        assert [a for a in cluster.addresses() if listening(*a)] == []
        assert not listening(cluster.head_ip, cluster.ssh_port)
    # The state stays for inspection; teardown (pcluster delete-cluster) still cleans it up.
    for cluster in clusters:
        cluster.teardown()
        assert_cluster_gone(cluster)


def test_one_partition_per_queue_first_is_default_and_every_mount_dir_is_shared(uc_home: UcHome) -> None:
    queues = [
        {"name": "compute1", "compute_resources": [
            {"name": "trn1", "instance_type": "trn1.32xlarge", "min_count": 1, "max_count": 2}]},
        {"name": "compute2", "compute_resources": [
            {"name": "small", "instance_type": "trn1.2xlarge", "min_count": 1, "max_count": 1},
            {"name": "big", "instance_type": "trn1.32xlarge", "min_count": 0, "max_count": 1}]},
    ]
    spec = spec_dict("rt-queues", queues=queues)
    spec["mount_dirs"] = ["/fsx", "/scratch"]
    cluster = uc_home.provision(spec)
    assert cluster.node_states() == {"compute1-st-trn1-1": "idle", "compute1-dy-trn1-1": "idle~",
                                     "compute2-st-small-1": "idle", "compute2-dy-big-1": "idle~"}
    partitions = cluster.slurm("sinfo", "-h", "-o", "%P %D").split("\n")
    assert sorted(p for p in partitions if p) == ["compute1* 2", "compute2 2"]

    job_id = sbatch_job_id(cluster.slurm(
        "sbatch", "-p", "compute2", "-C", "small", "--output", "/dev/null",
        "--wrap", "hostname > /fsx/host && touch /scratch/seen"))
    cluster.wait_job_state(job_id, {"COMPLETED"})
    shared = cluster.runtime["shared_dirs"]
    assert (Path(shared["/fsx"]) / "host").read_text().strip() == "compute2-st-small-1"
    assert (Path(shared["/scratch"]) / "seen").exists()
    cluster.teardown()
    assert_cluster_gone(cluster)


def test_failed_provision_cleans_up_what_it_started(uc_home: UcHome) -> None:
    spec = spec_dict("rt-broken", min_count=1, max_count=1)
    spec["key_name"] = "no-such-key"   # sshd is the last step: everything before it already runs
    cluster_dir = uc_home.path / "clusters" / spec["name"]
    cluster_dir.mkdir(parents=True)
    (cluster_dir / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([str(LOCALCLUSTER_PYTHON), "-m", "localcluster.runtime", "provision",
                           str(cluster_dir / "spec.json"), str(cluster_dir)],
                          env=uc_home.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "no-such-key" in json.loads(done.stderr)["message"]
    assert processes_mentioning(str(cluster_dir)) == []
    assert list((uc_home.path / "slots").glob("*.json")) == []
    assert (cluster_dir / "log" / "slurmctld.log").exists()   # logs stay for the CLI to report
    partial = Cluster(home=uc_home, dir=cluster_dir, runtime=json.loads((cluster_dir / "runtime.json").read_text()))
    assert [a for a in partial.addresses() if listening(*a)] == []
    partial.teardown()
    assert not cluster_dir.exists()


def test_sweep_takes_the_child_a_killed_booter_left(tmp_path):
    """A booter (its own session, naming the cluster dir) killed while its scontrol runs: the child is
    no command the sweep looks for, and must go with its group."""
    marker = tmp_path / "clusters" / "c1"
    booter = subprocess.Popen(
        [str(LOCALCLUSTER_PYTHON), "-c", "import subprocess, sys; subprocess.run(['sleep', '37.5'])",
         "localcluster.runtime.power", "boot", str(marker)],  # the sweep's pattern for a booter
        start_new_session=True)
    deadline = time.monotonic() + 30
    while not subprocess.run(["pgrep", "-g", str(booter.pid), "-x", "sleep"], capture_output=True).stdout:
        assert time.monotonic() < deadline, "the booter's child never started"
        time.sleep(0.1)
    script = ("import sys; from localcluster.runtime.procs import pids_mentioning; "
              "from localcluster.runtime.teardown import sweep; "
              "print(sweep(lambda: set(pids_mentioning(sys.argv[1]))))")
    done = subprocess.run([str(LOCALCLUSTER_PYTHON), "-c", script, str(marker)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    booter.wait(timeout=10)
    assert f"process[{booter.pid}]" in done.stdout
    assert subprocess.run(["pgrep", "-f", "sleep 37.5"], capture_output=True).stdout == b""
