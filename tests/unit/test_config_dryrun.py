"""render_config's `pcluster create-cluster --dryrun true`, through ParallelClusterHook (a scripted pcluster).

The dry run comes after the node script's upload (pcluster checks the S3 objects a config names) and
before the config's: a refused config fails the task without retries, every validator message in the
log, and leaves no config in S3. The same dry run against the real pcluster and moto:
tests/unit/test_pcluster_real_schema.py.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from airflow.sdk.exceptions import AirflowFailException

from tests.fixtures.pcluster.fake_pcluster import FakePcluster
from tests.unit.test_config import RecordingTaskInstance, s3  # noqa: F401 - s3 is a fixture
from ultracluster.operators.cluster_config import RenderClusterConfigOperator
from ultracluster.parsers.pcluster import PclusterError
from ultracluster.run.names import cluster_name_for, safe_run_id
from ultracluster.run.profiles import load_profile

REGION = "us-east-1"
RUN_ID = "manual__2026-12-01T09:00:00+00:00"
CONN_ID = "pcluster_dryrun_unit"
NETWORK = {"public_subnet_id": "subnet-0123456789abcdef0", "private_subnet_id": "subnet-0fedcba9876543210",
           "security_group_id": None}
CONFIG_KEY = f"runs/trn1_bert_pretrain/{safe_run_id(RUN_ID)}/cluster-config.yaml"
SCRIPT_KEY = f"runs/trn1_bert_pretrain/{safe_run_id(RUN_ID)}/on_node_configured.sh"


def make_context() -> dict:
    return {"run_id": RUN_ID, "dag": SimpleNamespace(dag_id="trn1_bert_pretrain"), "ti": RecordingTaskInstance()}


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakePcluster:
    fake = FakePcluster(tmp_path / "pcluster")
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", fake.connection_json(region=REGION))
    return fake


def render_op(**overrides) -> RenderClusterConfigOperator:
    params = load_profile("production")
    kwargs = dict(
        task_id="render_config", network=NETWORK, cluster_name=None, region_name=REGION,
        key_name=params["key_name"], image_os=params["image_os"],
        head_node_instance_type=params["head_node_instance_type"], instance_type=params["instance_type"],
        min_nodes=params["min_nodes"], max_nodes=params["max_nodes"], extra_queues=[],
        artifacts_s3_uri="s3://ultracluster-artifacts/runs", ssh_allowed_cidr="203.0.113.0/24",
        pcluster_conn_id=CONN_ID,
    )
    kwargs.update(overrides)
    return RenderClusterConfigOperator(**kwargs)


def keys(s3) -> set[str]:
    return {o["Key"] for o in s3.list_objects_v2(Bucket="ultracluster-artifacts").get("Contents", [])}


def task_log(capfd) -> str:
    """The task's log lines (Airflow's task logger writes them to stdout)."""
    out, err = capfd.readouterr()
    return out + err


def test_dryrun_runs_before_the_config_is_uploaded(s3, fake, capfd):
    fake.respond("create-cluster", ("create_cluster_dryrun.json", 1))
    result = render_op(suppress_validators=["type:KeyPairValidator"]).execute(make_context())

    [argv] = fake.calls()
    assert argv[:3] == ["create-cluster", "--cluster-name", cluster_name_for(RUN_ID)]
    assert argv[argv.index("--dryrun") + 1] == "true"
    assert argv[argv.index("--suppress-validators") + 1] == "type:KeyPairValidator"  # as pcluster_create's
    assert argv[-2:] == ["--region", REGION]
    assert keys(s3) == {CONFIG_KEY, SCRIPT_KEY} and result["config_s3_key"] == CONFIG_KEY
    log = task_log(capfd)
    assert "pcluster dry run: WARNING AmiOsCompatibleValidator" in log
    assert "pcluster dry run passed" in log


def test_dryrun_sees_the_rendered_config(s3, fake, tmp_path, monkeypatch):
    """The file handed to pcluster is the config that is then uploaded."""
    seen = tmp_path / "seen.yaml"
    from ultracluster.hooks.parallelcluster import ParallelClusterHook

    original = ParallelClusterHook.create_cluster

    def spy(self, cluster_name, config_path, **kwargs):
        seen.write_text(Path(config_path).read_text())
        return original(self, cluster_name, config_path, **kwargs)

    monkeypatch.setattr(ParallelClusterHook, "create_cluster", spy)
    fake.respond("create-cluster", ("create_cluster_dryrun.json", 1))
    render_op().execute(make_context())
    uploaded = s3.get_object(Bucket="ultracluster-artifacts", Key=CONFIG_KEY)["Body"].read().decode()
    assert seen.read_text() == uploaded
    assert yaml.safe_load(uploaded)["HeadNode"]["Networking"]["SubnetId"] == NETWORK["public_subnet_id"]


def test_refused_config_fails_without_retry_and_uploads_no_config(s3, fake, capfd):
    fake.respond("create-cluster", ("validation_min_gt_max.json", 1))
    with pytest.raises(AirflowFailException, match="refused the cluster config") as err:
        render_op().execute(make_context())
    assert "Max count must be greater than or equal to min count" in str(err.value)
    # every validator message is in the log, one line each
    assert "pcluster dry run: ERROR ComputeResourceSizeValidator" in task_log(capfd)
    assert CONFIG_KEY not in keys(s3)


@pytest.mark.parametrize("name", ["error_subnet_not_found.json", "error_cluster_name_pattern.json"])
def test_plain_refusals_fail_without_retry(s3, fake, name):
    fake.respond("create-cluster", (name, 1))
    with pytest.raises(AirflowFailException):
        render_op().execute(make_context())
    assert CONFIG_KEY not in keys(s3)


def test_throttling_raises_for_a_retry(s3, fake):
    fake.respond_text("create-cluster", json.dumps({"message": "Limit exceeded: Rate exceeded"}), rc=1)
    with pytest.raises(PclusterError, match="Limit exceeded") as err:
        render_op().execute(make_context())
    assert not isinstance(err.value, AirflowFailException)
    assert CONFIG_KEY not in keys(s3)


def test_existing_cluster_skips_the_dryrun(s3, fake, capfd):
    """A cleared render_config after pcluster_create: pcluster refuses any create of the name."""
    fake.respond("create-cluster", ("error_cluster_already_exists.json", 1))
    render_op().execute(make_context())
    assert "the dry run is skipped" in task_log(capfd)
    assert CONFIG_KEY in keys(s3)


def test_no_connection_no_dryrun(s3, fake):
    render_op(pcluster_conn_id=None).execute(make_context())
    assert fake.calls() == [] and CONFIG_KEY in keys(s3)
