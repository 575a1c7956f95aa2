"""IAM enforcement for the least-privilege tests (docs/operations.md, "Least privilege"), registered in
tests/conftest.py:

    enforced_moto   session: tests/fixtures/moto_enforced.py's server, moto with INITIAL_NO_AUTH_ACTION_COUNT=0
                    (every request signed by a known principal and judged by its policies); yields its endpoint
    make_user(endpoint, name, policy) -> Principal   an IAM user with that inline policy and an access key
    Principal.put_policy(policy)                    replace the user's policy (a run missing one action)

The local cluster's own principal signs with the fixed keys ``testing`` (moto_enforced.LOCAL_KEYS): the
stand-in, the harness and the tests' own checks may do everything.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
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


@pytest.fixture(scope="session")
def enforced_moto() -> Iterator[str]:
    if not LOCALCLUSTER_PYTHON.exists():
        pytest.skip(f"{LOCALCLUSTER_PYTHON} missing: run `make setup`")
    with running_moto([str(MOTO_ENFORCED_SERVER)]) as endpoint:
        yield endpoint
