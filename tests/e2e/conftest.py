"""End-to-end fixtures: a local deployment (moto + local UltraCluster home + the dataset in moto) and
the environment an Airflow process needs to run trn1_bert_pretrain against it."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures_localcluster import REGION, processes_mentioning, run_pcluster

REPO = Path(__file__).resolve().parents[2]
VENVS = REPO / ".venvs"
DAG_ID = "trn1_bert_pretrain"
DATASET_NAME = "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128"
DATASET_KEY = f"training_datasets/bert_pretrain_wikicorpus_tokenized_hdf5/{DATASET_NAME}.tar"


def _s3(endpoint: str):
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


@pytest.fixture
def deployment(uc_home: Path, uc_env: dict[str, str], moto_server: str, dataset_tar: Path,
               tmp_path: Path) -> dict[str, str]:
    """Environment for an Airflow process: the connections of this local UltraCluster home, the local
    profile, a private AIRFLOW_HOME. The dataset is in moto under the seed's key."""
    _s3(moto_server).upload_file(str(dataset_tar), "neuron-s3", DATASET_KEY)
    airflow_home = tmp_path / "airflow"
    (airflow_home / "plugins").mkdir(parents=True)
    return {
        **uc_env,
        **read_env_file(uc_home / "airflow.env"),
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(airflow_home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "ULTRACLUSTER_PROFILE": "local",
        "ULTRACLUSTER_TRAINING_PYTHON": str(VENVS / "training" / "bin" / "python"),
        "PATH": f"{VENVS / 'airflow' / 'bin'}:{os.environ.get('PATH', '')}",
    }


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
    assert processes_mentioning(str(uc_home)) == []
    assert not any((uc_home / "clusters").glob("*/cluster.json")), "cluster state left"


def results_in_s3(env: dict[str, str], prefix: str) -> dict[str, int]:
    s3 = _s3(env["AWS_ENDPOINT_URL"])
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="ultracluster-artifacts", Prefix=prefix)
    return {obj["Key"]: obj["Size"] for page in pages for obj in page.get("Contents", [])}
