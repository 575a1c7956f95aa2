"""Registers ultracluster with Airflow as a provider (entry point ``apache_airflow_provider``): its
hooks, triggers, extra links and the ``pcluster`` connection type with its form fields."""
from __future__ import annotations

from ultracluster import __version__

_PCLUSTER = "AWS ParallelCluster"
_SLURM = "Slurm on a cluster head node"


def get_provider_info() -> dict:
    return {
        "package-name": "ultracluster",
        "name": "UltraCluster",
        "description": "Train models on AWS Trn1 UltraClusters: ParallelCluster, Slurm and the training job.",
        "versions": [__version__],
        "integrations": [
            {"integration-name": _PCLUSTER, "external-doc-url": "https://docs.aws.amazon.com/parallelcluster/",
             "tags": ["aws"]},
            {"integration-name": _SLURM, "external-doc-url": "https://slurm.schedmd.com/", "tags": ["software"]},
        ],
        "operators": [
            {"integration-name": _PCLUSTER, "python-modules": [
                "ultracluster.operators.vpc", "ultracluster.operators.cluster_config", "ultracluster.operators.pcluster",
                "ultracluster.operators.node_image", "ultracluster.operators.node_image_records"]},
            {"integration-name": _SLURM, "python-modules": [
                "ultracluster.operators.dataset", "ultracluster.operators.slurm", "ultracluster.operators.results",
                "ultracluster.operators.checkpoint", "ultracluster.operators.failure_artifacts"]},
        ],
        "sensors": [{"integration-name": _PCLUSTER, "python-modules": ["ultracluster.sensors.fleet"]}],
        "hooks": [
            {"integration-name": _PCLUSTER, "python-modules": [
                "ultracluster.hooks.parallelcluster", "ultracluster.hooks.network_stack",
                "ultracluster.hooks.node_image"]},
            {"integration-name": _SLURM, "python-modules": [
                "ultracluster.hooks.head_node", "ultracluster.hooks.slurm"]},
        ],
        "triggers": [
            {"integration-name": _PCLUSTER, "python-modules": [
                "ultracluster.triggers.pcluster", "ultracluster.triggers.cloud_formation",
                "ultracluster.triggers.fleet", "ultracluster.triggers.image", "ultracluster.triggers.sweep_network"]},
            {"integration-name": _SLURM, "python-modules": ["ultracluster.triggers.slurm"]},
        ],
        "extra-links": [
            "ultracluster.links.CloudFormationStackLink",
            "ultracluster.links.ClusterConfigLink",
            "ultracluster.links.S3ResultsLink",
            "ultracluster.links.ParallelClusterStackLink",
            "ultracluster.links.SlurmJobLink",
            "ultracluster.links.SweepReportLink",
        ],
        "connection-types": [
            {
                "connection-type": "pcluster",
                "hook-class-name": "ultracluster.hooks.parallelcluster.ParallelClusterHook",
                "hook-name": "AWS ParallelCluster CLI",
                "conn-fields": {
                    "binary": {
                        "label": "pcluster binary",
                        "description": "Path of the pcluster CLI (it needs a venv of its own); default: pcluster on PATH.",
                        "schema": {"type": ["string", "null"]},
                    },
                    "region": {
                        "label": "Region",
                        "description": "Default AWS region; the DAG's region param overrides it.",
                        "schema": {"type": ["string", "null"]},
                    },
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "schema", "login", "password", "port"],
                    "relabeling": {},
                    "placeholders": {"extra": '{"env": {"AWS_PROFILE": "trn1"}}'},
                },
            },
        ],
    }
