"""IAM enforcement for the least-privilege tests (docs/operations.md, "Least privilege"), registered in
tests/conftest.py:

    enforced_moto   session: tests/fixtures/moto_enforced.py's server, moto with INITIAL_NO_AUTH_ACTION_COUNT=0
                    (every request signed by a known principal and judged by its policies); yields its endpoint
    make_user(endpoint, name, policy) -> Principal   an IAM user with that inline policy and an access key
    Principal.put_policy(policy)                    replace the user's policy (a run missing one action)
    make_role(endpoint, name, policy, trusted_arn, managed=()) -> arn   an IAM role with that inline policy
                    (and managed ones), assumable by ``trusted_arn`` only
    running_enforced_moto(principal_log)            a server of one's own, logging each request's signer

The local cluster's own principal signs with the fixed keys ``testing`` (moto_enforced.LOCAL_KEYS): the
stand-in, the harness and the tests' own checks may do everything.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_localcluster import LOCALCLUSTER_PYTHON, REGION, running_moto

MOTO_ENFORCED_SERVER = Path(__file__).resolve().parent / "fixtures" / "moto_enforced.py"
POLICY_NAME = "least-privilege"


def client(endpoint: str, service: str, key: str = "testing", secret: str = "testing") -> Any:
    import boto3

    return boto3.client(service, region_name=REGION, endpoint_url=endpoint, aws_access_key_id=key,
                        aws_secret_access_key=secret)


@dataclass(frozen=True)
class Principal:
    endpoint: str
    name: str
    key: str
    secret: str
    arn: str

    def client(self, service: str) -> Any:
        return client(self.endpoint, service, self.key, self.secret)

    def put_policy(self, policy: Mapping[str, Any]) -> None:
        client(self.endpoint, "iam").put_user_policy(UserName=self.name, PolicyName=POLICY_NAME,
                                                     PolicyDocument=json.dumps(policy))


def make_user(endpoint: str, name: str, policy: Mapping[str, Any]) -> Principal:
    """An IAM user holding exactly ``policy`` (inline), made by the local cluster's principal."""
    iam = client(endpoint, "iam")
    arn = iam.create_user(UserName=name)["User"]["Arn"]
    key = iam.create_access_key(UserName=name)["AccessKey"]
    principal = Principal(endpoint, name, key["AccessKeyId"], key["SecretAccessKey"], arn)
    principal.put_policy(policy)
    return principal


def make_role(endpoint: str, name: str, policy: Mapping[str, Any], trusted_arn: str,
              managed: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """An IAM role holding exactly ``policy`` (inline) and the ``managed`` policies (name -> document)."""
    iam = client(endpoint, "iam")
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": trusted_arn}, "Action": "sts:AssumeRole"}]}
    arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    put_role_policy(endpoint, name, policy)
    for policy_name, document in (managed or {}).items():
        policy_arn = iam.create_policy(PolicyName=policy_name, PolicyDocument=json.dumps(document))["Policy"]["Arn"]
        iam.attach_role_policy(RoleName=name, PolicyArn=policy_arn)
    return arn


def put_role_policy(endpoint: str, name: str, policy: Mapping[str, Any]) -> None:
    client(endpoint, "iam").put_role_policy(RoleName=name, PolicyName=POLICY_NAME, PolicyDocument=json.dumps(policy))


@contextmanager
def running_enforced_moto(principal_log: Path) -> Iterator[str]:
    """An enforcing server of one's own that appends each request's signer to ``principal_log``."""
    if not LOCALCLUSTER_PYTHON.exists():
        pytest.skip(f"{LOCALCLUSTER_PYTHON} missing: run `make setup`")
    with running_moto([str(MOTO_ENFORCED_SERVER), "--principal-log", str(principal_log)]) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def enforced_moto() -> Iterator[str]:
    if not LOCALCLUSTER_PYTHON.exists():
        pytest.skip(f"{LOCALCLUSTER_PYTHON} missing: run `make setup`")
    with running_moto([str(MOTO_ENFORCED_SERVER)]) as endpoint:
        yield endpoint
