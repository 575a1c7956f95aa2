"""`local-ultracluster up/status/down`: its own moto server, buckets, key pair, dataset, airflow.env; idempotent;
down leaves nothing running or listening."""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from tests.fixtures_localcluster import (
    FAKE_AWS,
    REGION,
    TEST_SLOTS,
    cluster_config,
    free_port,
    processes_mentioning,
    run_admin,
    run_pcluster,
    wait_for_status,
    wait_until_gone,
)

pytestmark = pytest.mark.localcluster

DATASET_KEY = ("training_datasets/bert_pretrain_wikicorpus_tokenized_hdf5/"
               "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128.tar")


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def own_home() -> Iterator[tuple[Path, dict[str, str], int]]:
    """A home whose moto is started by `up` itself on a free port (not the shared session server)."""
    home = Path(tempfile.mkdtemp(prefix="uc-admin-", dir="/tmp"))
    home.chmod(0o755)
    port = free_port()
    env = {**os.environ, **TEST_SLOTS, "LOCAL_ULTRACLUSTER_HOME": str(home), "AWS_DEFAULT_REGION": REGION,
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "LOCAL_UC_PROVISIONING_DELAY": "0"}
    try:
        yield home, env, port
    finally:
        run_admin(env, "down")
        pid_file = home / "moto.pid"
        if pid_file.exists():   # down failed to stop it: do not leak the server
            subprocess.run(["kill", "-9", str(json.loads(pid_file.read_text())["pid"])], check=False)
        shutil.rmtree(home, ignore_errors=True)


def s3(env: dict[str, str]) -> Any:
    return boto3.client("s3", region_name=REGION, endpoint_url=env["AWS_ENDPOINT_URL"],
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def ec2(env: dict[str, str]) -> Any:
    return boto3.client("ec2", region_name=REGION, endpoint_url=env["AWS_ENDPOINT_URL"],
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def small_dataset_tar(directory: Path) -> Path:
    source = directory / "pretrain_training_0.hdf5"
    source.write_bytes(os.urandom(64 * 1024))
    tar = directory / "dataset.tar"
    with tarfile.open(tar, "w") as archive:
        archive.add(source, arcname=source.name)
    return tar


def sourced_env(env_file: Path) -> dict[str, str]:
    """What scripts/env.sh gets: the file sourced by bash with `set -a`."""
    done = subprocess.run(["bash", "-c", f"set -a; . {env_file}; env -0"], capture_output=True, check=True,
                          env={"PATH": os.environ["PATH"]})
    return dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)


def test_up_is_idempotent_writes_connections_and_down_stops_moto(
        own_home: tuple[Path, dict[str, str], int]) -> None:
    home, env, port = own_home
    tar = small_dataset_tar(home)
    done = run_admin(env, "up", "--endpoint", env["AWS_ENDPOINT_URL"], "--dataset-tar", str(tar))
    assert done.returncode == 0, done.stderr
    assert f"AWS_ENDPOINT_URL={env['AWS_ENDPOINT_URL']}" in done.stdout
    assert listening(port)
    moto_pid = json.loads((home / "moto.pid").read_text())["pid"]

    assert {"neuron-s3", "ultracluster-artifacts"} <= {b["Name"] for b in s3(env).list_buckets()["Buckets"]}
    assert s3(env).get_object(Bucket="neuron-s3", Key=DATASET_KEY)["Body"].read() == tar.read_bytes()
    private_key = home / "keys" / "ultracluster-local"
    assert stat.S_IMODE(private_key.stat().st_mode) == 0o600
    public_key = private_key.with_suffix(".pub").read_text()
    assert public_key.startswith("ssh-ed25519 ")
    assert ec2(env).describe_key_pairs(KeyNames=["ultracluster-local"])["KeyPairs"]

    connections = sourced_env(home / "airflow.env")
    assert connections["ULTRACLUSTER_PROFILE"] == "local"
    aws_conn = json.loads(connections["AIRFLOW_CONN_AWS_DEFAULT"])
    assert aws_conn["conn_type"] == "aws" and aws_conn["extra"]["endpoint_url"] == env["AWS_ENDPOINT_URL"]
    # The local credentials are recognisable fakes (tests/log_scan.py), the same for Airflow and the CLI.
    assert {"AWS_ACCESS_KEY_ID": aws_conn["login"], "AWS_SECRET_ACCESS_KEY": aws_conn["password"]} == FAKE_AWS
    # The moto it started is the local UltraCluster's: capacity reservations for any client.
    assert ec2(env).describe_capacity_reservations()["CapacityReservations"] == []
    head_conn = json.loads(connections["AIRFLOW_CONN_ULTRACLUSTER_HEAD_NODE"])
    assert (head_conn["conn_type"], head_conn["port"]) == ("ssh", 2222)
    assert head_conn["extra"]["key_file"] == str(private_key)
    pcluster_conn = json.loads(connections["AIRFLOW_CONN_PCLUSTER_DEFAULT"])["extra"]
    assert pcluster_conn["region"] == REGION
    assert {k: pcluster_conn["env"][k] for k in FAKE_AWS} == FAKE_AWS
    # The connection is enough to drive the CLI: its binary with its env, nothing else.
    version = subprocess.run([pcluster_conn["binary"], "list-clusters"], capture_output=True, text=True,
                             env={"PATH": os.environ["PATH"], **pcluster_conn["env"]})
    assert (version.returncode, json.loads(version.stdout)) == (0, {"clusters": []})

    again = run_admin(env, "up", "--endpoint", env["AWS_ENDPOINT_URL"], "--dataset-tar", str(tar))
    assert again.returncode == 0, again.stderr
    assert "already answering" in again.stdout and "already there" in again.stdout
    assert json.loads((home / "moto.pid").read_text())["pid"] == moto_pid
    assert private_key.with_suffix(".pub").read_text() == public_key

    status = run_admin(env, "status")
    assert status.returncode == 0
    reported = json.loads(status.stdout)
    assert reported["moto"] == {"endpoint": env["AWS_ENDPOINT_URL"], "answers": True, "pid": moto_pid,
                                "alive": True}

    down = run_admin(env, "down")
    assert down.returncode == 0, down.stderr
    assert not listening(port)
    assert not (home / "moto.pid").exists()
    assert processes_mentioning(f"-p {port}") == []

    # moto state died with the server: a second `up` re-creates everything.
    back = run_admin(env, "up", "--endpoint", env["AWS_ENDPOINT_URL"], "--dataset-tar", str(tar))
    assert back.returncode == 0, back.stderr
    assert "uploaded" in back.stdout
    assert ec2(env).describe_key_pairs(KeyNames=["ultracluster-local"])["KeyPairs"]
    assert private_key.with_suffix(".pub").read_text() == public_key


def test_up_refuses_an_endpoint_off_loopback(own_home: tuple[Path, dict[str, str], int]) -> None:
    home, env, _ = own_home
    done = run_admin({**env, "AWS_ENDPOINT_URL": "http://192.0.2.1:5055"}, "up")
    assert done.returncode == 1
    assert "loopback" in done.stderr
    assert not (home / "moto.pid").exists()


def test_up_no_moto_fails_when_nothing_answers(own_home: tuple[Path, dict[str, str], int]) -> None:
    _, env, port = own_home
    done = run_admin(env, "up", "--no-moto")
    assert done.returncode == 1 and "--no-moto" in done.stderr
    assert not listening(port)


def test_down_tears_down_every_cluster(own_home: tuple[Path, dict[str, str], int]) -> None:
    home, env, port = own_home
    assert run_admin(env, "up").returncode == 0
    vpc = ec2(env).create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2(env).create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    for name, tags, static in (("waiting", {"local-ultracluster:provisioning-delay": "600"}, 0),
                               ("running", {}, 1)):
        path = home / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cluster_config(subnet, static=static, dynamic=1, tags=tags)))
        code, out = run_pcluster(env, "create-cluster", "-n", name, "-c", str(path))
        assert code == 0, out
    running = wait_for_status(env, "running", {"CREATE_COMPLETE", "CREATE_FAILED"}, timeout=240)
    assert running["clusterStatus"] == "CREATE_COMPLETE"
    status = json.loads(run_admin(env, "status").stdout)
    assert {c["clusterName"] for c in status["clusters"]} == {"waiting", "running"}

    down = run_admin(env, "down")
    assert down.returncode == 0, down.stderr
    assert "cluster running torn down" in down.stdout and "cluster waiting torn down" in down.stdout
    assert processes_mentioning(str(home)) == []
    assert not listening(port)
    assert not (home / "clusters" / "running").exists() and not (home / "clusters" / "waiting").exists()
    head_ip = running["headNode"]["privateIpAddress"]
    with socket.socket() as sock:
        sock.settimeout(0.5)
        assert sock.connect_ex((head_ip, 2222)) != 0


def test_reap_deletes_a_cluster_whose_worker_died(uc_env: dict[str, str], uc_home: Path,
                                                  make_cluster_config: Any) -> None:
    code, out = run_pcluster(uc_env, "create-cluster", "-n", "orphan", "-c",
                             str(make_cluster_config(tags={"local-ultracluster:provisioning-delay": "600"})))
    assert code == 0, out
    worker = json.loads((uc_home / "clusters" / "orphan" / "cluster.json").read_text())["createWorkerPid"]
    untouched = run_admin(uc_env, "reap")
    assert untouched.returncode == 0 and "orphan" not in untouched.stdout   # its worker is alive
    os.kill(worker, 9)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{worker}/cmdline").exists() and Path(f"/proc/{worker}/cmdline").read_bytes() and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    reaped = run_admin(uc_env, "reap")
    assert reaped.returncode == 0, reaped.stderr
    assert "reaped orphan (CREATE_IN_PROGRESS, worker gone)" in reaped.stdout
    assert run_pcluster(uc_env, "describe-cluster", "-n", "orphan")[0] == 1
    cfn = boto3.client("cloudformation", region_name=REGION, endpoint_url=uc_env["AWS_ENDPOINT_URL"],
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    stacks = cfn.list_stacks()["StackSummaries"]
    assert all(s["StackStatus"] == "DELETE_COMPLETE" for s in stacks if s["StackName"] == "orphan")


def test_reap_deletes_stacks_whose_cluster_state_was_wiped(uc_env: dict[str, str], uc_home: Path,
                                                           make_cluster_config: Any) -> None:
    config = make_cluster_config(tags={"local-ultracluster:provisioning-delay": "600"})
    assert run_pcluster(uc_env, "create-cluster", "-n", "wiped", "-c", str(config))[0] == 0
    worker = json.loads((uc_home / "clusters" / "wiped" / "cluster.json").read_text())["createWorkerPid"]
    os.kill(worker, 9)
    shutil.rmtree(uc_home / "clusters" / "wiped")
    # The name stays taken while moto still holds the stack, as with pcluster.
    code, out = run_pcluster(uc_env, "create-cluster", "-n", "wiped", "-c", str(config))
    assert (code, out) == (1, {"message": "Bad Request: Cluster wiped already exists."})
    reaped = run_admin(uc_env, "reap")
    assert "deleted orphan stack wiped (its cluster state is gone)" in reaped.stdout, reaped.stdout
    code, out = run_pcluster(uc_env, "create-cluster", "-n", "wiped", "-c", str(config))
    assert code == 0, out
    assert run_pcluster(uc_env, "delete-cluster", "-n", "wiped")[0] == 0
    wait_until_gone(uc_env, "wiped")
