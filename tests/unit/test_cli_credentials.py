"""run.cli_credentials: with a profile the connection names, the worker's own access keys never reach the CLI."""
from __future__ import annotations

import pytest

from ultracluster.run.cli_credentials import ENV_CREDENTIALS, CredentialsConflictError, child_env

WORKER = {"PATH": "/usr/bin", "AWS_ACCESS_KEY_ID": "AKIAAIRFLOW", "AWS_SECRET_ACCESS_KEY": "secret",
          "AWS_SESSION_TOKEN": "token", "AWS_SECURITY_TOKEN": "token", "AWS_CREDENTIAL_EXPIRATION": "2030-01-01T00:00:00Z"}


@pytest.mark.parametrize("variable", ["AWS_PROFILE", "AWS_DEFAULT_PROFILE"])
def test_a_profile_drops_the_inherited_keys(variable):
    env = child_env(WORKER, {variable: "ultracluster-pcluster", "AWS_CONFIG_FILE": "/opt/airflow/aws-config"})
    assert not set(ENV_CREDENTIALS) & set(env)
    assert env[variable] == "ultracluster-pcluster" and env["PATH"] == "/usr/bin"


def test_without_a_profile_the_environment_is_the_workers_and_the_connections():
    assert child_env(WORKER, {"AWS_ACCESS_KEY_ID": "AKIALOCAL", "N": 1}) == {**WORKER, "AWS_ACCESS_KEY_ID": "AKIALOCAL",
                                                                            "N": "1"}
    assert child_env(WORKER, {"AWS_PROFILE": ""}) == {**WORKER, "AWS_PROFILE": ""}   # an empty profile names none


def test_a_profile_and_keys_together_are_refused():
    with pytest.raises(CredentialsConflictError, match="AWS_ACCESS_KEY_ID"):
        child_env({}, {"AWS_PROFILE": "p", "AWS_ACCESS_KEY_ID": "AKIA"})
