"""trn1_bert_pretrain: imports cleanly and lightly, exact tasks and wiring, params schema, early failures."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
DAG_FILE = DAGS / "trn1_bert_pretrain.py"
DAG_ID = "trn1_bert_pretrain"

TASK_IDS = ["preflight", "create_vpc", "render_config", "pcluster_create", "wait_for_fleet", "download_data",
            "restore_compile_cache", "restore_checkpoint", "parallel_compile", "train", "save_compile_cache", "collect_results",
            "save_failure_artifacts", "delete_cluster", "delete_vpc"]
UPSTREAM = {
    "preflight": set(),
    "create_vpc": {"preflight"},
    "render_config": {"create_vpc"},
    "pcluster_create": {"render_config"},
    "wait_for_fleet": {"pcluster_create"},
    "download_data": {"wait_for_fleet"},
    "restore_compile_cache": {"wait_for_fleet"},
    "parallel_compile": {"download_data", "restore_compile_cache", "wait_for_fleet"},
    "restore_checkpoint": {"wait_for_fleet"},
    "train": {"parallel_compile", "restore_checkpoint", "wait_for_fleet"},
    "save_compile_cache": {"train", "wait_for_fleet"},
    "collect_results": {"train", "wait_for_fleet"},
    "save_failure_artifacts": {"collect_results", "save_compile_cache", "pcluster_create"},
    "delete_cluster": {"save_failure_artifacts", "pcluster_create"},
    "delete_vpc": {"delete_cluster", "create_vpc"},
}
# The heavy libraries a parse must never load (docs/architecture.md, "Imports").
LAZY = ("paramiko", "asyncssh", "matplotlib", "torch", "transformers", "slack_sdk")


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


@pytest.fixture(scope="module")
def dag(dagbag):
    assert dagbag.import_errors == {}
    return dagbag.dags[DAG_ID]


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert DAG_ID in dagbag.dag_ids


def test_exact_tasks_and_dependencies(dag):
    assert sorted(dag.task_ids) == sorted(TASK_IDS)
    assert {task_id: set(dag.get_task(task_id).upstream_task_ids) for task_id in TASK_IDS} == UPSTREAM


def test_dag_serializes_for_the_scheduler(dag):
    """The scheduler and dag.test() serialize the DAG; e.g. templating a BaseOperator field fails here."""
    from airflow.serialization.serialized_objects import DagSerialization

    restored = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    assert sorted(restored.task_ids) == sorted(TASK_IDS)
    assert restored.get_task("delete_vpc").is_teardown


def test_teardowns_are_wired_to_their_setups(dag):
    from airflow.sdk import TriggerRule

    create_vpc, pcluster_create = dag.get_task("create_vpc"), dag.get_task("pcluster_create")
    delete_cluster, delete_vpc = dag.get_task("delete_cluster"), dag.get_task("delete_vpc")
    save_failure = dag.get_task("save_failure_artifacts")
    assert create_vpc.is_setup and pcluster_create.is_setup
    assert delete_cluster.is_teardown and delete_vpc.is_teardown
    # A teardown of the cluster, before delete_cluster: it runs whatever failed (and after "mark
    # failed"), and its own failure neither skips delete_cluster nor decides the run's state.
    assert save_failure.is_teardown and not save_failure.on_failure_fail_dagrun
    assert save_failure.trigger_rule == TriggerRule.ALL_DONE_SETUP_SUCCESS
    assert {"pcluster_create", "collect_results", "save_compile_cache"} <= save_failure.upstream_task_ids
    assert "save_failure_artifacts" in delete_cluster.upstream_task_ids
    assert not any(dag.get_task(t).is_setup or dag.get_task(t).is_teardown
                   for t in TASK_IDS if t not in ("create_vpc", "pcluster_create", "save_failure_artifacts",
                                                  "delete_cluster", "delete_vpc"))
    assert "pcluster_create" in delete_cluster.upstream_task_ids
    assert {"create_vpc", "delete_cluster"} <= delete_vpc.upstream_task_ids  # cluster goes before its network
    assert delete_cluster.trigger_rule == delete_vpc.trigger_rule == TriggerRule.ALL_DONE_SETUP_SUCCESS
    assert delete_vpc.on_failure_fail_dagrun and not delete_cluster.on_failure_fail_dagrun


def test_run_state_follows_the_work_and_the_network_teardown(dag):
    """Airflow judges a run by its effective leaves: a failed train must fail the run even though the
    teardowns succeed afterwards (on_failure_fail_dagrun on delete_cluster would hide it)."""
    from airflow.models.dagrun import DagRun

    class TaskInstanceStub:  # hashable: the method builds a set
        def __init__(self, task_id):
            self.task_id, self.state = task_id, None

    tis = [TaskInstanceStub(task_id) for task_id in TASK_IDS]
    leaves = DagRun._tis_for_dagrun_state(None, dag=dag, tis=tis)
    # A cache that could not be saved fails the run too: the user asked for it to be kept.
    assert {ti.task_id for ti in leaves} == {"collect_results", "save_compile_cache", "delete_vpc"}


def test_schedule_and_run_limits(dag):
    assert dag.catchup is False and dag.max_active_runs == 2
    # Backfills need a periodic schedule.
    assert dag.schedule == "@weekly" and dag.timetable.can_be_scheduled
    assert dag.render_template_as_native_obj is True


def test_unpausing_does_not_start_a_run_at_once(dag):
    """The first scheduled run is a future tick; backfills still find past weeks."""
    from datetime import datetime, timezone

    from airflow.models.backfill import _get_info_list
    from airflow.serialization.serialized_objects import DagSerialization

    scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    first = scheduler_dag.next_dagrun_info(last_automated_run_info=None)
    assert first.run_after > datetime.now(timezone.utc)
    weeks = _get_info_list(from_date=datetime(2026, 10, 1, tzinfo=timezone.utc),
                           to_date=datetime(2026, 11, 1, tzinfo=timezone.utc), reverse=False, dag=scheduler_dag)
    assert len(weeks) == 5


def test_every_param_explains_itself(dag):
    required = {"num_nodes", "instance_type", "max_nodes", "min_nodes", "scaling_mode", "max_steps",
                "steps_this_run", "batch_size", "grad_accum_usteps", "region", "availability_zone_id",
                "existing_vpc_id", "existing_public_subnet_id", "existing_private_subnet_id", "dataset_s3_uri",
                "artifacts_s3_uri", "compile_cache_s3_uri", "cluster_name", "extra_tags", "model_size",
                "training_python", "head_node_instance_type", "shared_storage_mount_dir", "extra_queues"}
    assert required <= set(dag.params)
    for name in dag.params:
        param = dag.params.get_param(name)
        assert param.description and len(param.description) > 15, name
        assert param.schema.get("type"), name
    assert dag.params.get_param("instance_type").schema["enum"] == ["trn1.32xlarge", "trn1n.32xlarge", "trn1.2xlarge"]


def test_defaults_validate(dag):
    values = dag.params.validate()
    assert values["num_nodes"] <= values["max_nodes"]


def merged(dag, conf: dict):
    """What Airflow does with a trigger's conf: copy the DAG params, update with the conf (validates)."""
    params = copy.deepcopy(dag.params)
    params.update(conf)
    return params.validate()


@pytest.mark.parametrize("conf", [
    {"instance_type": "p4d.24xlarge"},
    {"num_nodes": 0},
    {"num_nodes": "16"},
    {"scaling_mode": "medium"},
    {"model_size": "huge"},
    {"dataset_s3_uri": "https://example.com/data.tar"},
    {"availability_zone_id": "us-east-1a"},
    {"cluster_name": "1-bad"},
    {"existing_private_subnet_id": "sg-123"},
    {"fsx_storage_capacity_gib": 1000},
    {"extra_queues": [{"name": "Small", "instance_type": "trn1.2xlarge", "max_nodes": 1}]},
    {"extra_queues": [{"name": "small", "instance_type": "c5.xlarge", "max_nodes": 1}]},
    {"extra_tags": {"k": 1}},
])
def test_invalid_confs_are_rejected_by_the_schema(dag, conf):
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError):
        merged(dag, conf)


def test_a_valid_sweep_conf_is_accepted(dag):
    values = merged(dag, {"num_nodes": 8, "scaling_mode": "weak", "cluster_name": "sweep-8",
                          "extra_queues": [{"name": "small", "instance_type": "trn1.2xlarge", "max_nodes": 2}]})
    assert values["num_nodes"] == 8


def test_cross_field_errors_fail_in_preflight_without_retries(dag):
    """The schema cannot compare fields: num_nodes > max_nodes passes it, then preflight, the first
    task, stops the run with AirflowFailException (no retries) before anything exists."""
    from airflow.sdk.exceptions import AirflowFailException

    values = merged(dag, {"num_nodes": 32, "max_nodes": 16})  # schema-valid
    task = dag.get_task("preflight")
    assert dag.get_task("create_vpc").upstream_task_ids == {"preflight"}
    context = {"params": values, "run_id": "manual__x", "dag": SimpleNamespace(dag_id=DAG_ID), "logical_date": None}
    with pytest.raises(AirflowFailException, match=r"num_nodes \(32\) exceeds max_nodes \(16\)"):
        task.execute(context)


def test_every_task_fails_at_once_when_aws_denies_a_call(dag):
    """The DAG's retry policy reaches every task, also through the scheduler's serialized copy."""
    from airflow.sdk.definitions.retry_policy import RetryAction
    from airflow.serialization.serialized_objects import DagSerialization
    from botocore.exceptions import ClientError

    from ultracluster.operators.retry_policy import DeniedCallsFail

    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "not authorized to perform: "
                                    "cloudformation:CreateStack"}}, "CreateStack")
    for task in dag.tasks:
        assert isinstance(task.retry_policy, DeniedCallsFail), task.task_id
        assert task.retry_policy.evaluate(denied, 1, task.retries + 1).action == RetryAction.FAIL
    restored = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    assert all(task.has_retry_policy for task in restored.tasks)


def test_run_derived_templates_render(dag):
    env = dag.get_template_env(force_sandboxed=False)
    run_id = "manual__2026-11-30T08:00:00+00:00"
    create_vpc = dag.get_task("create_vpc")
    stack_name = env.from_string(create_vpc.stack_name).render(run_id=run_id)
    assert stack_name.startswith("uc-vpc-manual-2026-11-30t08-00-00-00-00-")
    job_dir = env.from_string(dag.get_task("train").job_dir).render(
        run_id=run_id, params={"shared_storage_mount_dir": "/fsx"}, dag=dag)
    assert job_dir.startswith("/fsx/ultracluster/trn1_bert_pretrain/manual-2026-11-30t08-00-00-00-00-")


def run_python(code: str, profile: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ULTRACLUSTER_")}
    if profile:
        env["ULTRACLUSTER_PROFILE"] = profile
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                               cwd=str(REPO), timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout.strip().splitlines()[-1]


BARE_DAG = (
    "from airflow.sdk import DAG\n"
    "from airflow.providers.standard.operators.empty import EmptyOperator\n"
    "with DAG('bare', schedule=None):\n"
    "    EmptyOperator(task_id='a') >> EmptyOperator(task_id='b')\n"
)
def modules_after_loading(dag_file: Path) -> set[str]:
    """Modules a parse of ``dag_file`` adds in a fresh interpreter, after the DAG processor's
    pre-import of the file's ``airflow.*`` imports (parsing_pre_import_modules, on by default)."""
    code = (
        "import sys, importlib, importlib.util, json\n"
        "from airflow.utils.file import iter_airflow_imports\n"
        f"for name in iter_airflow_imports({str(dag_file)!r}): importlib.import_module(name)\n"
        "before = set(sys.modules)\n"
        f"spec = importlib.util.spec_from_file_location('dag_under_test', {str(dag_file)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    return set(json.loads(run_python(code)))


def modules_of_a_parse_without_pre_imports(dag_file: Path) -> set[str]:
    """Modules a parse loads in a fresh interpreter that imported airflow.sdk only."""
    code = (
        "import sys, importlib.util, json\n"
        "import airflow.sdk\n"
        f"spec = importlib.util.spec_from_file_location('dag_under_test', {str(dag_file)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    return set(json.loads(run_python(code)))


def test_the_parse_loads_no_heavy_library():
    loaded = modules_after_loading(DAG_FILE)
    assert "ultracluster.operators.slurm" in loaded  # measured after the pre-import, not before it
    assert sorted(m for m in loaded if m.split(".")[0] in LAZY) == []


def test_each_pre_imported_airflow_module_is_one_the_parse_loads():
    """The DAG file's pre-import list holds only modules its parse needs (bench/dag_parse.py measures
    which are worth it), and boto3 reaches the parse only through them."""
    from airflow.utils.file import iter_airflow_imports

    listed = set(iter_airflow_imports(str(DAG_FILE))) - {"airflow.sdk"}
    assert "airflow.providers.amazon.aws.operators.base_aws" in listed
    assert sorted(listed - modules_of_a_parse_without_pre_imports(DAG_FILE)) == []
    assert sorted(m for m in modules_after_loading(DAG_FILE) if m.split(".")[0] in ("boto3", "botocore")) == []


def test_delete_vpc_checks_the_cluster_delete_cluster_deletes(dag):
    delete_vpc, delete_cluster = dag.get_task("delete_vpc"), dag.get_task("delete_cluster")
    assert "cluster_name" in delete_vpc.template_fields
    assert delete_vpc.pcluster_conn_id == delete_cluster.pcluster_conn_id
    env = dag.get_template_env(force_sandboxed=False)

    class TI:
        def __init__(self, xcoms):
            self.xcoms = xcoms

        def xcom_pull(self, task_ids):
            return self.xcoms.get(task_ids)

    own = {"plan": {"existing_cluster_name": None}}
    ti = TI({"preflight": own, "render_config": {"cluster_name": "trn1-bert-abc"}})
    assert env.from_string(delete_vpc.cluster_name).render(ti=ti) == "trn1-bert-abc"
    assert env.from_string(delete_cluster.cluster_name).render(ti=ti) == "trn1-bert-abc"
    # render_config never ran (delete_vpc still runs: create_vpc succeeded): no cluster to check.
    assert env.from_string(delete_vpc.cluster_name).render(ti=TI({"preflight": own})) is None
    # On an existing cluster every task names that cluster (render_config skipped), and the
    # teardowns are told it is not the run's: they skip.
    byo = TI({"preflight": {"plan": {"existing_cluster_name": "team-cluster"}}})
    for task in ("wait_for_fleet", "delete_cluster"):
        assert env.from_string(dag.get_task(task).cluster_name).render(ti=byo) == "team-cluster"
    for task in ("create_vpc", "render_config", "pcluster_create", "delete_cluster", "delete_vpc"):
        assert env.from_string(dag.get_task(task).existing_cluster_name).render(ti=byo) == "team-cluster", task


def test_render_config_dry_runs_with_pcluster_creates_settings(dag):
    """The dry run uses the CLI, region and validator suppressions that pcluster_create creates with."""
    render_config, pcluster_create = dag.get_task("render_config"), dag.get_task("pcluster_create")
    assert render_config.pcluster_conn_id == pcluster_create.pcluster_conn_id == "pcluster_default"
    assert render_config.region_name == pcluster_create.region_name
    assert render_config.suppress_validators == pcluster_create.suppress_validators


def test_capacity_and_ssh_reach_render_config_and_preflight(dag):
    """The capacity params and the head node's SSH CIDR are rendered from the params; a reservation must
    start before the fleet wait would give up (the profile's fleet_timeout_s)."""
    from ultracluster.run.profiles import load_profile

    render = dag.get_task("render_config")
    for name in ("capacity_type", "capacity_reservation_id", "capacity_reservation_resource_group_arn",
                 "allow_world_ssh"):
        assert getattr(render, name) == "{{ params.%s }}" % name, name
        assert name in render.template_fields
    # The run's CIDR, else the deployment's: preflight puts the one to render into the plan.
    assert render.ssh_allowed_cidr == "{{ plan(ti).ssh_allowed_cidr }}" and "ssh_allowed_cidr" in render.template_fields
    profile, preflight = load_profile(), dag.get_task("preflight")
    assert preflight.reservation_lead_s == profile["fleet_timeout_s"]
    assert preflight.default_ssh_allowed_cidr == (profile["head_node_ssh_cidr"] or None)


# The deployment's IAM settings, as the production profile reads them from the environment.
IAM_ENV = {"ULTRACLUSTER_PERMISSIONS_BOUNDARY_ARN": "arn:aws:iam::123456789012:policy/b",
           "ULTRACLUSTER_NODE_KMS_POLICY_ARN": "arn:aws:iam::123456789012:policy/k"}


@pytest.mark.parametrize("profile", ["production", "local"])
def test_each_profile_parses_and_its_defaults_validate(profile):
    """... and its IAM settings reach preflight and render_config: the boundary of pcluster's roles is
    required unless a profile opts out (the local one: its pcluster creates no roles), and the nodes'
    KMS policy goes to both (docs/operations.md, "Least privilege")."""
    code = (
        "import os\n"
        f"os.environ.update({IAM_ENV!r})\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "assert bag.import_errors == {}, bag.import_errors\n"
        f"dag = bag.dags[{DAG_ID!r}]\n"
        "values = dag.params.validate()\n"
        "from ultracluster.run.plan import validate_plan\n"
        "validate_plan(values)\n"
        "preflight, render = dag.get_task('preflight'), dag.get_task('render_config')\n"
        "print(values['num_nodes'], values['model_size'], preflight.require_permissions_boundary,\n"
        "      preflight.permissions_boundary_arn, render.permissions_boundary_arn,\n"
        "      preflight.node_kms_policy_arn, render.node_kms_policy_arn)\n"
    )
    boundary, kms = IAM_ENV["ULTRACLUSTER_PERMISSIONS_BOUNDARY_ARN"], IAM_ENV["ULTRACLUSTER_NODE_KMS_POLICY_ARN"]
    expected = {"production": ["16", "large", "True", boundary, boundary, kms, kms],
                "local": ["2", "tiny", "False", "None", "None", "None", "None"]}[profile]  # local reads no env
    assert run_python(code, profile).split() == expected

