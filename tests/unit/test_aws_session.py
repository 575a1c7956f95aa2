"""hooks.aws_session: the amazon provider's ``[aws] session_factory`` whose sessions share one botocore
data loader, so a hook's client parses no service model another session of the process parsed.
Each case runs in a fresh interpreter: the provider resolves the factory once, when base_aws is imported."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FACTORY = "ultracluster.hooks.aws_session.SharedModelsSessionFactory"

_HOOKS = r"""
import json, os, sys
import botocore.loaders
if sys.argv[1] == "factory-first":
    import ultracluster.hooks.aws_session
from airflow.providers.amazon.aws.hooks import base_aws
from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
from ultracluster.hooks import aws_session
if sys.argv[2] == "warm":
    aws_session.warm_up()
reads = []
real = botocore.loaders.JSONFileLoader.load_file
botocore.loaders.JSONFileLoader.load_file = lambda self, path: (reads.append(path), real(self, path))[1]
clients = [AwsBaseHook(aws_conn_id=conn, client_type=service).get_conn()
           for conn, service in (("aws_default", "s3"), ("aws_default", "ec2"), ("aws_other", "s3"), ("aws_other", "ec2"))]
print(json.dumps({
    "factory": base_aws.SessionFactory.__module__ + "." + base_aws.SessionFactory.__qualname__,
    "reads": reads,
    "regions": [c.meta.region_name for c in clients],
    "keys": [c._request_signer._credentials.access_key for c in clients],
    "search_paths": aws_session._loader.search_paths,
}))
"""


def run_hooks(order: str, warm: str) -> dict:
    conn = {"conn_type": "aws", "login": "AKIADEFAULT", "password": "secret-default", "extra": {"region_name": "us-east-1"}}
    other = {"conn_type": "aws", "login": "AKIAOTHER", "password": "secret-other", "extra": {"region_name": "eu-west-1"}}
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugins"), "AIRFLOW__AWS__SESSION_FACTORY": FACTORY,
           "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn), "AIRFLOW_CONN_AWS_OTHER": json.dumps(other)}
    done = subprocess.run([sys.executable, "-c", _HOOKS, order, warm], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("order", ["provider-first", "factory-first"])
def test_the_provider_resolves_the_factory_whichever_module_is_imported_first(order):
    seen = run_hooks(order, "cold")
    assert seen["factory"] == FACTORY
    # Each model is read once for the process, not once per session.
    assert sorted(seen["reads"]) == sorted(set(seen["reads"])), seen["reads"]
    assert any(path.endswith("/s3/2006-03-01/service-2") for path in seen["reads"])
    # Credentials and regions stay each connection's own.
    assert seen["regions"] == ["us-east-1", "us-east-1", "eu-west-1", "eu-west-1"]
    assert seen["keys"] == ["AKIADEFAULT", "AKIADEFAULT", "AKIAOTHER", "AKIAOTHER"]
    # boto3 adds its data path to each new session's loader: the shared one keeps it once.
    assert len(seen["search_paths"]) == len(set(seen["search_paths"]))


def test_after_the_warm_up_a_hooks_client_reads_no_model():
    assert run_hooks("provider-first", "warm")["reads"] == []
