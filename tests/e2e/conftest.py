"""End-to-end fixtures, shared by every end-to-end test of the session:

    e2e_home      one local UltraCluster home (moto, buckets, key pair, the dataset in moto)
    deployment    the environment an Airflow process needs to run trn1_bert_pretrain against it
    airflow_local a real Airflow (api-server, scheduler, dag-processor, triggerer on PostgreSQL)
                  started by scripts/airflow.sh, as `make up` starts it, on free loopback ports
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures_localcluster import REGION, cli_env, free_port, prepared_home, processes_mentioning, run_pcluster

REPO = Path(__file__).resolve().parents[2]
VENVS = REPO / ".venvs"
DAG_ID = "trn1_bert_pretrain"
DATASET_NAME = "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128"
DATASET_KEY = f"training_datasets/bert_pretrain_wikicorpus_tokenized_hdf5/{DATASET_NAME}.tar"
TASK_IDS = {"preflight", "create_vpc", "render_config", "pcluster_create", "wait_for_fleet", "download_data",
            "restore_compile_cache", "restore_checkpoint", "parallel_compile", "train", "save_compile_cache", "collect_results",
            "save_failure_artifacts", "delete_cluster", "delete_vpc"}
RUN_TIMEOUT_S = 1200
NODE_CAP = 4  # the shared Airflow's max_live_nodes
FAULT_SETTINGS = Path(__file__).with_name("fault_settings") / "airflow_local_settings.py"
# Its sitecustomize records every AWS call of the shared deployment's processes (test_pipeline.py's
# least-privilege test reads the file named by UC_AWS_CALL_LOG in airflow_local's env).
AWS_CALL_RECORDER = REPO / "tests" / "fixtures" / "aws_call_recorder"
RUNTIME_READY = os.geteuid() == 0 and bool(shutil.which("slurmctld")) and Path("/usr/sbin/sshd").exists()


def s3_client(endpoint: str):
    import boto3
    return boto3.client("s3", region_name=REGION, endpoint_url=endpoint,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture(scope="session")
def dataset_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local dataset, built once (reused from UC_TRAINING_DATASET_CACHE, which `make test` sets)."""
    python = VENVS / "training" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python} missing: run `make setup`")
    cache = Path(os.environ.get("UC_TRAINING_DATASET_CACHE") or tmp_path_factory.mktemp("dataset"))
    done = subprocess.run(["bash", str(REPO / "scripts" / "build_local_dataset.sh"), str(cache)],
                          env={**os.environ, "TRAINING_PYTHON": str(python)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as `local-ultracluster up` writes them (values may be single-quoted)."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip().removeprefix("export ").strip()] = value
    return values


@pytest.fixture(scope="session")
def e2e_home(moto_server: str, dataset_tar: Path) -> Iterator[Path]:
    """One local UltraCluster home for every end-to-end run (runs never share a cluster or a VPC)."""
    with prepared_home(moto_server) as home:
        s3_client(moto_server).upload_file(str(dataset_tar), "neuron-s3", DATASET_KEY)
        yield home


def _deployment_env(home: Path, endpoint: str) -> dict[str, str]:
    return {**cli_env(home, endpoint), **read_env_file(home / "airflow.env")}


@pytest.fixture
def deployment(e2e_home: Path, moto_server: str, tmp_path: Path) -> dict[str, str]:
    """Environment for an Airflow process of its own: the connections of the shared home, the local
    profile, a private AIRFLOW_HOME. The dataset is in moto under the seed's key."""
    airflow_home = tmp_path / "airflow"
    (airflow_home / "plugins").mkdir(parents=True)
    return {
        **_deployment_env(e2e_home, moto_server),
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(airflow_home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "ULTRACLUSTER_PROFILE": "local",
        "PATH": f"{VENVS / 'airflow' / 'bin'}:{os.environ.get('PATH', '')}",
    }


class AirflowApi:
    """The REST API of a running Airflow, logged in as admin."""

    def __init__(self, base: str, password: str) -> None:
        self.base = base
        self.password = password
        self.token: str | None = None

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(self.base + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        # An API server on a loaded 2-core machine answers slowly.
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read() or b"{}")

    def login(self) -> None:
        self.token = self.call("POST", "/auth/token", {"username": "admin", "password": self.password})["access_token"]

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        """The dag-processor parses the file a few seconds after start."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.call("GET", f"/api/v2/dags/{dag_id}")
                return
            except urllib.error.HTTPError as err:
                assert err.code == 404 and time.monotonic() < deadline, err
                time.sleep(2)

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
            if state in ("success", "failed"):
                return state
            assert time.monotonic() < deadline, f"run {run_id} still {state} after {timeout} s"
            time.sleep(3)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        tis = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti["state"] for ti in tis}


def start_airflow(env: dict[str, str], home: Path, password: str | None = None) -> tuple[AirflowApi, dict[str, str]]:
    """scripts/airflow.sh start, as `make up` runs it, in its own AIRFLOW_HOME on a free port."""
    port = free_port()
    home.mkdir(parents=True, exist_ok=True)
    password = password or f"e2e-{port}"
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    # Its own PostgreSQL, stopped and removed with Airflow. Under /tmp and searchable: the postgres
    # user cannot reach pytest's tmp dirs.
    pg_home = Path(tempfile.mkdtemp(prefix="uc-pg-", dir="/tmp"))
    pg_home.chmod(0o755)
    env = {**env, "AIRFLOW_HOME": str(home), "AIRFLOW_PORT": str(port),
           "ULTRACLUSTER_PG_HOME": str(pg_home), "ULTRACLUSTER_PG_PORT": str(free_port())}
    done = subprocess.run(["bash", str(REPO / "scripts" / "airflow.sh"), "start"], env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        stop_airflow(env)
        pytest.fail(f"scripts/airflow.sh start failed: {done.stdout}{done.stderr}")
    api = AirflowApi(f"http://127.0.0.1:{port}", password)
    api.login()
    return api, env


def stop_airflow(env: dict[str, str]) -> None:
    # Components a test killed and restarted (fault_actions.restart_component) run in groups of their own.
    groups = Path(env["AIRFLOW_HOME"]) / "extra-process-groups"
    for pgid in groups.read_text().split() if groups.exists() else []:
        try:
            os.killpg(int(pgid), 9)
        except ProcessLookupError:
            pass
    subprocess.run(["bash", str(REPO / "scripts" / "airflow.sh"), "stop"], env=env, capture_output=True,
                   timeout=120)
    shutil.rmtree(env["ULTRACLUSTER_PG_HOME"], ignore_errors=True)


# Recognisable secrets of the shared deployment (moto takes any credentials): no log, XCom or rendered
# field may ever hold them (test_pipeline.py's last test looks).
SECRETS = {
    "aws_secret_access_key": f"ucSecretAwsKey{secrets.token_hex(8)}",
    "aws_session_token": f"ucSecretSessionToken{secrets.token_hex(8)}",
    "api_password": f"uc-secret-api-{secrets.token_hex(6)}",
}


def _with_secret_aws_credentials(env: dict[str, str]) -> dict[str, str]:
    aws = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
    aws["password"] = SECRETS["aws_secret_access_key"]
    aws["extra"] = {**aws.get("extra", {}), "aws_session_token": SECRETS["aws_session_token"]}
    return {**env, "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(aws)}


@pytest.fixture(scope="session")
def airflow_local(e2e_home: Path, moto_server: str, tmp_path_factory: pytest.TempPathFactory):
    """A real Airflow with the local profile, shared by the REST and browser tests; stopped afterwards."""
    # A node cap (docs/operations.md, Concurrency): a 2-node cluster and a 3-node one never overlap.
    home = tmp_path_factory.mktemp("airflow-local")
    # Test-only fault injection (test_fault_matrix.py): a cluster policy in AIRFLOW_HOME/config that
    # hits only the runs with a fault file in UC_E2E_FAULT_DIR; 5 s retry delays, concurrent runs.
    (home / "config").mkdir()
    shutil.copy(FAULT_SETTINGS, home / "config" / "airflow_local_settings.py")
    (home / "faults").mkdir()
    env = {**_with_secret_aws_credentials(_deployment_env(e2e_home, moto_server)), "ULTRACLUSTER_PROFILE": "local",
           "ULTRACLUSTER_MAX_LIVE_NODES": str(NODE_CAP), "UC_E2E_FAULT_DIR": str(home / "faults"),
           "UC_E2E_RETRY_DELAY_S": "5", "UC_E2E_MAX_ACTIVE_RUNS": "16",
           "UC_AWS_CALL_LOG": str(tmp_path_factory.mktemp("aws-calls") / "calls.jsonl"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(AWS_CALL_RECORDER), os.environ.get("PYTHONPATH")]))}
    api, env = start_airflow(env, home, password=SECRETS["api_password"])
    try:
        api.wait_for_dag(DAG_ID)
        yield api, env
    finally:
        stop_airflow(env)


def assert_nothing_left(env: dict[str, str], uc_home: Path) -> None:
    """No cluster, no live stack, no VPC but moto's default, no Slurm/sshd daemon of this home."""
    import boto3
    code, listed = run_pcluster(env, "list-clusters")
    assert code == 0 and listed["clusters"] == [], listed
    kwargs = dict(region_name=REGION, endpoint_url=env["AWS_ENDPOINT_URL"],
                  aws_access_key_id="testing", aws_secret_access_key="testing")
    stacks = boto3.client("cloudformation", **kwargs).list_stacks()["StackSummaries"]
    live = [s["StackName"] for s in stacks if s["StackStatus"] != "DELETE_COMPLETE"]
    assert live == [], f"stacks left: {live}"
    ec2 = boto3.client("ec2", **kwargs)
    vpcs = [v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"] if not v.get("IsDefault")]
    assert vpcs == [], f"VPCs left: {vpcs}"
    nats = [n["NatGatewayId"] for n in ec2.describe_nat_gateways()["NatGateways"] if n["State"] != "deleted"]
    assert nats == [], f"NAT gateways left: {nats}"
    eips = [a.get("AllocationId") or a.get("PublicIp") for a in ec2.describe_addresses()["Addresses"]]
    assert eips == [], f"Elastic IPs left: {eips}"
    # No slurmctld, slurmd, sshd, munged or agent of this home: no Slurm job can be left either.
    assert processes_mentioning(str(uc_home)) == []
    assert not any((uc_home / "clusters").glob("*/cluster.json")), "cluster state left"
    # A cluster's directory holds its shared storage, so the runs' job directories and scratch on it.
    left = sorted(p.name for p in (uc_home / "clusters").glob("*") if p.is_dir()) if (uc_home / "clusters").exists() else []
    assert left == [], f"cluster directories (shared storage, job directories) left: {left}"


def results_in_s3(env: dict[str, str], prefix: str) -> dict[str, int]:
    s3 = s3_client(env["AWS_ENDPOINT_URL"])
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="ultracluster-artifacts", Prefix=prefix)
    return {obj["Key"]: obj["Size"] for page in pages for obj in page.get("Contents", [])}
