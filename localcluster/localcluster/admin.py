"""`local-ultracluster`: bring the AWS stand-in up and down, and show what runs.

    local-ultracluster up [--endpoint URL] [--no-moto] [--dataset-tar PATH]
    local-ultracluster down
    local-ultracluster status
    local-ultracluster reap
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from . import state
from .aws import FAKE_CREDENTIALS, Aws, region_from_env
from .spec import default_user
from .worker import pid_alive, worker_alive

DEFAULT_ENDPOINT = "http://127.0.0.1:5055"
BUCKETS = ("neuron-s3", "ultracluster-artifacts")
KEY_NAME = "ultracluster-local"
DATASET_BUCKET = "neuron-s3"
DATASET_KEY = ("training_datasets/bert_pretrain_wikicorpus_tokenized_hdf5/"
               "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128.tar")
MOTO_START_TIMEOUT_S = 30.0


class AdminError(Exception):
    pass


# --- moto ----------------------------------------------------------------------------------------

def endpoint_answers(endpoint: str) -> bool:
    """Any HTTP answer counts; moto's root is S3 ListBuckets, cheap unlike /moto-api/data.json."""
    try:
        with urllib.request.urlopen(f"{endpoint.rstrip('/')}/", timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _loopback_host_port(endpoint: str) -> tuple[str, int]:
    parsed = urlparse(endpoint)
    host, port = parsed.hostname or "", parsed.port or 80
    if not host.startswith("127."):
        raise AdminError(f"refusing to start moto on {host!r}: only loopback (127.0.0.0/8) endpoints are allowed")
    return host, port


def moto_pid_file(home: Path) -> Path:
    return home / "moto.pid"


def start_moto(home: Path, endpoint: str) -> int:
    host, port = _loopback_host_port(endpoint)
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "moto.log", "ab") as log:
        # moto with the stack deletes it lacks (localcluster/moto_server.py)
        process = subprocess.Popen([sys.executable, "-m", "localcluster.moto_server", "-H", host, "-p", str(port)], stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=log, start_new_session=True, close_fds=True)
    moto_pid_file(home).write_text(json.dumps({"pid": process.pid, "endpoint": endpoint}))
    deadline = time.monotonic() + MOTO_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if endpoint_answers(endpoint):
            return process.pid
        if process.poll() is not None:
            raise AdminError(f"moto_server exited with {process.returncode}; see {logs / 'moto.log'}")
        time.sleep(0.2)
    raise AdminError(f"moto_server did not answer on {endpoint} within {MOTO_START_TIMEOUT_S:.0f}s")


def _moto_alive(pid: int) -> bool:
    """pid is still the moto_server we started, not a recycled pid of another program."""
    try:
        return pid_alive(pid) and b"moto_server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_moto(home: Path) -> str | None:
    pid_file = moto_pid_file(home)
    if not pid_file.exists():
        return None
    pid = int(json.loads(pid_file.read_text())["pid"])
    if _moto_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _moto_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _moto_alive(pid):
            os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    return f"moto_server[{pid}]"


# --- resources in moto -----------------------------------------------------------------------------

def ensure_key_pair(home: Path, aws: Aws) -> Path:
    keys = home / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    keys.chmod(0o755)
    private = keys / KEY_NAME
    if not private.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", KEY_NAME, "-f", str(private)],
                       check=True)
    private.chmod(0o600)
    public = private.with_suffix(".pub")
    public.chmod(0o644)
    # Re-import every time: moto may hold another home's key of the same name, or none after a restart.
    ec2 = aws.client("ec2")
    if aws.key_pair_exists(KEY_NAME):
        ec2.delete_key_pair(KeyName=KEY_NAME)
    ec2.import_key_pair(KeyName=KEY_NAME, PublicKeyMaterial=public.read_bytes())
    return private


def upload_dataset(aws: Aws, tar: Path) -> str:
    s3 = aws.client("s3")
    try:
        if s3.head_object(Bucket=DATASET_BUCKET, Key=DATASET_KEY)["ContentLength"] == tar.stat().st_size:
            return "already there"
    except Exception:
        pass
    s3.upload_file(str(tar), DATASET_BUCKET, DATASET_KEY)
    return "uploaded"


def airflow_env_text(home: Path, endpoint: str, region: str, private_key: Path) -> str:
    pcluster = str(Path(sys.executable).with_name("pcluster"))
    cli_env = {"AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": region, "LOCAL_ULTRACLUSTER_HOME": str(home),
               **FAKE_CREDENTIALS}
    if os.environ.get("LOCAL_UC_TRAINING_VENV"):   # the compute nodes' Neuron venv (runtime/neuron_tools.py)
        cli_env["LOCAL_UC_TRAINING_VENV"] = os.environ["LOCAL_UC_TRAINING_VENV"]
    connections = {
        "AIRFLOW_CONN_AWS_DEFAULT": {
            "conn_type": "aws", "login": FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "password": FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "extra": {"region_name": region, "endpoint_url": endpoint}},
        "AIRFLOW_CONN_PCLUSTER_DEFAULT": {
            "conn_type": "pcluster", "extra": {"binary": pcluster, "region": region, "env": cli_env}},
        "AIRFLOW_CONN_ULTRACLUSTER_HEAD_NODE": {
            # The default user of ubuntu2204, the profiles' Image.Os (a node's user follows its Image.Os).
            "conn_type": "ssh", "login": default_user("ubuntu2204"),
            "port": int(os.environ.get("LOCAL_UC_SSH_PORT", "2222")),
            "extra": {"key_file": str(private_key)}},
    }
    lines = ["# Written by `local-ultracluster up`; sourced with `set -a` by scripts/env.sh."]
    lines += [f"{name}={shlex.quote(json.dumps(value))}" for name, value in connections.items()]
    lines.append("ULTRACLUSTER_PROFILE=local")
    return "\n".join(lines) + "\n"


def up(home: Path, endpoint: str, start: bool, dataset_tar: Path | None) -> list[str]:
    done: list[str] = []
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o755)   # the cluster user must traverse into cluster dirs
    _loopback_host_port(endpoint)   # before any probe: never send traffic off the machine
    if endpoint_answers(endpoint):
        done.append(f"moto already answering at {endpoint}")
    elif start:
        done.append(f"started moto_server[{start_moto(home, endpoint)}] at {endpoint}")
    else:
        raise AdminError(f"nothing answers at {endpoint} and --no-moto was given")
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    for name, value in FAKE_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    region = region_from_env()
    aws = Aws(region)
    for bucket in BUCKETS:
        aws.ensure_bucket(bucket)
    done.append(f"buckets: {', '.join(BUCKETS)}")
    private_key = ensure_key_pair(home, aws)
    done.append(f"key pair {KEY_NAME} imported; private key {private_key}")
    if dataset_tar:
        if not dataset_tar.is_file():
            raise AdminError(f"dataset tar {dataset_tar} does not exist")
        done.append(f"dataset s3://{DATASET_BUCKET}/{DATASET_KEY}: {upload_dataset(aws, dataset_tar)}")
    env_file = home / "airflow.env"
    env_file.write_text(airflow_env_text(home, endpoint, region, private_key))
    done.append(f"wrote {env_file}")
    return done


# --- down / status / reap ------------------------------------------------------------------------

def _teardown_all_clusters(home: Path) -> list[str]:
    done: list[str] = []
    from .runtime import teardown
    for name in state.list_cluster_names(home) + _bare_cluster_dirs(home):
        try:
            region = state.read_state(name, home)["region"]
        except (state.ClusterNotFound, KeyError, ValueError):
            region = region_from_env()
        try:
            teardown(state.cluster_dir(name, home))
            done.append(f"cluster {name} torn down")
        except Exception as error:  # keep going: down must stop everything it can
            done.append(f"cluster {name}: teardown failed: {error}")
        try:
            Aws(region).delete_stack(name)   # else a moto that outlives us still says "already exists"
        except Exception as error:
            done.append(f"cluster {name}: stack not deleted: {error}")
    return done


def _bare_cluster_dirs(home: Path) -> list[str]:
    root = state.clusters_root(home)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not (p / "cluster.json").exists())


def _stop_workers(home: Path) -> list[str]:
    stopped = []
    for name in state.list_cluster_names(home):
        current = state.read_state(name, home)
        for key in ("createWorkerPid", "deleteWorkerPid", "fleetWorkerPid"):
            pid = current.get(key)
            if pid and worker_alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                    stopped.append(f"{name}: worker[{pid}]")
                except ProcessLookupError:
                    pass
    return stopped


def down(home: Path) -> list[str]:
    done = _stop_workers(home)
    done += _teardown_all_clusters(home)
    from .runtime import stop_everything
    done += stop_everything(home)
    stopped = stop_moto(home)
    if stopped:
        done.append(f"stopped {stopped}")
    return done


def status(home: Path, endpoint: str) -> dict[str, Any]:
    loopback = (urlparse(endpoint).hostname or "").startswith("127.")
    moto: dict[str, Any] = {"endpoint": endpoint, "answers": loopback and endpoint_answers(endpoint)}
    if moto_pid_file(home).exists():
        pid = json.loads(moto_pid_file(home).read_text())["pid"]
        moto.update(pid=pid, alive=_moto_alive(pid))
    clusters = []
    for name in state.list_cluster_names(home):
        current = state.read_state(name, home)
        workers = {k: current[k] for k in ("createWorkerPid", "deleteWorkerPid", "fleetWorkerPid")
                   if current.get(k) and worker_alive(current[k])}
        clusters.append({"clusterName": name, "cloudFormationStackStatus": current["cloudFormationStackStatus"],
                         "runningWorkers": workers,
                         "provisioned": (state.cluster_dir(name, home) / "runtime.json").exists()})
    return {"home": str(home), "moto": moto, "clusters": clusters}


def reap(home: Path) -> list[str]:
    """Delete clusters whose worker died mid-way (e.g. machine reboot), and stacks whose cluster state is gone."""
    done = []
    from .runtime import teardown
    for name in state.list_cluster_names(home):
        current = state.read_state(name, home)
        stuck_create = (current["cloudFormationStackStatus"] == "CREATE_IN_PROGRESS"
                        and not worker_alive(current.get("createWorkerPid")))
        stuck_delete = (current["cloudFormationStackStatus"] == "DELETE_IN_PROGRESS"
                        and not worker_alive(current.get("deleteWorkerPid")))
        if stuck_create or stuck_delete:
            teardown(state.cluster_dir(name, home))
            try:
                Aws(current["region"]).delete_stack(name)
            except Exception as error:
                done.append(f"{name}: stack not deleted: {error}")
            done.append(f"reaped {name} ({current['cloudFormationStackStatus']}, worker gone)")
    try:
        aws = Aws(region_from_env())
        for name in aws.stacks_of_home(home):
            if not state.cluster_dir(name, home).exists():
                aws.delete_stack(name)
                done.append(f"deleted orphan stack {name} (its cluster state is gone)")
    except Exception as error:  # moto down: nothing to reap there
        done.append(f"orphan stacks not checked: {error}")
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="local-ultracluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, default=None, help="state dir (default $LOCAL_ULTRACLUSTER_HOME)")
    subs = parser.add_subparsers(dest="command", required=True)
    up_parser = subs.add_parser("up", help="start moto if needed; buckets, key pair, dataset, airflow.env")
    up_parser.add_argument("--endpoint", default=os.environ.get("AWS_ENDPOINT_URL") or DEFAULT_ENDPOINT)
    up_parser.add_argument("--no-moto", action="store_true", help="never start moto; use what answers")
    up_parser.add_argument("--dataset-tar", type=Path)
    subs.add_parser("down", help="tear down every cluster, stop every daemon and our moto")
    status_parser = subs.add_parser("status", help="moto, clusters and worker pids as JSON")
    status_parser.add_argument("--endpoint", default=os.environ.get("AWS_ENDPOINT_URL") or DEFAULT_ENDPOINT)
    subs.add_parser("reap", help="delete clusters whose worker died mid-way")
    args = parser.parse_args(argv)
    home = (args.home or state.uc_home()).resolve()
    os.environ["LOCAL_ULTRACLUSTER_HOME"] = str(home)
    try:
        if args.command == "up":
            lines = up(home, args.endpoint, not args.no_moto, args.dataset_tar)
            print(f"AWS_ENDPOINT_URL={args.endpoint}")
        elif args.command == "down":
            lines = down(home)
        elif args.command == "status":
            print(json.dumps(status(home, args.endpoint), indent=2))
            return
        else:
            lines = reap(home)
    except AdminError as error:
        print(f"local-ultracluster {args.command}: {error}", file=sys.stderr)
        sys.exit(1)
    for line in lines:
        print(line)
