"""The rendered cluster config against the seed's sample config, key by key, and the keys issue 9
added to it: compute nodes' storage (ComputeSettings), log retention (Monitoring), a pre-built image
(Image.CustomAmi).

The seed's config is tests/fixtures/seed/cluster-config.yaml, written from shared/notes/seed-workflow.md.
Every difference must be one of DELIBERATE and named in docs/operations.md, between the
``seed-differences`` markers; a new difference, one that went away, or one the docs do not name fails.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_config import SCHEMA, make_context, render_op
from ultracluster.operators.cluster_config import (
    RenderClusterConfigOperator,
    render_cluster_config,
    validate_cluster_config,
)
from ultracluster.run.errors import ConfigValidationError
from ultracluster.run.form import LOCAL_STORAGE_MOUNT_DIR, LOG_RETENTION_DAYS
from ultracluster.run.profiles import include_dir, load_profile

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "tests" / "fixtures" / "seed" / "cluster-config.yaml"
DOCS = REPO / "docs" / "operations.md"
TEMPLATE = str(include_dir() / "cluster" / "cluster-config.yaml.j2")
ANY = "<any>"
_MISSING = object()

# path -> how ours differs from the seed (added: only ours has it; missing: only the seed; changed).
DELIBERATE = {
    "Region": "added",                                             # the file names its region itself
    "Image.Os": "changed",                                         # ubuntu2004 -> ubuntu2204 (pcluster >= 3.14)
    "HeadNode.Networking.AdditionalSecurityGroups": "added",       # the network stack's EFA group
    "HeadNode.Ssh.AllowedIps": "added",                            # ssh_allowed_cidr, never the world by default
    "HeadNode.Iam.AdditionalIamPolicies": "added",                 # SSM Session Manager (+ KMS with a customer key)
    "Scheduling.SlurmSettings": "added",                           # ScaledownIdletime 10, pcluster's default
    "Scheduling.SlurmQueues[0].Networking.AdditionalSecurityGroups": "added",
    "Scheduling.SlurmQueues[0].Iam": "added",                      # compute nodes' read of the run's prefix
    "Monitoring": "added",                                         # CloudWatch log retention
    "Tags": "added",                                               # ownership and node-cap tags
}


def differences(seed: Any, ours: Any, path: str = "") -> dict[str, str]:
    """Where ``ours`` differs from ``seed``, at the highest path that differs."""
    if seed == ANY:
        return {}
    if isinstance(seed, str) and (choice := re.fullmatch(r"<one of (.+)>", seed)):
        return {} if ours in choice.group(1).split("|") else {path: "changed"}
    if isinstance(seed, dict) and isinstance(ours, dict):
        found: dict[str, str] = {}
        for key in [*seed, *(k for k in ours if k not in seed)]:
            where = f"{path}.{key}" if path else key
            if key not in ours:
                found[where] = "missing"
            elif key not in seed:
                found[where] = "added"
            else:
                found.update(differences(seed[key], ours[key], where))
        return found
    if isinstance(seed, list) and isinstance(ours, list):
        found = {}
        for index in range(max(len(seed), len(ours))):
            where = f"{path}[{index}]"
            if index >= len(ours):
                found[where] = "missing"
            elif index >= len(seed):
                found[where] = "added"
            else:
                found.update(differences(seed[index], ours[index], where))
        return found
    return {} if seed == ours else {path: "changed"}


@pytest.fixture
def production(monkeypatch) -> dict:
    """The production profile as its fallbacks give it (this machine's ULTRACLUSTER_* do not count)."""
    import os

    for key in [k for k in os.environ if k.startswith("ULTRACLUSTER_")]:
        monkeypatch.delenv(key)
    return load_profile("production")


def operator_for(params: dict, **overrides: Any) -> RenderClusterConfigOperator:
    return render_op(params, **{"custom_ami": params["custom_ami"],
                                "log_retention_days": params["log_retention_days"], **overrides})


def rendered(op: RenderClusterConfigOperator, params: dict) -> dict:
    """What render_config uploads, without S3: the operator's own context through the template."""
    text = render_cluster_config(TEMPLATE, op.build_context(make_context(params), "s3://ultracluster-artifacts/x.sh"))
    return validate_cluster_config(text, SCHEMA)


def docs_section() -> str:
    text = DOCS.read_text()
    match = re.search(r"<!-- seed-differences:start -->(.*)<!-- seed-differences:end -->", text, re.S)
    assert match, "docs/operations.md has no seed-differences section"
    return match.group(1)


# --- the comparison itself ------------------------------------------------------------------------

def test_the_comparison_sees_every_kind_of_difference():
    seed = {"A": {"B": 1, "C": ANY}, "L": [{"N": "x"}], "D": "<one of P|Q>", "Gone": 1}
    assert differences(seed, {"A": {"B": 1, "C": {"deep": 1}}, "L": [{"N": "x"}], "D": "Q"}) == {"Gone": "missing"}
    assert differences(seed, {"A": {"B": 2, "C": 0, "New": 1}, "L": [{"N": "y"}, {}], "D": "R", "Gone": 1}) == {
        "A.B": "changed", "A.New": "added", "L[0].N": "changed", "L[1]": "added", "D": "changed"}
    assert differences(seed, {"A": {"B": 1}, "L": [], "D": "P", "Gone": 1}) == {"A.C": "missing", "L[0]": "missing"}


def test_rendered_production_config_differs_from_the_seed_only_where_deliberate(production):
    seed = yaml.safe_load(SEED.read_text())
    ours = rendered(operator_for(production), production)
    assert differences(seed, ours) == DELIBERATE


def test_the_docs_name_every_deliberate_difference_and_no_other():
    named = set(re.findall(r"^\| `([^`]+)` \|", docs_section(), re.M))
    assert named == set(DELIBERATE)


# --- compute nodes' storage --------------------------------------------------------------------------

def test_every_queue_gets_the_seeds_compute_storage(production):
    params = dict(production, extra_queues=[{"name": "small", "instance_type": "trn1.2xlarge", "max_nodes": 2}])
    config = rendered(operator_for(params), params)
    for queue in config["Scheduling"]["SlurmQueues"]:
        assert queue["ComputeSettings"] == {"LocalStorage": {
            "RootVolume": {"Size": 1024}, "EphemeralVolume": {"MountDir": LOCAL_STORAGE_MOUNT_DIR}}}, queue["Name"]
    assert production["local_scratch_dir"] == LOCAL_STORAGE_MOUNT_DIR  # the jobs' scratch is that mount


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda q: q["ComputeSettings"]["LocalStorage"]["EphemeralVolume"].update(MountDir="/home"), "MountDir"),
    (lambda q: q["ComputeSettings"]["LocalStorage"]["RootVolume"].update(Size=8), "Size"),
    (lambda q: q["ComputeSettings"]["LocalStorage"].update(Bogus=1), "Additional properties"),
])
def test_schema_checks_compute_storage(production, mutate, message):
    config = rendered(operator_for(production), production)
    mutate(config["Scheduling"]["SlurmQueues"][0])
    with pytest.raises(ConfigValidationError, match=message):
        validate_cluster_config(yaml.safe_dump(config), SCHEMA)


# --- log retention ------------------------------------------------------------------------------------

@pytest.mark.parametrize("days", [1, 14, 3653])
def test_log_retention_is_rendered_from_the_param(production, days):
    config = rendered(operator_for(production, log_retention_days=days), production)
    assert config["Monitoring"] == {"Logs": {"CloudWatch": {"Enabled": True, "RetentionInDays": days}}}


@pytest.mark.parametrize("days", [0, 2, 2192, 10000])
def test_retention_parallelcluster_refuses_fails_before_upload(production, days):
    with pytest.raises(ConfigValidationError, match="Monitoring/Logs/CloudWatch/RetentionInDays"):
        rendered(operator_for(production, log_retention_days=days), production)


def test_profiles_default_to_an_allowed_retention():
    for name in ("production", "local"):
        assert load_profile(name)["log_retention_days"] in LOG_RETENTION_DAYS


# --- a pre-built image ----------------------------------------------------------------------------------

@pytest.mark.parametrize("ami", [None, ""])
def test_no_custom_ami_leaves_parallelclusters_image(production, ami):
    config = rendered(operator_for(production, custom_ami=ami), production)
    assert config["Image"] == {"Os": "ubuntu2204"}
    assert ["Image" in q for q in config["Scheduling"]["SlurmQueues"]] == [False]


def test_custom_ami_is_the_training_queues_image(production):
    """The node image is a Trn1 compute image: the head node and extra queues keep ParallelCluster's own."""
    extra = [{"name": "cpu", "instance_type": "c5.xlarge", "max_nodes": 2}]
    config = rendered(operator_for(production, custom_ami="ami-0123456789abcdef0", extra_queues=extra), production)
    assert config["Image"] == {"Os": "ubuntu2204"} and "Image" not in config["HeadNode"]
    training, cpu = config["Scheduling"]["SlurmQueues"]
    assert training["Image"] == {"CustomAmi": "ami-0123456789abcdef0"} and "Image" not in cpu


@pytest.mark.parametrize("ami", ["ami-123", "ami-0123456789ABCDEF0", "ami-0123456789abcdef01", "img-01234567"])
def test_a_malformed_ami_id_fails_validation(production, ami):
    with pytest.raises(ConfigValidationError, match="Scheduling/SlurmQueues/0/Image/CustomAmi"):
        rendered(operator_for(production, custom_ami=ami), production)


def test_new_arguments_are_templated():
    assert {"custom_ami", "log_retention_days"} <= set(RenderClusterConfigOperator.template_fields)


def test_the_dag_wires_the_new_params():
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["trn1_bert_pretrain"]
    render = dag.get_task("render_config")
    # The image preflight checked (the run's custom_ami, else the profile's node_image_parameter).
    assert render.custom_ami == "{{ plan(ti).custom_ami }}"
    assert render.install_neuron_at_boot == "{{ plan(ti).install_neuron_at_boot }}"
    preflight = dag.get_task("preflight")
    assert preflight.node_image_parameter == "/ultracluster/node-image/trn1"
    assert preflight.install_neuron_at_boot is False  # production: the image, or no run
    assert render.log_retention_days == "{{ params.log_retention_days }}"
    for task_id in ("parallel_compile", "train"):
        assert dag.get_task(task_id).job_env["LOCAL_SCRATCH_DIR"] == "{{ params.local_scratch_dir }}"

