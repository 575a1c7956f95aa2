"""End-to-end fixtures, shared by every end-to-end test of the session:

    e2e_home      one local UltraCluster home (moto, buckets, key pair, the dataset in moto)
    enforced      a second local UltraCluster home on a second moto that enforces IAM, Airflow's user there
                  holding exactly include/cluster/iam/airflow-policy.json, and a dag.test() environment
                  signing as that user (docs/operations.md, "Least privilege")
    airflow_local a real Airflow (api-server, scheduler, dag-processor, triggerer on PostgreSQL)
                  started by scripts/airflow.sh, as `make up` starts it, on free loopback ports
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures_localcluster import (
    FAKE_AWS_CLIENT,
    REGION,
    cli_env,
    free_port,
    prepared_home,
    processes_mentioning,
    run_pcluster,
)
from tests.fixtures_enforced import Principal, client, make_user
from tests.iam_policy import AIRFLOW_POLICY, render_policy

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
    return boto3.client("s3", region_name=REGION, endpoint_url=endpoint, **FAKE_AWS_CLIENT)


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


def dag_test_env(home: Path, endpoint: str, airflow_home: Path) -> dict[str, str]:
    """Environment for a dag.test() process of its own: the connections of ``home``, the local
    profile, a private AIRFLOW_HOME. The dataset is in moto under the seed's key."""
    (airflow_home / "plugins").mkdir(parents=True, exist_ok=True)
    return {
        **_deployment_env(home, endpoint),
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(airflow_home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "ULTRACLUSTER_PROFILE": "local",
        "PATH": f"{VENVS / 'airflow' / 'bin'}:{os.environ.get('PATH', '')}",
    }


# --- the same pipeline under IAM enforcement (docs/operations.md, "Least privilege") ----------------
MOTO_ACCOUNT = "123456789012"
ENFORCED_USER = "uc-airflow"
ENFORCED_CACHE = "s3://ultracluster-artifacts/compile-cache/enforced"
AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


def policy_values(compile_cache_s3_uri: str) -> dict[str, str]:
    """airflow-policy.json's placeholders for the local profile, with that compile cache."""
    from ultracluster.run.profiles import load_profile
    from ultracluster.run.s3 import split_s3_uri

    profile = load_profile("local")
    dataset_bucket, dataset_key = split_s3_uri(profile["dataset_s3_uri"])
    artifacts_bucket, artifacts_prefix = split_s3_uri(profile["artifacts_s3_uri"])
    cache_bucket, cache_prefix = split_s3_uri(compile_cache_s3_uri)
    return {"region": REGION, "account-id": MOTO_ACCOUNT, "dataset-bucket": dataset_bucket, "dataset-key": dataset_key,
            "artifacts-bucket": artifacts_bucket, "artifacts-prefix": artifacts_prefix,
            "compile-cache-bucket": cache_bucket, "compile-cache-prefix": cache_prefix,
            "kms-key-arn": f"arn:aws:kms:{REGION}:{MOTO_ACCOUNT}:key/not-used-with-AES256"}


@dataclass(frozen=True)
class Enforced:
    home: Path
    env: dict[str, str]     # dag.test()'s: aws_default signs as ``airflow``; no AWS keys of its own
    airflow: Principal
    policy: dict
    conf: dict


@pytest.fixture(scope="session")
def enforced(enforced_moto: str, dataset_tar: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Enforced]:
    """The local UltraCluster on the enforcing moto (tests/fixtures/moto_enforced.py). Its own parts (the
    pcluster stand-in, Slurm's power programs, these fixtures) sign as the local cluster's principal;
    Airflow signs as ``uc-airflow``, which holds the shipped policy and nothing else."""
    from tests.integration.test_capacity_checks import capacity_block

    with prepared_home(enforced_moto) as home:
        s3_client(enforced_moto).upload_file(str(dataset_tar), "neuron-s3", DATASET_KEY)
        policy = render_policy(AIRFLOW_POLICY.read_text(), policy_values(ENFORCED_CACHE))
        airflow = make_user(enforced_moto, ENFORCED_USER, policy)
        # A Capacity Block, as a production run may train on: preflight reads it and the type's usage classes.
        block = capacity_block(client(enforced_moto, "ec2"))
        conf = {"compile_cache_s3_uri": ENFORCED_CACHE, "capacity_type": "CAPACITY_BLOCK",
                "capacity_reservation_id": block, "min_nodes": 2, "max_nodes": 2}
        env = {k: v for k, v in dag_test_env(home, enforced_moto, tmp_path_factory.mktemp("airflow-enforced")).items()
               if k not in AWS_KEYS}
        aws = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
        env["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps({**aws, "login": airflow.key, "password": airflow.secret})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(AWS_CALL_RECORDER), os.environ.get("PYTHONPATH")]))
        subprocess.run([str(VENVS / "airflow" / "bin" / "airflow"), "db", "migrate"], env=env, check=True,
                       capture_output=True, timeout=300)
        yield Enforced(home, env, airflow, policy, conf)


def run_dag_test(env: dict[str, str], conf: dict, name: str) -> tuple[dict, str, list[dict]]:
    """tests/e2e/run_dag_test.py in a process of its own: (its E2E_RESULT, its output, the AWS calls
    it recorded). The output is kept in out/e2e/<name>.log for a post-mortem (git-ignored)."""
    log = REPO / "out" / "e2e" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    calls_log = log.with_suffix(".calls.jsonl")
    calls_log.unlink(missing_ok=True)
    done = subprocess.run([str(VENVS / "airflow" / "bin" / "python"), str(REPO / "tests" / "e2e" / "run_dag_test.py"),
                           json.dumps(conf)], env={**env, "UC_AWS_CALL_LOG": str(calls_log)},
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    output = done.stdout + done.stderr
    log.write_text(output)
    lines = [line for line in done.stdout.splitlines() if line.startswith("E2E_RESULT ")]
    assert lines, f"no result line; rc={done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    calls = [json.loads(line) for line in calls_log.read_text().splitlines()] if calls_log.exists() else []
    return json.loads(lines[-1].removeprefix("E2E_RESULT ")), output, calls


def task_log(api, run_id: str, task_id: str, try_number: int = 1, dag_id: str = DAG_ID) -> str:
    """One try's whole log, through the REST API."""
    req = urllib.request.Request(f"{api.base}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/"
                                 f"{try_number}?full_content=true")
    req.add_header("Authorization", f"Bearer {api.token}")
    req.add_header("Accept", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:
        content = json.loads(resp.read())["content"]
    # Structured lines: the exception's message is in its error detail, not in "event".
    return "\n".join(json.dumps(line, ensure_ascii=False) if isinstance(line, dict) else str(line) for line in content)


def dag_test_task_log(output: str, task_id: str) -> str:
    """A task's lines in dag.test()'s output, between its start and end markers."""
    found = re.search(rf"\[DAG TEST\] starting task_id={task_id} .*?\[DAG TEST\] end task task_id={task_id} ",
                      output, re.DOTALL)
    assert found, f"no log of {task_id}"
    return found.group(0)


def airflow_calls(calls: list[dict]) -> list[dict]:
    """The recorded calls of the Airflow venv's processes; the pcluster CLI's own are the pcluster role's."""
    airflow_venv = (VENVS / "airflow").resolve()
    return [c for c in calls if Path(c["prefix"]).resolve() == airflow_venv
            and Path((c["argv"] or [""])[0]).name != "pcluster"]


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

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """One try's log as text (structured lines as JSON)."""
        req = urllib.request.Request(f"{self.base}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/"
                                     f"logs/{try_number}?full_content=true")
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        with urllib.request.urlopen(req, timeout=60) as resp:
            content = json.loads(resp.read())["content"]
        return "\n".join(json.dumps(line, ensure_ascii=False) if isinstance(line, dict) else str(line)
                         for line in content)

    def deferrals(self, dag_id: str, run_id: str, task_id: str) -> int:
        """How often the task deferred, over all its tries: its logs' "Pausing task as DEFERRED" lines."""
        ti = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")
        return sum(self.task_log(dag_id, run_id, task_id, attempt).count("Pausing task as DEFERRED")
                   for attempt in range(1, int(ti.get("try_number") or 1) + 1))


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


# Recognisable secrets of the shared deployment (moto takes any credentials), each with the local fakes'
# marker (tests/log_scan.py): no log, XCom or rendered field may ever hold them (test_pipeline.py and
# test_fault_matrix.py scan for them).
SECRETS = {
    "aws_secret_access_key": f"ucfakeSecretAwsKey{secrets.token_hex(11)}",   # 40 characters, as AWS's
    "aws_session_token": f"ucfakeSessionToken{secrets.token_hex(16)}",
    "api_password": f"ucfake-api-{secrets.token_hex(6)}",
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


def wait_all_runs_ended(api, dag_id: str = DAG_ID, timeout_s: float = RUN_TIMEOUT_S) -> None:
    """Until every run of ``dag_id`` is success or failed (e.g. the weekly tick an unpaused DAG with
    catchup=False runs once after a backfill), before checking that nothing is left."""
    deadline = time.monotonic() + timeout_s
    while any(r["state"] not in ("success", "failed")
              for r in api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100")["dag_runs"]):
        assert time.monotonic() < deadline, f"runs of {dag_id} still going after {timeout_s} s"
        time.sleep(5)


def assert_nothing_left(env: dict[str, str], uc_home: Path) -> None:
    """No cluster, no live stack, no VPC but moto's default, no Slurm/sshd daemon of this home."""
    import boto3
    code, listed = run_pcluster(env, "list-clusters")
    assert code == 0 and listed["clusters"] == [], listed
    kwargs = dict(region_name=REGION, endpoint_url=env["AWS_ENDPOINT_URL"], **FAKE_AWS_CLIENT)
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


def deployment_secrets(env: dict[str, str]) -> dict[str, str]:
    """The shared deployment's secret values as they would appear in text, by name: its AWS keys (Airflow's
    connection and the pcluster CLI's), the passwords file's values, the database password and the SSH
    private key's first body lines (tests/log_scan.py looks for each)."""
    aws = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
    cli = json.loads(env["AIRFLOW_CONN_PCLUSTER_DEFAULT"])["extra"]["env"]
    values = {"aws_default's access key id": aws["login"], "aws_default's secret key": aws["password"],
              "aws_default's session token": aws["extra"].get("aws_session_token", ""),
              "pcluster's secret key": cli.get("AWS_SECRET_ACCESS_KEY", "")}
    home = Path(env["AIRFLOW_HOME"])
    values.update({f"the passwords file's {user}": password
                   for user, password in json.loads((home / "passwords.json").read_text()).items()})
    values["the database password"] = (Path(env["ULTRACLUSTER_PG_HOME"]) / "password").read_text().strip()
    key_file = json.loads(env["AIRFLOW_CONN_ULTRACLUSTER_HEAD_NODE"])["extra"]["key_file"]
    body = [line for line in Path(key_file).read_text().splitlines() if line and "PRIVATE KEY" not in line]
    values.update({f"ssh private key line {i}": line for i, line in enumerate(body[:3], 1)})
    return values
