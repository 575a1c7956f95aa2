"""The environment a connection gives a child AWS CLI (``pcluster``), and so whose credentials it signs with.

botocore takes access keys from the environment before any profile: a profile the connection names
(``AWS_PROFILE``: the pcluster role, assumed from Airflow's identity) would lose to the keys the
worker inherited, Airflow's own, and the CLI would run as Airflow without a word. So with a profile
the inherited keys go; a connection that names a profile and keys at once is refused.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# botocore's EnvProvider reads exactly these.
ENV_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                   "AWS_CREDENTIAL_EXPIRATION")
PROFILE_VARIABLES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE")


class CredentialsConflictError(ValueError):
    """The connection names a profile and access keys: one of them would be ignored."""


def child_env(inherited: Mapping[str, str], configured: Mapping[str, Any]) -> dict[str, str]:
    """``inherited`` (the worker's environment) with ``configured`` (the connection's ``env``) on top;
    without the inherited access keys when ``configured`` names a profile."""
    configured = {str(k): str(v) for k, v in configured.items()}
    env = dict(inherited)
    if any(configured.get(name) for name in PROFILE_VARIABLES):
        keys = [name for name in ENV_CREDENTIALS if name in configured]
        if keys:
            raise CredentialsConflictError(
                f"env names a profile and sets {', '.join(keys)}: botocore would sign with the keys and never "
                "use the profile; give one of them")
        for name in ENV_CREDENTIALS:
            env.pop(name, None)
    env.update(configured)
    return env
