"""Fixtures for the local UltraCluster, reusable by every test package (registered in tests/conftest.py).

    moto_server          session: a real `moto_server` on a free loopback port; yields its endpoint URL
    uc_home              (prepared_home() as a fixture) a fresh LOCAL_ULTRACLUSTER_HOME (under /tmp, mode 0755) after
                         `local-ultracluster up --no-moto --endpoint <moto_server>`: buckets, key pair,
                         airflow.env; torn down with `local-ultracluster down` (nothing left running)
    uc_env               env vars to run the CLI binaries against that home (dict[str, str])
    uc_network           a VPC and subnet created in moto for that home: UcNetwork(vpc_id, subnet_id)
    pcluster             run_pcluster bound to uc_env: pcluster("describe-cluster", "-n", "x") -> (rc, json)
    make_cluster_config  write a valid ParallelCluster v3 YAML: make_cluster_config(static=1, dynamic=2)

Tests use slots 200-239 (a developer's `make up` uses 1-99, the runtime tests 240-254) and their own
home, so they never meet a running deployment.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
LOCALCLUSTER_BIN = REPO / ".venvs" / "localcluster" / "bin"
PCLUSTER_BIN = LOCALCLUSTER_BIN / "pcluster"
ADMIN_BIN = LOCALCLUSTER_BIN / "local-ultracluster"
LOCALCLUSTER_PYTHON = LOCALCLUSTER_BIN / "python"
MOTO_SERVER_MODULE = REPO / "localcluster" / "localcluster" / "moto_server.py"
KEY_NAME = "ultracluster-local"
# The local UltraCluster's fake AWS credentials (localcluster/aws.py's FAKE_CREDENTIALS, which
# `local-ultracluster up` writes into airflow.env): recognisable by tests/log_scan.py.
FAKE_AWS = {"AWS_ACCESS_KEY_ID": "AKIAUCFAKELOCAL00000",
            "AWS_SECRET_ACCESS_KEY": "ucfakeSecretLocalUltraCluster/0000000000"}
FAKE_AWS_CLIENT = {"aws_access_key_id": FAKE_AWS["AWS_ACCESS_KEY_ID"],   # boto3.client(**FAKE_AWS_CLIENT)
                   "aws_secret_access_key": FAKE_AWS["AWS_SECRET_ACCESS_KEY"]}
TRAINING_VENV = REPO / ".venvs" / "training"
REGION = "us-east-1"


def _test_slots() -> dict[str, str]:
    """Slots 200-239 and accounting port 20070, split between `make test`'s xdist workers so two
    workers' clusters never claim the same addresses (a slot is only locked within one home)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index, count = int(worker.removeprefix("gw") or 0), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    width = 40 // max(1, min(count, 4))
    low = 200 + (index % 4) * width
    return {"LOCAL_UC_SLOT_MIN": str(low), "LOCAL_UC_SLOT_MAX": str(low + width - 1), "LOCAL_UC_PORT_BASE": "20000",
            "LOCAL_UC_DB_PORT": str(20070 + index % 4)}


TEST_SLOTS = _test_slots()
CLI_TIMEOUT_S = 120


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "localcluster: tests of the local UltraCluster (moto, CLI, daemons)")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return low, high
    except OSError:
        return 32768, 60999


_next_port = [0]


def free_port() -> int:
    """A free loopback port just below the kernel's ephemeral range (30000-32767 by default).

    Not inside that range: a client that polls a not-yet-listening port there can be handed the
    same port as its own source and connect to itself (TCP simultaneous open); the server then
    cannot bind and both sides hang. Not above it either: local clusters' training rendezvous ports
    live there (61000-65499, the run script), and local clusters' Slurm ports sit below 30000.
    """
    low, _ = _ephemeral_range()
    start, end = max(1024, low - 2768), low - 1
    span = end - start + 1
    if not _next_port[0]:
        _next_port[0] = (os.getpid() * 7919) % span
    for _ in range(span):
        port = start + _next_port[0] % span
        _next_port[0] += 1
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}-{end}")


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/", timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def install_moto_stack_deletes() -> None:
    """Give an in-process moto the stand-in's stack deletes (localcluster/moto_server.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_localcluster_moto_server", MOTO_SERVER_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install()


@contextmanager
def running_moto(server: list[str], port: int | None = None) -> Iterator[str]:
    """A moto server (the localcluster venv's Python with ``server``, then ``-H 127.0.0.1 -p PORT``) in a
    process of its own; yields its endpoint."""
    port = port or free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    process = subprocess.Popen([str(LOCALCLUSTER_PYTHON), *server, "-H", "127.0.0.1", "-p", str(port)],
                               stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not _answers(endpoint):
            if process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"{' '.join(server)} did not start: {log.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.1)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """The stand-in's AWS as `local-ultracluster up` starts it (localcluster/moto_server.py): moto with the
    stack deletes, capacity reservations and managed IAM policies it lacks."""
    if not LOCALCLUSTER_PYTHON.exists():
        pytest.skip(f"{LOCALCLUSTER_PYTHON} missing: run `make setup`")
    with running_moto(["-m", "localcluster.moto_server"]) as endpoint:
        yield endpoint


def cli_env(home: Path, endpoint: str) -> dict[str, str]:
    return {**os.environ, **TEST_SLOTS, "AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": REGION,
            **FAKE_AWS, "LOCAL_ULTRACLUSTER_HOME": str(home), "LOCAL_UC_PROVISIONING_DELAY": "0",
            # The compute nodes' Neuron venv (/opt/aws_neuron_venv_pytorch) is the training venv.
            "LOCAL_UC_TRAINING_VENV": str(TRAINING_VENV)}


def run_pcluster(env: dict[str, str], *args: str, timeout: float = CLI_TIMEOUT_S) -> tuple[int, Any]:
    """Run the real pcluster binary; returns (exit code, parsed stdout JSON or None if not JSON)."""
    done = subprocess.run([str(PCLUSTER_BIN), *args], env=env, capture_output=True, text=True, timeout=timeout)
    try:
        parsed = json.loads(done.stdout) if done.stdout.strip() else None
    except json.JSONDecodeError:
        parsed = None
    if parsed is None and done.returncode == 0:
        raise AssertionError(f"pcluster {args} printed no JSON: {done.stdout!r} {done.stderr!r}")
    return done.returncode, parsed


def run_admin(env: dict[str, str], *args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([str(ADMIN_BIN), *args], env=env, capture_output=True, text=True, timeout=timeout)


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmd and int(pid) != os.getpid():
            found.append(f"{pid}: {cmd}")
    return found


@contextmanager
def prepared_home(endpoint: str) -> Iterator[Path]:
    """A fresh home after `local-ultracluster up --no-moto`; `down` and removal afterwards."""
    # Under /tmp and searchable by all: the cluster user must reach files inside cluster dirs.
    home = Path(tempfile.mkdtemp(prefix="uc-cli-", dir="/tmp"))
    home.chmod(0o755)
    env = cli_env(home, endpoint)
    try:
        done = run_admin(env, "up", "--no-moto", "--endpoint", endpoint)
        assert done.returncode == 0, f"local-ultracluster up failed: {done.stdout} {done.stderr}"
        yield home
    finally:
        run_admin(env, "down")
        leftovers = processes_mentioning(str(home))
        shutil.rmtree(home, ignore_errors=True)
        assert leftovers == [], f"processes left running: {leftovers}"


@pytest.fixture
def uc_home(moto_server: str) -> Iterator[Path]:
    with prepared_home(moto_server) as home:
        yield home


@pytest.fixture
def uc_env(uc_home: Path, moto_server: str) -> dict[str, str]:
    return cli_env(uc_home, moto_server)


@dataclass(frozen=True)
class UcNetwork:
    vpc_id: str
    subnet_id: str


@pytest.fixture
def uc_network(uc_env: dict[str, str]) -> Iterator[UcNetwork]:
    import boto3
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=uc_env["AWS_ENDPOINT_URL"],
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone=f"{REGION}a")
    network = UcNetwork(vpc_id=vpc, subnet_id=subnet["Subnet"]["SubnetId"])
    yield network
    # Best effort: a stack left by a failing test may still hold a security group in this VPC.
    for group in ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["SecurityGroups"]:
        if group["GroupName"] != "default":
            try:
                ec2.delete_security_group(GroupId=group["GroupId"])
            except Exception:
                pass
    try:
        ec2.delete_subnet(SubnetId=network.subnet_id)
        ec2.delete_vpc(VpcId=vpc)
    except Exception:
        pass


@pytest.fixture
def pcluster(uc_env: dict[str, str]) -> Callable[..., tuple[int, Any]]:
    return lambda *args, **kw: run_pcluster(uc_env, *args, **kw)


def cluster_config(subnet_id: str, *, static: int = 0, dynamic: int = 2, instance_type: str = "trn1.32xlarge",
                   queues: int = 1, key_name: str = KEY_NAME, tags: dict[str, str] | None = None,
                   accounting: bool = False) -> dict[str, Any]:
    """A valid ParallelCluster v3 config (as dict), shaped like the blog's trn1 cluster."""
    config: dict[str, Any] = {
        "Region": REGION,
        "Image": {"Os": "ubuntu2204"},
        "HeadNode": {"InstanceType": "c5.4xlarge", "Networking": {"SubnetId": subnet_id},
                     "Ssh": {"KeyName": key_name}},
        "Scheduling": {"Scheduler": "slurm", "SlurmSettings": {"ScaledownIdletime": 10}, "SlurmQueues": [
            {"Name": f"compute{i + 1}", "CapacityType": "ONDEMAND",
             "Networking": {"SubnetIds": [subnet_id], "PlacementGroup": {"Enabled": True}},
             "ComputeResources": [{"Name": "trn1", "InstanceType": instance_type, "MinCount": static,
                                   "MaxCount": static + dynamic, "Efa": {"Enabled": True}}]}
            for i in range(queues)]},
        "SharedStorage": [{"MountDir": "/fsx", "Name": "fsx", "StorageType": "FsxLustre",
                           "FsxLustreSettings": {"StorageCapacity": 1200, "DeploymentType": "SCRATCH_2"}}],
        # Tests reuse cluster names within a minute on one moto: the default (Retain) would keep the
        # log group /aws/parallelcluster/<name>-<minute> and refuse the next cluster of that name.
        "Monitoring": {"Logs": {"CloudWatch": {"Enabled": True, "DeletionPolicy": "Delete"}}},
    }
    if accounting:
        config["Scheduling"]["SlurmSettings"]["Database"] = {"Uri": "127.0.0.1:3306", "UserName": "slurm",
                                                             "PasswordSecretArn": "arn:aws:secretsmanager:x"}
    if tags:
        config["Tags"] = [{"Key": k, "Value": v} for k, v in tags.items()]
    return config


@pytest.fixture
def make_cluster_config(uc_home: Path, uc_network: UcNetwork) -> Callable[..., Path]:
    counter = iter(range(1_000_000))

    def make(mutate: Callable[[dict[str, Any]], None] | None = None, **kwargs: Any) -> Path:
        config = cluster_config(uc_network.subnet_id, **kwargs)
        if mutate:
            mutate(config)
        path = uc_home / "configs" / f"cluster-config-{next(counter)}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    return make


def wait_for_status(env: dict[str, str], name: str, wanted: set[str], timeout: float = 180) -> dict[str, Any]:
    """Poll describe-cluster until clusterStatus is in wanted; returns the last describe output."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        code, last = run_pcluster(env, "describe-cluster", "-n", name)
        if code == 0 and last["clusterStatus"] in wanted:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{name} never reached {wanted}; last describe: {last}")


def wait_until_gone(env: dict[str, str], name: str, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        code, last = run_pcluster(env, "describe-cluster", "-n", name)
        if code == 1 and "does not exist" in last.get("message", ""):
            return last
        time.sleep(0.5)
    raise AssertionError(f"{name} still exists; last describe: {last}")
