"""Operator extra links (registered by the provider: tests/unit/test_provider.py)."""
from __future__ import annotations

from ultracluster.links import (
    CloudFormationStackLink,
    ClusterConfigLink,
    ParallelClusterStackLink,
    S3ResultsLink,
    SlurmJobLink,
    SweepReportLink,
)

LINKS = (CloudFormationStackLink, ClusterConfigLink, S3ResultsLink, ParallelClusterStackLink, SlurmJobLink,
         SweepReportLink)


def test_stack_link_escapes_the_arn():
    url = ParallelClusterStackLink().format_link(
        region_name="us-east-1", stack_name="arn:aws:cloudformation:us-east-1:1:stack/uc-x/abc")
    assert url == ("https://console.aws.amazon.com/cloudformation/home?region=us-east-1#/stacks/stackinfo?"
                   "stackId=arn%3Aaws%3Acloudformation%3Aus-east-1%3A1%3Astack/uc-x/abc")


def test_s3_links():
    assert ClusterConfigLink().format_link(region_name="us-east-1", bucket="b", key="runs/x/cluster-config.yaml") == (
        "https://s3.console.aws.amazon.com/s3/object/b?region=us-east-1&prefix=runs/x/cluster-config.yaml")
    assert S3ResultsLink().format_link(region_name="us-east-1", bucket="b", prefix="runs/x") == (
        "https://s3.console.aws.amazon.com/s3/buckets/b?region=us-east-1&prefix=runs/x/")


def test_missing_values_give_no_link():
    assert CloudFormationStackLink().format_link(region_name="us-east-1") == ""


def test_persist_pushes_under_the_links_key():
    pushed = {}

    class TaskInstance:
        def xcom_push(self, key, value):
            pushed[key] = value

    CloudFormationStackLink.persist(context={"ti": TaskInstance()}, region_name="us-east-1", stack_name="s")
    assert pushed == {"ultracluster_cloudformation_stack": {"region_name": "us-east-1", "stack_name": "s"}}


def test_links_have_distinct_names_and_keys():
    assert len({link.name for link in LINKS}) == len({link.key for link in LINKS}) == len(LINKS)
    assert len({link().xcom_key for link in LINKS}) == len(LINKS)  # Airflow's own key for the formatted URL


def test_the_provider_registers_every_link():
    from ultracluster.get_provider_info import get_provider_info

    assert set(get_provider_info()["extra-links"]) == {f"{link.__module__}.{link.__qualname__}" for link in LINKS}


RUN_ID = "manual__2026-12-01T06:59:43.056935+00:00"
JOB = {"dag_id": "trn1_bert_pretrain", "run_id": RUN_ID, "task_id": "train", "job_id": "7",
       "log_path": "/fsx/ultracluster/trn1_bert_pretrain/run/slurm-7.out", "cluster_name": "uc-x"}


def test_the_slurm_job_link_is_the_plugins_page_under_airflows_base_url(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/team-a/")
    assert SlurmJobLink().format_link(**JOB) == (
        "https://airflow.example.com/team-a/ultracluster/jobs/trn1_bert_pretrain/"
        "manual__2026-12-01T06%3A59%3A43.056935%2B00%3A00/train")


def test_without_a_base_url_the_plugin_links_are_root_relative(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "")
    assert SlurmJobLink().format_link(**JOB) == (
        "/ultracluster/jobs/trn1_bert_pretrain/manual__2026-12-01T06%3A59%3A43.056935%2B00%3A00/train")
    assert SweepReportLink().format_link(dag_id="trn1_bert_pretrain", sweep_id="s1") == (
        "/ultracluster/reports/trn1_bert_pretrain/s1")


def test_a_plugin_link_without_its_path_values_is_empty():
    assert SlurmJobLink().format_link(**{**JOB, "run_id": None}) == ""
    assert SweepReportLink().format_link(dag_id="trn1_bert_pretrain") == ""


def test_the_plugin_links_are_routes_of_the_plugins_app():
    from ultracluster.links import PLUGIN_PREFIX
    from ultracluster.ui.app import create_app
    from ultracluster.ui.plugin import URL_PREFIX

    routes = {route.path for route in create_app().routes}
    assert PLUGIN_PREFIX == URL_PREFIX
    for link in (SlurmJobLink, SweepReportLink):
        assert link.format_str.removeprefix(PLUGIN_PREFIX) in routes, link
